"""GGUF export, review 55: a byte-level pre-tokenizer with add_prefix_space is refused by naming that setting."""

from __future__ import annotations

import json

import pytest

from edgesdk.errors import ExportError

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


def _tokenizer_json(tmp_path, pre_tokenizer: dict):
    spec = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]},
            "added_tokens": [{"id": 3, "content": "<s>", "special": True}], "decoder": {"type": "ByteLevel"},
            "pre_tokenizer": pre_tokenizer}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    return path


@pytest.mark.parametrize("pre_tokenizer", [
    {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": False}]},
], ids=["gpt2-like", "llama3-like"])
def test_a_byte_level_step_with_add_prefix_space_is_refused_naming_it(pre_tokenizer, tmp_path):
    """A tokenizer saved with add_prefix_space=True (transformers rewrites its ByteLevel step so) splits as a known
    pre-tokenizer does, but puts a space in front of the text, which llama.cpp's gpt2 tokenizer never does. The
    refusal said the pre-tokenizer 'has no llama.cpp regex known to match it' and listed its own layout as known
    ('ByteLevel alone -> gpt-2', 'Llama 3's Split regexes'), with the flag cut off the quoted JSON for the Split."""
    from edgesdk.export.gguf_vocab import vocab_from_tokenizer_json

    path = _tokenizer_json(tmp_path, pre_tokenizer)
    with pytest.raises(ExportError, match="ByteLevel step has add_prefix_space true, so the bundle's tokenizer puts "
                                          "a space in front of every text") as caught:
        vocab_from_tokenizer_json(path, "<s>", None, 4)
    assert "add_prefix_space false" in caught.value.fix


def test_the_same_layout_without_add_prefix_space_is_written():
    """The refusal is for the flag alone: the same steps without it map to llama.cpp's names."""
    from edgesdk.export.gguf_vocab import _pre_tokenizer_name

    plain = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    assert _pre_tokenizer_name(plain, "tokenizer.json") == "llama-bpe"
    assert _pre_tokenizer_name({"type": "ByteLevel", "add_prefix_space": False}, "tokenizer.json") == "gpt-2"
