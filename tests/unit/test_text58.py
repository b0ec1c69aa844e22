"""The chat's typed input (edgesdk/cli_interactive.py) and the tokenizer (edgesdk/runtime/text.py), review 58."""

from __future__ import annotations

from pathlib import Path


def _tokenizer(folder: Path, not_special: list[str]):
    """A byte-level BPE tokenizer with <|endoftext|>, <|im_start|>, <|im_end|> special (ids 0-2) and ``not_special``
    added after its 300 as ordinary added tokens (``"special": false``, as Phi-3's tokenizer.json marks <|end|>)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    from edgesdk.runtime.text import ChatTokenizer
    from tests._utils.tiny import CORPUS

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tokenizer.add_tokens([AddedToken(text, special=False, normalized=False) for text in not_special])
    tokenizer.save(str(folder / "tokenizer.json"))
    return ChatTokenizer(folder / "tokenizer.json", {"eos_token_ids": [2]}, None)


def test_in_suffix_reads_a_control_token_the_model_marks_not_special_as_the_token(tmp_path):
    """--in-suffix '<|end|>' for Phi-3: llama-completion tokenizes the suffix with parse_special, which reads the
    control token <|end|> (a control token in llama.cpp whatever tokenizer.json says) as the token; the typed line
    holding the same text stays plain text."""
    from edgesdk.cli_interactive import TypedPrompt, typed_prompt_ids

    tokenizer = _tokenizer(tmp_path, ["<|end|>"])
    end = tokenizer.token_id("<|end|>")
    ids = typed_prompt_ids(tokenizer, TypedPrompt("<|end|>", (), "say <|end|>", "<|end|>\n"))
    assert ids.count(end) == 2
    assert ids[0] == end
    assert ids[-2:] == [end, *tokenizer.encode_plain("\n")]
    assert tokenizer.decode(ids[1:-2]) == "say <|end|>"
