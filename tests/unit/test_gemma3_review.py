"""Gemma 3 text models through the stages and the export: what a Llama-shaped assumption would get wrong.

Tiny Gemma 3 models (tests/_utils/tiny.py) have a sliding window of 4 on even layers and full attention on odd
ones; transformers reads each layer's kind from ``config.layer_types`` by the layer's position.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from tests._utils.tiny import tiny_llama  # noqa: E402

GEMMA3 = {"model_type": "gemma3_text", "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 32,
          "intermediate": 128}


def _batches(count: int = 1):
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, 320, (2, 24), generator=generator) for _ in range(count)]


def _kl_without(model, positions: list[int], batches, reference) -> float:
    """Mean per-token KL(reference || a copy of ``model`` that keeps only the layers at ``positions``)."""
    import torch.nn.functional as F

    from edgesdk.compress.structure import keep_layers

    pruned = copy.deepcopy(model)
    keep_layers(pruned, positions)
    total = 0.0
    with torch.no_grad():
        for batch, ref in zip(batches, reference, strict=True):
            logp = F.log_softmax(pruned(batch, use_cache=False).logits.float(), dim=-1)
            total += float((ref.exp() * (ref - logp)).sum(-1).mean())
    return total / len(batches)


def test_depth_pruning_scores_each_layer_by_the_model_actually_left_without_it():
    """Scoring a layer's removal runs the model without it; its later layers move up a position, and a Gemma
    layer's mask and rotary table follow its own kind (sliding or full), not the kind of the position it lands
    on: the score is the KL of the model that keep_layers leaves."""
    import torch.nn.functional as F

    from edgesdk.compress.prune import layer_removal_costs

    model = tiny_llama(layers=3, **GEMMA3)
    kinds = list(model.config.layer_types)
    batches = _batches()
    with torch.no_grad():
        reference = [F.log_softmax(model(batch, use_cache=False).logits.float(), dim=-1) for batch in batches]
        costs = layer_removal_costs(model, batches, reference)
    expected = [_kl_without(model, [i for i in range(3) if i != skipped], batches, reference) for skipped in range(3)]
    assert costs == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert model.config.layer_types == kinds  # put back
    assert len(model.model.layers) == 3


def test_greedy_depth_pruning_rescores_on_the_layers_left():
    """depth_rescore: the second round scores the layers left after the first removal as that model has them."""
    import torch.nn.functional as F

    from edgesdk.compress.prune import plan_depth

    model = tiny_llama(layers=4, **GEMMA3)
    batches = _batches()
    kept, rounds = plan_depth(model, batches, remove=2, rescore=True)
    assert len(kept) == 2
    assert len(rounds) == 2
    first = min(range(4), key=rounds[0].__getitem__)
    left = [i for i in range(4) if i != first]
    with torch.no_grad():
        reference = [F.log_softmax(model(batch, use_cache=False).logits.float(), dim=-1) for batch in batches]
    expected = [_kl_without(model, [i for i in left if i != skipped], batches, reference) for skipped in left]
    assert rounds[1] == pytest.approx(expected, rel=1e-3, abs=1e-5)


def _gemma_config(**rope):
    from transformers import AutoConfig

    return AutoConfig.for_model("gemma3_text", vocab_size=320, hidden_size=64, intermediate_size=128, head_dim=32,
                                num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, sliding_window=4,
                                max_position_embeddings=64,
                                layer_types=["sliding_attention", "full_attention", "sliding_attention"], **rope)


def test_a_layer_type_s_longrope_past_its_original_context_is_refused():
    """Gemma 3's rope_parameters hold one setting per layer type; a longrope full_attention setting switches to
    its long factors past original_max_position_embeddings, which the graph's fixed table does not follow."""
    from edgesdk.errors import ExportError
    from edgesdk.export.onnx_export import ExportConfig, check_exportable

    longrope = {"rope_type": "longrope", "rope_theta": 1e6, "short_factor": [1.0] * 16, "long_factor": [4.0] * 16,
                "original_max_position_embeddings": 16}
    config = _gemma_config(rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                            "full_attention": longrope})
    with pytest.raises(ExportError, match="rotary embedding of its full_attention layers is longrope") as raised:
        check_exportable(config, ExportConfig(max_context=64))
    assert "--max-context 16" in raised.value.fix
    check_exportable(config, ExportConfig(max_context=16))  # the short factors: the graph's table
    linear = {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}  # Gemma 3 4B and larger
    check_exportable(_gemma_config(rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                                    "full_attention": linear}), ExportConfig(max_context=64))


def _saved_gemma(path, **config):
    from tests._utils.tiny import tiny_tokenizer

    model = tiny_llama(layers=3, **GEMMA3)
    for name, value in config.items():
        setattr(model.config, name, value)
    model.save_pretrained(path)
    tiny_tokenizer(model.config.vocab_size).save_pretrained(path)
    return path


def test_attn_logit_softcapping_loads_and_exports_as_transformers_computes_it(tmp_path):
    """transformers' Gemma 3 reads attn_logit_softcapping but never applies it: such a model loads, and its graph
    gives the model's logits. final_logit_softcapping, which Gemma3ForCausalLM applies, is still refused."""
    import numpy as np

    from edgesdk.errors import ModelSourceError
    from edgesdk.export.onnx_export import MODEL_FILE, ExportConfig, export_model
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model
    from edgesdk.runtime.ort_fused_backend import OrtFusedBackend

    loaded = load_model(resolve_model(str(_saved_gemma(tmp_path / "attn", attn_logit_softcapping=50.0))),
                        progress=False)
    assert loaded.model.config.attn_logit_softcapping == 50.0
    spec = export_model(loaded.model, tmp_path / "graph", ExportConfig(max_context=32, form="ort-fused"))
    ids = np.random.default_rng(0).integers(0, spec.vocab_size, 12)
    with torch.no_grad():
        expected = loaded.model(torch.from_numpy(ids)[None], use_cache=False).logits[0].numpy()
    backend = OrtFusedBackend(tmp_path / "graph" / MODEL_FILE, spec.to_json(), threads=1)
    assert np.abs(backend.prefill(ids, keep_logits=12) - expected).max() < 1e-3

    with pytest.raises(ModelSourceError, match="sets final_logit_softcapping 30.0"):
        load_model(resolve_model(str(_saved_gemma(tmp_path / "final", final_logit_softcapping=30.0))), progress=False)


@pytest.mark.parametrize(("window", "windowed"), [(32, False), (31, True)])
def test_a_window_as_long_as_the_context_needs_no_newer_onnxruntime(window, windowed, tmp_path):
    """A sliding window of at least the bundle's context hides no key from any query (Gemma 3 1B's 512 with
    --max-context 512): the fused graph sets no local_window_size and records no onnxruntime >= 1.24, so a board
    with an older onnxruntime runs it; a window one shorter is real. Both give the model's logits over the whole
    context."""
    import numpy as np
    import onnx

    from edgesdk.export.onnx_export import MODEL_FILE, ExportConfig, export_model
    from edgesdk.runtime.ort_fused_backend import OrtFusedBackend

    model = tiny_llama(layers=3, **GEMMA3)
    model.config.sliding_window = window
    for layer in model.model.layers:
        if layer.self_attn.sliding_window is not None:
            layer.self_attn.sliding_window = window
    spec = export_model(model, tmp_path, ExportConfig(max_context=32, form="ort-fused"))
    assert ("min_onnxruntime" in spec.to_json()) is windowed
    graph = onnx.load(str(tmp_path / MODEL_FILE), load_external_data=False).graph
    windows = [a.i for node in graph.node for a in node.attribute if a.name == "local_window_size"]
    assert windows == ([window, window] if windowed else [])
    ids = np.random.default_rng(0).integers(0, spec.vocab_size, 32)
    with torch.no_grad():
        expected = model(torch.from_numpy(ids)[None], use_cache=False).logits[0].numpy()
    backend = OrtFusedBackend(tmp_path / MODEL_FILE, spec.to_json(), threads=1)
    got = np.concatenate([backend.prefill(ids[:20], keep_logits=20), [backend.decode(int(t)) for t in ids[20:]]])
    assert np.abs(got - expected).max() < 1e-3
