"""GGUF export, review 46: what llama.cpp's tokenizer does with the text, against the bundle's tokenizer.json."""

from __future__ import annotations

import json

import pytest

from edgesdk.errors import ExportError

pytest.importorskip("gguf")

BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


def _byte_level_spec(normalizer) -> dict:
    """A byte-level BPE tokenizer.json (as ``tokenizers`` writes it) with ``normalizer``."""
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": 5, "content": "<s>", "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True}],
            "normalizer": normalizer, "pre_tokenizer": BYTE_LEVEL, "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {"a": 0, "b": 1, "ab": 2, "A": 3, "B": 4}, "merges": [["a", "b"]]}}


def _sentencepiece_spec(normalizers: list[dict]) -> dict:
    """A SentencePiece BPE tokenizer.json in Llama 2's older form (Prepend and Replace normalizer) plus
    ``normalizers``."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "\u2581": 3, "a": 4, "b": 5, "ab": 6, "\u2581ab": 7, "A": 8}
    return {"version": "1.0", "added_tokens": [
                {"id": i, "content": token, "single_word": False, "lstrip": False, "rstrip": False,
                 "normalized": False, "special": True} for i, token in enumerate(("<unk>", "<s>", "</s>"))],
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "\u2581"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}, *normalizers]},
            "pre_tokenizer": None, "post_processor": None,
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
                {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
            "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                      "vocab": vocab, "merges": [["a", "b"], ["\u2581", "ab"]]}}


def _write(tmp_path, spec) -> object:
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    return path


@pytest.mark.parametrize("normalizer", [
    {"type": "Lowercase"},
    {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]},
    {"type": "Replace", "pattern": {"String": "A"}, "content": "a"},
])
def test_a_byte_level_normalizer_llama_cpp_does_not_apply_is_refused(normalizer, tmp_path):
    """llama.cpp's BPE tokenizer splits the raw text with its pre-tokenizer regex and normalizes nothing
    (llama-vocab.cpp, llm_tokenizer_bpe_session), so a tokenizer.json whose normalizer lowercases (or rewrites)
    the text tokenizes "AB" as one token ("ab") in the bundle and as two ("A", "B") in llama.cpp; llama.cpp's own
    converter refuses such a tokenizer (its output on the test text has no known hash). The export wrote it."""
    from tokenizers import Tokenizer

    from edgesdk.export.gguf_vocab import vocab_from_tokenizer_json

    path = _write(tmp_path, _byte_level_spec(normalizer))
    if normalizer.get("type") != "Replace":
        assert Tokenizer.from_file(str(path)).encode("AB").tokens == ["ab"]  # what the bundle computes with
    with pytest.raises(ExportError, match="normalizer .* which llama.cpp does not do") as caught:
        vocab_from_tokenizer_json(path, "<s>", None, 6)
    assert "without that normalizer" in caught.value.fix


def test_qwen2s_nfc_normalizer_is_written_with_a_note_of_the_texts_it_changes(tmp_path):
    """Qwen2's tokenizer composes the text (NFC) first, which llama.cpp does not (and its converter accepts):
    only text not already composed tokenizes differently, so the export goes on and says so in its notes."""
    from tokenizers import Tokenizer

    from edgesdk.export.gguf_vocab import vocab_from_tokenizer_json

    path = _write(tmp_path, _byte_level_spec({"type": "NFC"}))
    tokenizer = Tokenizer.from_file(str(path))
    assert tokenizer.encode("e\u0301").ids == tokenizer.encode("\u00e9").ids  # composed before the BPE
    vocab = vocab_from_tokenizer_json(path, "<s>", None, 6)
    assert vocab.pre == "gpt-2"
    assert [note for note in vocab.notes if "NFC" in note and "U+0301" in note]
    assert vocab_from_tokenizer_json(_write(tmp_path, _byte_level_spec(None)), "<s>", None, 6).notes == ()


def test_a_sentencepiece_normalizer_step_beyond_the_space_handling_is_refused(tmp_path):
    """llama.cpp's SPM tokenizer only writes spaces as U+2581 (and adds one in front: add_space_prefix), so the
    Prepend and Replace steps of Llama 2's tokenizer.json are its own; any other step (here Lowercase) changes the
    text where llama.cpp does not. The export wrote the vocabulary as if the step were not there."""
    from edgesdk.export.gguf_vocab import vocab_from_tokenizer_json

    plain = vocab_from_tokenizer_json(_write(tmp_path, _sentencepiece_spec([])), "<s>", "</s>", 9)
    assert plain.model == "llama"
    assert plain.add_space_prefix
    assert plain.notes == ()
    with pytest.raises(ExportError, match=r'normalizer \{"type": "Lowercase"\}'):
        vocab_from_tokenizer_json(_write(tmp_path, _sentencepiece_spec([{"type": "Lowercase"}])), "<s>", "</s>", 9)
