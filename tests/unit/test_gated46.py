"""Gated and block-sparse graphs against the PyTorch model they come from, on real onnxruntime sessions and the
kernels' PyTorch twins: a model with per-head query / key norms (Qwen3, Gemma 3), the block-sparse weights of a model
carrying power adapters, KV caches and block counts over prefill + decode."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgesdk.errors import RuntimeBackendError  # noqa: E402
from edgesdk.export.onnx_export import ExportConfig, export_model  # noqa: E402
from edgesdk.power import adapter, train  # noqa: E402
from edgesdk.power.controller import ADAPTERS_OFF_TAU  # noqa: E402
from edgesdk.power.profiler import CostStats  # noqa: E402
from edgesdk.runtime.ort_gated_backend import OrtGatedBackend  # noqa: E402
from tests._utils.tiny import on_sparse_grid, tiny_llama  # noqa: E402

WEIGHTS = (0.3, 0.5, 0.2)
PROMPT, TOKENS = 8, 16


def _gated(model):
    """``model`` with power adapters moved far off their start (channel and head scales far from 1, gates spread),
    and the power settings the exporter reads: (model, state, info)."""
    state = adapter.install_adapters(model, 4, peak_layers=(1, 2) if len(model.model.layers) > 2 else (1,))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".power_adapter." in name:
                p.add_(torch.randn(p.shape, generator=generator) * 0.5)
            if name.endswith("power_adapter.proj2.bias"):
                p[-1] = 0.0
    cost = CostStats(16, [0.0, 0.2, 0.4, 0.6], {}, 0.0125, 0.0)
    peak, ffn = train.calibrate_scales(model, state, torch.randint(0, 320, (2, 32), generator=generator))
    info = train.PowerModelInfo(WEIGHTS, peak, ffn, 0.5, cost)
    model.config.edgesdk_power = {**model.config.edgesdk_power, "weights": list(WEIGHTS), "peak_scale": peak,
                                  "ffn_scales": ffn, "cost_scale": 0.5, "cost": cost.to_json(), "tau_init": 0.5}
    return model, state, info


@torch.no_grad()
def _reference(model, state, info, ids: torch.Tensor, tau: float):
    """The PyTorch gated model at ``tau``: logits (T, V), gates (T, L), p_t (T,)."""
    state.clear()
    state.record, state.enabled, state.tau = True, True, tau
    logits = model(ids[None], use_cache=False).logits[0].numpy()
    gates = torch.stack(state.gates, -1)[0].numpy()
    power = info.power(state, torch.arange(len(ids))[None])[0].numpy()
    state.clear()
    state.record, state.tau = False, 0.0
    return logits, gates, power


@pytest.mark.parametrize("model_type", ["qwen3", "gemma3_text"])
def test_the_query_scales_of_a_model_with_head_norms_act_where_the_pytorch_model_applies_them(model_type, tmp_path):
    """Qwen3 and Gemma 3 normalize each query head (transformers: ``q_norm(q_proj(x))``); the PyTorch model scales
    ``q_proj``'s output, before that norm. The graph multiplied the normalized query instead: its logits were
    0.25 (Qwen3) and 1.4 (Gemma 3) off the gated model at every tau >= 0, and validate_fused refused the build."""
    model, state, info = _gated(tiny_llama(layers=3, model_type=model_type))
    spec = export_model(model, tmp_path, ExportConfig(form="ort-fused", weights="fp32", max_context=64))
    assert spec.form == "ort-fused-gated"
    backend = OrtGatedBackend(tmp_path / "model.onnx", spec.to_json(), threads=1)
    ids = torch.randint(0, 320, (TOKENS,), generator=torch.Generator().manual_seed(5))
    for tau in (ADAPTERS_OFF_TAU, 0.0, 0.5):
        logits, gates, power = _reference(model, state, info, ids, tau)
        backend.reset()
        backend.gating, backend.fixed_tau = True, tau
        got = backend.prefill(ids[:PROMPT].numpy(), keep_logits=PROMPT)
        np.testing.assert_allclose(got, logits[:PROMPT], atol=2e-4, err_msg=f"prefill, tau {tau}")
        np.testing.assert_allclose(backend.last_gates, gates[:PROMPT], atol=1e-5)
        np.testing.assert_allclose(backend.last_power, power[:PROMPT], atol=1e-4)
        for t in range(PROMPT, TOKENS):
            np.testing.assert_allclose(backend.decode(int(ids[t])), logits[t], atol=2e-4, err_msg=f"decode, tau {tau}")
            np.testing.assert_allclose(backend.last_gates[0], gates[t], atol=1e-5)
    # the scales matter here: at tau 0 the graph is not the model with its adapters off
    state.enabled = False
    with torch.no_grad():
        loaded = model(ids[None], use_cache=False).logits[0].numpy()
    state.enabled = True
    backend.reset()
    backend.fixed_tau = 0.0
    assert np.abs(backend.prefill(ids.numpy(), keep_logits=TOKENS) - loaded).max() > 1e-2


def test_the_sparse_weights_of_a_model_with_power_adapters_pass_the_builds_check(tmp_path):
    """The block-sparse weights hold no adapters (the triton backend has no gates): they compute the model with its
    adapters off. validate_sparse held them to the gated model at tau 0, whose channel and query scales act, and
    refused the export as an exporter bug (logits 1.0 apart)."""
    from safetensors.torch import load_file

    from edgesdk.export.sparse_export import SparseExportConfig, export_sparse, validate_sparse
    from edgesdk.export.validate import ValidationConfig
    from edgesdk.runtime.sparse_decoder import SparseDecoder

    model, state, _ = _gated(on_sparse_grid(tiny_llama(hidden=64, heads=4, kv_heads=2), embedding_in_half=True))
    state.tau = 0.0  # where the power stage leaves it
    record = export_sparse(model, tmp_path, SparseExportConfig(), max_context=64)
    report = validate_sparse(model, tmp_path, record, ValidationConfig())
    assert max(report["max_abs_diff"].values()) < 1e-4
    assert state.enabled  # the adapters are on again afterwards
    assert state.tau == 0.0
    ids = torch.randint(0, 320, (TOKENS,), generator=torch.Generator().manual_seed(2))
    decoder = SparseDecoder(load_file(str(tmp_path / record["weights"])), record, mode="reference")
    got = decoder.step(ids, TOKENS)
    with torch.no_grad():
        gated = model(ids[None], use_cache=False).logits[0]
        state.enabled = False
        loaded = model(ids[None], use_cache=False).logits[0]
        state.enabled = True
    torch.testing.assert_close(got, loaded, atol=1e-4, rtol=0)  # the gating-off function
    assert (got - gated).abs().max() > 1e-2


def test_a_sparse_decoder_step_of_no_tokens_is_refused(tmp_path):
    """It returned a (0, V) array: no next token's logits. ONNX Runtime's backends and llama.cpp's llama_decode
    ("n_tokens == 0") refuse an empty batch."""
    from edgesdk.runtime.sparse_decoder import SparseDecoder
    from tests._utils.tiny import export_tiny_sparse

    _, tensors, record = export_tiny_sparse(tmp_path, max_context=32)
    decoder = SparseDecoder(tensors, record, mode="reference")
    with pytest.raises(RuntimeBackendError, match="0 tokens") as caught:
        decoder.step(torch.zeros(0, dtype=torch.long), 1)
    assert "at least one token" in caught.value.fix
    assert decoder.position == 0
    assert decoder.step(torch.tensor([3, 4]), 1).shape == (1, 320)


def test_prefill_and_decode_leave_the_cache_and_counts_of_one_whole_pass(tmp_path):
    """At a threshold that skips some blocks: the KV cache after prefill + decode steps is that of one pass over
    the same tokens, and the blocks counted skipped are the decode steps' gates below tau."""
    model, state, info = _gated(tiny_llama(layers=3))
    spec = export_model(model, tmp_path, ExportConfig(form="ort-fused", weights="fp32", max_context=64))
    backend = OrtGatedBackend(tmp_path / "model.onnx", spec.to_json(), threads=1)
    ids = torch.randint(0, 320, (TOKENS,), generator=torch.Generator().manual_seed(3)).numpy()
    backend.gating, backend.fixed_tau = True, 0.5
    backend.prefill(ids[:PROMPT])
    gates = []
    for token in ids[PROMPT:]:
        backend.decode(int(token))
        gates.append(backend.last_gates[0].copy())
    stepped = [buffer[:, :, :TOKENS].copy() for buffer in backend._buffers]
    skipped = int((np.stack(gates) < np.float32(0.5)).sum())
    assert 0 < skipped < len(gates) * 3
    assert backend.stats()["blocks_skipped"] == skipped
    assert backend.stats()["blocks_total"] == len(gates) * 3
    backend.reset()
    assert backend.stats()["blocks_total"] == 0  # a new sequence counts afresh
    backend.prefill(ids)
    for got, want in zip(stepped, backend._buffers, strict=True):
        np.testing.assert_allclose(got, want[:, :, :TOKENS], atol=1e-5)
