"""GGUF export, review 51: files llama.cpp's loader would refuse (src/llama-model.cpp, load_tensors)."""

from __future__ import annotations

import pytest

from tests._utils.builds import build_tiny_bundle
from tests._utils.tiny import save_tiny_model_dir

pytest.importorskip("gguf")
pytest.importorskip("torch")

NARROW = ("name: narrow\nstages:\n  - stage: prune\n    config: {ffn_ratio: 0.0, kv_group_ratio: 0.5, "
          "calibration_batches: 2, batch_size: 2, sequence_length: 24}\n"
          "export: {form: ort-fused, weights: fp32}\n")


def test_a_query_bias_narrower_than_the_model_is_refused_not_written_for_llama_cpp_to_refuse(tmp_path):
    """A Qwen2 model (Q/K/V biases) that prune left with one of its two GQA groups per layer has query
    projections of 2 heads x 16 = 32 rows in a width of 64, written as deci. llama.cpp's deci loader (as its llama
    and qwen2 ones) creates blk.N.attn_q.bias with the shape {n_embd}, so the file the export wrote and called
    verified (attn_q.bias of 32 values) failed to load in llama.cpp ("wrong shape; expected 64, got 32"). The export
    now refuses it, naming the layers, and writes nothing."""
    from edgesdk.errors import ExportError
    from edgesdk.export.gguf_export import export_gguf

    model_dir = save_tiny_model_dir(tmp_path / "model", hidden=64, heads=4, kv_heads=2, intermediate=128, layers=2,
                                    model_type="qwen2")
    bundle = build_tiny_bundle(tmp_path, NARROW, "host", model_dir=model_dir)
    assert bundle.manifest["model"]["after"]["attention_heads"] == 2
    out = tmp_path / "narrow.gguf"
    with pytest.raises(ExportError) as caught:
        export_gguf(bundle.path, out)
    text = str(caught.value)
    assert "blk.N.attn_q.bias as 64 values" in text
    assert "layer 0: 32, layer 1: 32" in text
    assert "deci" in text
    assert "kv_group_ratio" in text
    assert not out.exists()
    assert not list(tmp_path.glob("narrow.gguf*"))


def test_a_pruned_qwen2_whose_query_keeps_the_model_width_is_still_written(tmp_path):
    """FFN pruning alone (layers of different FFN widths, written as deci) keeps every query bias as wide as the
    model: llama.cpp loads it, and the export writes it."""
    from gguf import GGUFReader

    from edgesdk.export.gguf_export import export_gguf

    model_dir = save_tiny_model_dir(tmp_path / "model", hidden=64, heads=4, kv_heads=2, intermediate=128, layers=2,
                                    model_type="qwen2")
    recipe = NARROW.replace("ffn_ratio: 0.0, kv_group_ratio: 0.5", "ffn_ratio: 0.25, kv_group_ratio: 0.0")
    bundle = build_tiny_bundle(tmp_path, recipe, "host", model_dir=model_dir)
    report = export_gguf(bundle.path, tmp_path / "ffn.gguf")
    reader = GGUFReader(str(report.path))
    width = reader.fields[f"{report.architecture}.embedding_length"].contents()
    biases = [tensor for tensor in reader.tensors if tensor.name.endswith("attn_q.bias")]
    assert biases
    assert all(list(tensor.shape) == [width] for tensor in biases)
