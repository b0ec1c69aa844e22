"""GGUF export, review 45: what the exported file tells the runtimes that load it, read back with gguf's own reader."""

from __future__ import annotations

import pytest

from tests._utils.builds import build_tiny_bundle
from tests._utils.tiny import save_tiny_model_dir

pytest.importorskip("gguf")
pytest.importorskip("torch")

FUSED = "name: fused\nstages: []\nexport: {form: ort-fused, weights: int8, block_size: 32}\n"


def _bundle(tmp_path):
    model_dir = save_tiny_model_dir(tmp_path / "model", hidden=64, heads=4, kv_heads=2, intermediate=128)
    return build_tiny_bundle(tmp_path, FUSED, "host", model_dir=model_dir)


def test_every_id_the_bundle_stops_at_is_written_as_ollamas_eos_token_ids(tmp_path):
    """The tiny ChatML tokenizer's EOS is <|im_end|> (2); the bundle also stops at <|endoftext|> (0). Ollama's
    converter writes generation_config's list of end ids as ``tokenizer.ggml.eos_token_ids`` (an INT32 array) and
    its engine stops at ``eos_token_id`` and each of them: without the key an Ollama model made from the export
    runs on past <|endoftext|>, where the bundle stops."""
    from gguf import GGUFReader, GGUFValueType

    from edgesdk.export.gguf_export import export_gguf

    bundle = _bundle(tmp_path)
    stops = bundle.manifest["tokenizer"]["eos_token_ids"]
    report = export_gguf(bundle.path, tmp_path / "model.gguf")
    fields = GGUFReader(str(report.path)).fields
    eos = fields["tokenizer.ggml.eos_token_id"].contents()
    assert eos == 2
    assert set(stops) - {eos}, f"the test needs end ids beside the EOS token, got {stops}"
    ids = fields["tokenizer.ggml.eos_token_ids"]
    assert ids.types == [GGUFValueType.ARRAY, GGUFValueType.INT32]  # what Ollama's KV.Ints reads
    assert ids.contents() == sorted(stops)


def test_no_eos_token_ids_key_where_the_eos_token_is_the_only_end(tmp_path):
    """Where the bundle stops at its EOS token alone, nothing is added to what llama.cpp's converter writes."""
    from gguf import GGUFWriter

    from edgesdk.export.gguf_export import add_tokenizer
    from edgesdk.export.gguf_vocab import GGUFVocab

    vocab = GGUFVocab(tokens=["a", "b", "c"], token_types=[1, 1, 3], merges=["a b"], pre="gpt-2", bos_id=None,
                      eos_id=2, unk_id=None, add_bos=False, eos_ids=(2,))
    writer = GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    add_tokenizer(writer, vocab, None)
    keys = {key for kv in writer.kv_data for key in kv}
    assert "tokenizer.ggml.eos_token_id" in keys
    assert "tokenizer.ggml.eos_token_ids" not in keys
