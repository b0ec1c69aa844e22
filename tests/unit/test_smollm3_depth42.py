"""Depth pruning a SmolLM3 (edgesdk/compress/structure.py ``keep_layers``): each kept layer keeps whether it
rotates (transformers' SmolLM3Attention sets ``use_rope`` from ``config.no_rope_layers[layer_idx]`` when the model is
built), also in the checkpoint a resumed build reloads (edgesdk/build/checkpoint.py ``load_checkpoint``)."""

from __future__ import annotations

import pytest

from tests._utils.tiny import tiny_llama, tiny_tokenizer

torch = pytest.importorskip("torch")

IDS = torch.tensor([[5, 17, 120, 33, 250, 9, 101, 3, 42, 7, 99, 12]])


def test_a_depth_pruned_smollm3_checkpoint_reloads_with_its_layers_rotary(tmp_path, record_property):
    """Keeping layers 0, 2 and 3 of four (NoPE at 3): the kept NoPE layer is the third, and the checkpoint reloaded
    through the resume path rotates the first two only, with the pruned model's logits."""
    from edgesdk.build.checkpoint import load_checkpoint, save_checkpoint
    from edgesdk.compress.structure import keep_layers

    model = tiny_llama(model_type="smollm3", layers=4, hidden=64, heads=4, kv_heads=2, intermediate=128,
                       config_overrides={"initializer_range": 0.2})
    assert model.config.no_rope_layers == [1, 1, 1, 0]
    keep_layers(model, [0, 2, 3])
    assert [int(layer.self_attn.use_rope) for layer in model.model.layers] == [1, 1, 0]
    save_checkpoint(model, tiny_tokenizer(), tmp_path / "pruned")
    loaded = load_checkpoint(tmp_path / "pruned")
    assert loaded.config.num_hidden_layers == 3
    assert [int(layer.self_attn.use_rope) for layer in loaded.model.layers] == [1, 1, 0]
    assert loaded.config.no_rope_layers == [1, 1, 0]
    with torch.no_grad():
        expected, got = model.eval()(IDS).logits, loaded(IDS).logits
    diff = float((got - expected).abs().max())
    record_property("max_abs_diff", diff)
    print(f"\n[max abs diff] reloaded depth-pruned SmolLM3 vs the pruned model: {diff:.3e}")
    assert diff < 1e-5
