"""A Qwen3 GGUF export gives its head size even where it equals width / heads, as llama.cpp's converter does
(it writes attention.key_length / value_length whenever config.json has head_dim, which Qwen3's always has)."""

from __future__ import annotations

import pytest

from tests._utils.builds import build_tiny_bundle
from tests._utils.tiny import save_tiny_model_dir

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")

FUSED_FP32 = "name: fused\nstages: []\nexport: {form: ort-fused, weights: fp32, block_size: 32}\n"


def test_a_qwen3_of_square_heads_writes_its_head_size_and_loads_back_with_it(tmp_path):
    from gguf import GGUFReader
    from transformers import AutoConfig, AutoModelForCausalLM

    from edgesdk.export.gguf_export import export_gguf
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    # 4 heads of 16 over a width of 64: the head size is width / heads
    model_dir = save_tiny_model_dir(tmp_path / "model", hidden=64, heads=4, kv_heads=2, intermediate=128,
                                    model_type="qwen3", head_dim=16)
    config = AutoConfig.from_pretrained(str(model_dir))
    assert config.head_dim * config.num_attention_heads == config.hidden_size
    bundle = build_tiny_bundle(tmp_path, FUSED_FP32, "host", model_dir=model_dir)
    report = export_gguf(bundle.path, tmp_path / "model.gguf")

    fields = {name: field.contents() for name, field in GGUFReader(str(report.path)).fields.items()}
    assert fields["qwen3.attention.key_length"] == config.head_dim
    assert fields["qwen3.attention.value_length"] == config.head_dim

    loaded = load_model(resolve_model(str(report.path)), progress=False)
    assert loaded.model.config.head_dim == config.head_dim
    source = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = torch.tensor([[5, 17, 120, 33, 250, 9, 64, 199]])
    with torch.no_grad():
        assert (loaded.model(ids).logits - source(ids).logits).abs().max().item() < 1e-4

