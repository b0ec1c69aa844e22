"""Logprobs and infill, checked against llama.cpp's vocab loader (src/llama-vocab.cpp, "auto-detect special tokens by
text") and llama-server's ``/infill`` refusal.

SmolLM2 (the default model) holds none of llama.cpp's FIM prefix, suffix or middle texts; its only FIM-looking token,
``<reponame>`` (id 4), is in llama.cpp's FIM_REP list (Granite's). A refusal of ``/infill`` must not send a SmolLM2
user to SmolLM2 as a model that can infill.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

# SmolLM2's special tokens, ids 0-16, as its tokenizer.json (and its GGUF's tokenizer.ggml.tokens) list them
SMOLLM2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>", "<file_sep>",
                    "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>", "<jupyter_start>",
                    "<jupyter_text>", "<jupyter_code>", "<jupyter_output>", "<jupyter_script>", "<empty_output>"]
SMOLLM2_GGUF = Path.home() / ".cache/edgesdk/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"


def _smollm2_texts() -> list[str]:
    """SmolLM2's token texts: the real GGUF's where it is here, else its special tokens."""
    if SMOLLM2_GGUF.exists():
        gguf = pytest.importorskip("gguf")
        field = gguf.GGUFReader(str(SMOLLM2_GGUF)).fields["tokenizer.ggml.tokens"]
        return [bytes(field.parts[index]).decode("utf-8") for index in field.data]
    return SMOLLM2_SPECIALS


def test_smollm2_has_fim_rep_and_no_fim_prefix_suffix_or_middle_as_llama_cpp_finds_them():
    from edgesdk.runtime.fim import find_fim_tokens

    texts = _smollm2_texts()
    ids = {text: index for index, text in enumerate(texts)}
    fim = find_fim_tokens(ids.get)
    assert fim.missing() == ["prefix", "suffix", "middle"]
    assert (fim.rep, fim.sep, fim.pad) == (4, None, None)
    assert fim.end_of_generation == {4}  # llama.cpp's special_eog_ids take FIM_REP


def _models_named(message: str) -> list[str]:
    """The models a refusal names as built with FIM tokens: the list after "built with them (" up to ";" or ")"."""
    found = re.search(r"built with them \(([^;)]*)", message)
    assert found, message
    return [name.strip() for name in found.group(1).split(",")]


def test_infill_refusal_on_a_smollm2_vocabulary_does_not_name_smollm2_as_a_fim_model(served):
    """The conftest tiny bundle's tokenizer has SmolLM2's first special tokens and, like SmolLM2, no FIM token."""
    status, body = served.post("/infill", {"input_prefix": "def f(x):\n    return ", "input_suffix": "\n"})
    assert status == 501, body
    message = body["error"]["message"]
    assert "Infill is not supported by this model" in message
    named = _models_named(message)
    assert "Qwen2.5-Coder" in named
    assert not any("SmolLM2" in name for name in named), message
    assert "SmolLM2 has none" in message


def test_completions_suffix_refusal_does_not_name_smollm2_as_a_fim_model(served):
    status, body = served.post("/v1/completions", {"prompt": "def f(x):", "suffix": "\n", "max_tokens": 2})
    assert status == 400, body
    assert body["error"]["param"] == "suffix"
    assert not any("SmolLM2" in name for name in _models_named(body["error"]["message"])), body


# ------------------------------------------------------------------------------------ the infill sampler's EOG tokens


def _deepseek_coder_instruct_like(folder: Path):
    """A byte-level tokenizer whose EOS is <|EOT|> (id 1) and whose <｜end▁of▁sentence｜> (id 2), llama.cpp's EOT by
    its text, is not among the bundle's eos_token_ids: DeepSeek-Coder-Instruct's tokenizer_config."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from edgesdk.runtime.text import ChatTokenizer
    from tests._utils.tiny import CORPUS

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<|EOT|>", "<｜end▁of▁sentence｜>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tokenizer.save(str(folder / "tokenizer.json"))
    return ChatTokenizer(folder / "tokenizer.json", {"eos_token_ids": [1], "eos_token": "<|EOT|>"}, None)


def test_the_eot_token_the_infill_sampler_falls_back_to_is_one_of_its_eog_tokens(tmp_path):
    """llama.cpp's vocab loader adds special_eot_id to special_eog_ids where it is not there ("special_eot_id is not
    in special_eog_ids - the tokenizer config may be incorrect"), so llama_vocab_is_eog holds for it."""
    from edgesdk.runtime.infill_sampler import infill_apply, vocabulary_of

    vocabulary = vocabulary_of(_deepseek_coder_instruct_like(tmp_path))
    assert vocabulary.eot == 2
    assert {1, 2} <= set(vocabulary.eog)
    # <｜end▁of▁sentence｜> at p 0.3 against a text token at 0.7: 3 * 0.3 * 2 > 0.7, the EOG tokens take over
    text_token = 100
    ids, _, p = infill_apply([2, text_token], [0.0, float(np.log(0.7 / 0.3))], vocabulary.texts, vocabulary.eog,
                             vocabulary.eot)
    assert ids.tolist() == [2]
    assert p.tolist() == [1.0]
