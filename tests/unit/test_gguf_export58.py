"""GGUF export, review 58: added tokens left out of the file do not decide its rstrip check, and the EOS / BOS
written where the tokenizer has none is an id the file's vocabulary holds."""

from __future__ import annotations

import json

import pytest

from edgesdk.export.gguf_vocab import GGUFVocab, vocab_from_tokenizer_json


def _tokenizer_json(tmp_path, added: list[dict]):
    spec = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]},
            "added_tokens": added, "decoder": {"type": "ByteLevel"},
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False}}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    return path


def test_an_unembedded_added_token_with_rstrip_is_left_out_not_refused(tmp_path):
    """An added token past the embedding (Gemma 3's <image_soft_token>) is not written, so its rstrip cannot make
    llama.cpp tokenize differently; the export refused the whole tokenizer for it ('have rstrip set')."""
    path = _tokenizer_json(tmp_path, [{"id": 3, "content": "<s>", "special": True},
                                      {"id": 4, "content": "<image>", "special": True, "rstrip": True}])
    vocab = vocab_from_tokenizer_json(path, "<s>", None, 4, "tiny")
    assert vocab.tokens == ["a", "b", "ab", "<s>"]
    assert any("'<image>' (id 4)" in note for note in vocab.notes)
    assert not any("rstrip" in note for note in vocab.notes)


def test_a_byte_level_bpe_without_merges_is_refused_naming_the_key(tmp_path):
    """gguf's writer leaves an empty array out of the file, so a tokenizer without merges was written without
    tokenizer.ggml.merges, a key llama.cpp's gpt2 tokenizer requires: the export succeeded and llama.cpp refused
    the file ('cannot find tokenizer merges in model file')."""
    from edgesdk.errors import ExportError

    path = _tokenizer_json(tmp_path, [{"id": 3, "content": "<s>", "special": True}])
    spec = json.loads(path.read_text())
    spec["model"]["merges"] = []
    path.write_text(json.dumps(spec))
    with pytest.raises(ExportError, match="has no merges.*tokenizer.ggml.merges") as caught:
        vocab_from_tokenizer_json(path, "<s>", None, 4, "tiny")
    assert "cannot find tokenizer merges in model file" in caught.value.problem
    assert "at least one merge" in caught.value.fix


def _vocab(bos_id=None, eos_id=None) -> GGUFVocab:
    return GGUFVocab(tokens=["a", "b", "ab", "<|end|>"], token_types=[1, 1, 1, 3], merges=["a b"], pre="gpt-2",
                     bos_id=bos_id, eos_id=eos_id, unk_id=None, add_bos=False)


def test_the_eos_written_for_a_tokenizer_without_one_is_a_held_id():
    """The manifest's first stop id lies past the vocabulary: it was written as tokenizer.ggml.eos_token_id (and
    as the BOS), which llama.cpp passes over ("bad special token") for its default id 11, the very fallback this
    key is written to avoid, though the same id was already dropped from the list of stop ids."""
    from edgesdk.export.gguf_export import with_end_tokens

    vocab = with_end_tokens(_vocab(), [500, 3])
    assert (vocab.eos_id, vocab.bos_id, vocab.eos_ids) == (3, 3, (3,))


def test_the_tokenizers_own_eos_and_bos_are_kept():
    from edgesdk.export.gguf_export import with_end_tokens

    vocab = with_end_tokens(_vocab(bos_id=0, eos_id=2), ["3", 2])
    assert (vocab.eos_id, vocab.bos_id, vocab.eos_ids) == (2, 0, (3, 2))
    assert with_end_tokens(_vocab(), []).eos_id is None


def test_a_mostly_float_file_with_quantized_tensors_gives_the_quantization_version(tmp_path):
    """A width of 48 is no multiple of ggml's 32-weight block, so the matrices that read it stay float32 and only
    ffn_down (K = 128) is Q4_0: the majority type is F32, and general.quantization_version, which the GGUF spec
    requires wherever any tensor is quantized, was left out with it."""
    pytest.importorskip("gguf")
    pytest.importorskip("torch")
    from gguf import GGUFReader

    from edgesdk.export.gguf_export import export_gguf
    from tests._utils.builds import build_tiny_bundle
    from tests._utils.tiny import save_tiny_model_dir

    model_dir = save_tiny_model_dir(tmp_path / "model", hidden=48, heads=3, kv_heads=1, intermediate=128)
    bundle = build_tiny_bundle(tmp_path, "name: fused\nstages: []\nexport: {form: ort-fused, weights: int4, "
                                         "block_size: 32}\n", "host", model_dir=model_dir)
    report = export_gguf(bundle.path, tmp_path / "model.gguf")
    assert report.file_type == "F32"
    assert report.tensor_types.get("Q4_0") == 2
    field = GGUFReader(str(report.path)).fields["general.quantization_version"]
    assert field.contents() == 2
