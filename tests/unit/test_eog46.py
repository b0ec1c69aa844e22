"""The ids that end generation, as llama.cpp's vocab loader finds them (src/llama-vocab.cpp, ``llama_vocab::impl::load``,
``special_eog_ids``): the EOS ids, every token whose text is in its end-of-generation list, the FIM pad, repo and
file-separator tokens, less gpt-oss's ``<|end|>`` and Gemma 4's ``</s>``, which it takes out again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("transformers")

HARMONY = ["<|return|>", "<|end|>", "<|call|>", "<|start|>", "<|channel|>", "<|message|>"]


def _tokenizer(added: list[str], eos: str = "<|im_end|>"):
    """tests/_utils/tiny.py's byte-level tokenizer (<|endoftext|> 0, <|im_start|> 1, <|im_end|> 2) with ``added``
    special tokens after its 320, and ``eos`` as its EOS token."""
    from tests._utils.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer(320)
    tokenizer.add_special_tokens({"additional_special_tokens": added, "eos_token": eos})
    return tokenizer


def _chat_tokenizer(folder: Path, tokenizer, recorded: list[int]):
    """The runtime's tokenizer for a bundle whose manifest recorded ``recorded`` as its eos_token_ids."""
    from edgesdk.runtime.text import ChatTokenizer

    tokenizer.save_pretrained(folder)
    return ChatTokenizer(folder / "tokenizer.json", {"eos_token_ids": recorded}, None)


def _recorded(tokenizer, eos) -> list[int]:
    """What the build records for a tiny model whose config's and generation config's EOS is ``eos``."""
    from edgesdk.build.package import eos_token_ids
    from tests._utils.tiny import tiny_llama

    model = tiny_llama(layers=1, hidden=32, heads=2, kv_heads=1, vocab_size=len(tokenizer))
    model.config.eos_token_id = model.generation_config.eos_token_id = eos
    return eos_token_ids(model, tokenizer)


# ---------------------------------------------------------------------------- DeepSeek-Coder-Instruct: <｜end▁of▁sentence｜>

def test_deepseek_coder_instruct_stops_at_end_of_sentence_as_well_as_at_its_eos(tmp_path):
    """DeepSeek-Coder-Instruct's EOS (config, generation config, tokenizer) is <|EOT|>; its <｜end▁of▁sentence｜> is
    in llama.cpp's end-of-generation list (and is its EOT by text), so llama-cli / llama-server stop at it. A bundle
    that stopped only at <|EOT|> ran on past the end of the answer."""
    tokenizer = _tokenizer(["<|EOT|>", "<｜end▁of▁sentence｜>"], eos="<|EOT|>")
    eot, end_of_sentence = tokenizer.convert_tokens_to_ids(["<|EOT|>", "<｜end▁of▁sentence｜>"])
    recorded = _recorded(tokenizer, eot)
    assert {eot, end_of_sentence} <= set(recorded)
    # a bundle built before: only the EOS and the older list's texts recorded; the runtime finds the rest by text
    old = _chat_tokenizer(tmp_path, tokenizer, [eot, 0, 2])
    assert end_of_sentence in old.eos_token_ids
    assert old.token_bytes()[end_of_sentence] is None  # JSON mode never takes it before the object is complete


def test_the_build_finds_end_of_generation_texts_in_the_whole_vocabulary(tmp_path):
    """llama.cpp matches the texts over the whole vocabulary (``token_to_id``), not only the added tokens: a
    SentencePiece model's </s> held in its base vocabulary ends generation too."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "a": 1, "b": 2, "</s>": 3, "<|eot_id|>": 4}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    assert tokenizer.get_added_vocab().keys() <= {"<unk>"}  # neither is an added token
    assert _recorded(tokenizer, None) == [3, 4]


# ---------------------------------------------------------------------------- gpt-oss (o200k_harmony): <|end|> is no end

def test_gpt_oss_does_not_stop_at_the_end_of_its_analysis_message(tmp_path):
    """gpt-oss writes <|end|> after each message (its analysis before the final answer) and <|return|> / <|call|>
    at the end of the answer; llama.cpp takes <|end|> out of the end-of-generation ids where <|return|> and <|call|>
    are in them ("removing '<|end|>' token from EOG list"). A bundle that stopped at <|end|> answered with its
    analysis alone."""
    tokenizer = _tokenizer(HARMONY, eos="<|return|>")
    returned, end, call = tokenizer.convert_tokens_to_ids(["<|return|>", "<|end|>", "<|call|>"])
    recorded = _recorded(tokenizer, [returned, 0, call])
    assert {returned, call, 0} <= set(recorded)
    assert end not in recorded
    old = _chat_tokenizer(tmp_path, tokenizer, [*recorded, end])  # a bundle built before recorded <|end|>
    assert end not in old.eos_token_ids
    assert {returned, call} <= old.eos_token_ids


def test_phi3_still_stops_at_end(tmp_path):
    """Without <|return|> and <|call|> (Phi-3's vocabulary), <|end|> ends the turn and generation."""
    tokenizer = _tokenizer(["<|end|>", "<|assistant|>"], eos="<|endoftext|>")
    end = tokenizer.convert_tokens_to_ids("<|end|>")
    assert end in _recorded(tokenizer, 0)
    assert end in _chat_tokenizer(tmp_path, tokenizer, [0]).eos_token_ids


def test_solar_open_does_not_stop_at_end(tmp_path):
    """Solar Open's <|calls|> and <|flush|> take <|end|> out as gpt-oss's <|return|> and <|call|> do."""
    tokenizer = _tokenizer(["<|end|>", "<|calls|>", "<|flush|>"], eos="<|flush|>")
    end, calls, flush = tokenizer.convert_tokens_to_ids(["<|end|>", "<|calls|>", "<|flush|>"])
    recorded = _recorded(tokenizer, flush)
    assert {calls, flush} <= set(recorded)
    assert end not in recorded


def test_gemma4_does_not_stop_at_a_closing_s(tmp_path):
    """llama.cpp: "special_eog_ids contains '<|tool_response>', removing '</s>' token from EOG list"."""
    tokenizer = _tokenizer(["<eos>", "<turn|>", "<|tool_response>", "</s>"], eos="<eos>")
    eos, turn, tool_response, closing = tokenizer.convert_tokens_to_ids(["<eos>", "<turn|>", "<|tool_response>", "</s>"])
    recorded = _recorded(tokenizer, eos)
    assert {eos, turn, tool_response} <= set(recorded)
    assert closing not in recorded
    assert closing not in _chat_tokenizer(tmp_path, tokenizer, [eos, closing]).eos_token_ids


def test_a_closing_s_ends_generation_without_tool_response(tmp_path):
    tokenizer = _tokenizer(["</s>"])
    closing = tokenizer.convert_tokens_to_ids("</s>")
    assert closing in _recorded(tokenizer, 2)


# ---------------------------------------------------------------------------- SmolLM2: as llama.cpp finds it in the GGUF

SMOLLM2_GGUF = Path(os.path.expanduser("~/.cache/edgesdk/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"))


@pytest.mark.skipif(not SMOLLM2_GGUF.exists(), reason="the SmolLM2-135M-Instruct GGUF is not cached here")
def test_smollm2_ends_where_llama_cpp_ends_it():
    """SmolLM2-135M-Instruct's GGUF: EOS 2 (<|im_end|>), <|endoftext|> 0 by text, FIM_REP <reponame> 4; nothing
    else (its <repo_name> and <file_sep> are in no list)."""
    gguf = pytest.importorskip("gguf")
    from edgesdk.runtime.fim import find_fim_tokens
    from edgesdk.runtime.text import end_of_generation_ids

    fields = gguf.GGUFReader(str(SMOLLM2_GGUF)).fields
    tokens = fields["tokenizer.ggml.tokens"]
    ids = {bytes(tokens.parts[at]).decode(): token for token, at in enumerate(tokens.data)}
    eos = int(fields["tokenizer.ggml.eos_token_id"].contents())
    found = end_of_generation_ids(ids.get, {eos} | find_fim_tokens(ids.get).end_of_generation)
    assert found == {0, 2, 4}


def test_the_infill_samplers_end_of_generation_ids_leave_out_gpt_oss_end_too(tmp_path):
    """The infill sampler adds its fallback EOT to the ids that end generation, as llama.cpp's vocab loader does;
    where that EOT is gpt-oss's <|end|> (no <|eot_id|> or <|im_end|>), llama.cpp takes it out again afterwards,
    and so does the sampler now (it kept it, and an answer ended at the end of its analysis)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from edgesdk.runtime.infill_sampler import vocabulary_of
    from edgesdk.runtime.text import ChatTokenizer

    vocab = {"<|endoftext|>": 0, **{text: 1 + index for index, text in enumerate(HARMONY)}, "a": 7, "b": 8}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(["<|endoftext|>", *HARMONY])
    backend.save(str(tmp_path / "tokenizer.json"))
    tokenizer = ChatTokenizer(tmp_path / "tokenizer.json", {"eos_token_ids": [vocab["<|return|>"]]}, None)
    found = vocabulary_of(tokenizer)
    assert found.eot == vocab["<|end|>"]  # the first of llama.cpp's EOT texts this vocabulary holds
    assert vocab["<|end|>"] not in found.eog
    assert {vocab["<|return|>"], vocab["<|call|>"]} <= set(found.eog)
