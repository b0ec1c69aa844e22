"""Embeddings: every ONNX Runtime graph form gives the model's final-norm hidden states, pooled and normalised as
llama.cpp does, without touching the conversation in the KV cache."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgesdk.errors import RuntimeBackendError  # noqa: E402
from edgesdk.export.onnx_export import ExportConfig, export_model  # noqa: E402
from edgesdk.runtime.embedding import (  # noqa: E402
    EmbeddingConfig,
    EmbeddingError,
    embed_tokens,
    normalize,
    pool,
)
from edgesdk.runtime.ort_backend import OrtBackend  # noqa: E402
from edgesdk.runtime.ort_fused_backend import OrtFusedBackend  # noqa: E402
from edgesdk.runtime.ort_gated_backend import OrtGatedBackend  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402

IDS = np.array([5, 17, 99, 3, 250, 42, 7, 7, 130], np.int64)


def _reference_hidden(model, ids: np.ndarray) -> np.ndarray:
    """transformers' last hidden state (after the final norm) of ``ids`` (T, D)."""
    with torch.no_grad():
        out = model(torch.from_numpy(ids)[None], output_hidden_states=True)
    return out.hidden_states[-1][0].numpy()


def _exported(tmp_path, form: str, weights: str = "fp32"):
    model = tiny_llama(layers=2, heads=4, kv_heads=2)
    spec = export_model(model, tmp_path, ExportConfig(form=form, weights=weights, max_context=64))
    backend_class = OrtBackend if form == "standard" else OrtFusedBackend
    return model, backend_class(tmp_path / "model.onnx", spec.to_json(), threads=1), spec


@pytest.mark.parametrize("form", ["standard", "ort-fused"])
def test_hidden_states_equal_the_pytorch_models_final_norm_output(form, tmp_path):
    model, backend, spec = _exported(tmp_path, form)
    assert spec.to_json()["outputs"]["hidden"] == "hidden_states"
    got = backend.hidden_states(IDS)
    want = _reference_hidden(model, IDS)
    assert got.shape == want.shape == (len(IDS), model.config.hidden_size)
    np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.parametrize("form", ["standard", "ort-fused"])
def test_an_embedding_leaves_the_conversation_in_the_kv_cache_as_it_was(form, tmp_path):
    _, backend, _ = _exported(tmp_path, form)
    backend.prefill(IDS[:5])
    backend.hidden_states(IDS[::-1].copy())  # a longer sequence beside the cached one
    assert backend.position == 5
    continued = backend.decode(int(IDS[5]))
    backend.reset()
    backend.prefill(IDS[:5])
    np.testing.assert_array_equal(continued, backend.decode(int(IDS[5])))


def test_a_gated_graph_embeds_the_loaded_model_and_leaves_its_controller_alone(tmp_path):
    """Embeddings come from the function the bundle generates with by default, gating off: every FFN run and no
    adapter scale acting (at tau 0 the adapters' channel and head scales acted)."""
    from edgesdk.power.controller import ADAPTERS_OFF_TAU
    from tests.unit.test_power_export import _gated_model

    model, state, _ = _gated_model("llama-gqa")
    spec = export_model(model, tmp_path, ExportConfig(form="ort-fused", weights="fp32", max_context=64))
    backend = OrtGatedBackend(tmp_path / "model.onnx", spec.to_json(), threads=1)
    backend.gating, backend.fixed_tau = True, 1.01  # every FFN skipped while generating
    state.clear()
    state.enabled, state.tau = True, ADAPTERS_OFF_TAU  # the reference: gating off, the loaded model
    want = _reference_hidden(model, IDS)
    state.clear()
    before = backend.controller.summary()
    np.testing.assert_allclose(backend.hidden_states(IDS), want, atol=2e-5)
    assert backend.controller.summary() == before


def test_the_qdq_form_has_no_hidden_states_and_a_server_says_so_with_a_501(tmp_path, runtime):
    import onnx

    from edgesdk.export.decoder_weights import decoder_weights_from_hf
    from edgesdk.export.qdq_graph import QDQConfig, emit_qdq_decoder
    from edgesdk.runtime.embedding import hidden_states_problem
    from edgesdk.runtime.session import Runtime
    from edgesdk.serve.api import ApiError
    from edgesdk.serve.completion import Completer

    model = tiny_llama(layers=1, heads=4, kv_heads=2)
    onnx_model, spec = emit_qdq_decoder(decoder_weights_from_hf(model), 32, QDQConfig())
    onnx.save(onnx_model, str(tmp_path / "model.onnx"))
    backend = OrtBackend(tmp_path / "model.onnx", spec.to_json(), threads=1)
    assert "hidden" not in spec.to_json()["outputs"]
    assert not backend.gives_hidden_states
    assert hidden_states_problem(backend).cause == "graph"
    with pytest.raises(RuntimeBackendError, match="no 'hidden_states' output") as caught:
        backend.hidden_states(IDS)
    assert "rebuild" in caught.value.fix
    completer = Completer(Runtime(bundle=runtime.bundle, backend=backend, tokenizer=runtime.tokenizer))
    with pytest.raises(ApiError, match="no 'hidden_states' output") as refused:  # a 500 before
        completer.embed(["the board"], EmbeddingConfig())
    assert (refused.value.status, refused.value.code) == (501, "not_supported")
    assert "rebuild the bundle" in refused.value.message


def test_pooling_and_normalisation_follow_llama_cpp():
    hidden = np.array([[3.0, -4.0], [1.0, 1.0], [0.0, 2.0]], np.float32)  # (T, D)
    np.testing.assert_allclose(pool(hidden, "mean"), [4 / 3, -1 / 3], rtol=1e-6)
    np.testing.assert_array_equal(pool(hidden, "cls"), [3.0, -4.0])
    np.testing.assert_array_equal(pool(hidden, "last"), [0.0, 2.0])
    assert pool(hidden, "none").shape == (3, 2)
    vector = np.array([3.0, -4.0], np.float32)
    np.testing.assert_allclose(normalize(vector, 2), [0.6, -0.8], rtol=1e-6)  # euclidean
    np.testing.assert_allclose(normalize(vector, 1), [3 / 7, -4 / 7], rtol=1e-6)  # taxicab
    np.testing.assert_allclose(normalize(vector, 0), [3 * 32760 / 4, -32760], rtol=1e-6)  # int16 range
    np.testing.assert_allclose(normalize(vector, 3), vector / (27 + 64) ** (1 / 3), rtol=1e-6)
    np.testing.assert_array_equal(normalize(vector, -1), vector)
    np.testing.assert_array_equal(normalize(np.zeros(2, np.float32), 2), [0.0, 0.0])  # zeros stay zeros
    rows = normalize(hidden, 2)  # pooling none: each token's vector on its own
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, rtol=1e-6)


def test_embed_tokens_pools_normalises_counts_and_truncates_on_request(tmp_path):
    model, backend, _ = _exported(tmp_path, "ort-fused")
    want = _reference_hidden(model, IDS).mean(0)  # mean pooling: the default for a model that declares none
    got = embed_tokens(backend, IDS.tolist())
    np.testing.assert_allclose(got.vectors, want / np.linalg.norm(want), atol=1e-5)
    assert (got.tokens, got.truncated) == (len(IDS), False)
    long = list(range(1, 71))  # 70 tokens, the context holds 64
    with pytest.raises(EmbeddingError, match="maximum context length is 64 tokens. However, your input resulted in 70 tokens"):
        embed_tokens(backend, long)
    cut = embed_tokens(backend, long, EmbeddingConfig(pooling="mean", normalize=-1), truncate=True)
    assert (cut.tokens, cut.truncated) == (64, True)
    np.testing.assert_allclose(cut.vectors, _reference_hidden(model, np.array(long[:64])).mean(0), atol=1e-5)
    with pytest.raises(EmbeddingError, match="holds no tokens"):
        embed_tokens(backend, [])


@pytest.mark.parametrize(("setting", "value", "message"), [
    ("pooling", "max", "pooling 'max' is not one of last, mean, cls, none"),
    ("normalize", -2, "normalize -2 is not a whole number of at least -1"),
    ("normalize", True, "normalize True is not a whole number"),
])
def test_a_bad_embedding_setting_is_refused_by_name(setting, value, message):
    with pytest.raises(EmbeddingError, match=message):
        EmbeddingConfig(**{setting: value})


def test_the_sparse_decoder_gives_the_models_hidden_states_beside_its_cache(tmp_path, monkeypatch):
    """The ``triton`` backend's decoder (its kernels' PyTorch twins here) over block-sparse weights that hold the
    model's exactly: the hidden states are those its own prefill turns into logits, near transformers' (the twins
    round as the kernels do), and the cache it was decoding in stays."""
    from edgesdk.runtime.sparse_decoder import SparseDecoder
    from edgesdk.runtime.triton_backend import TritonBackend
    from tests._utils.tiny import export_tiny_sparse

    monkeypatch.setenv("EDGESDK_KERNELS", "reference")
    model, tensors, record = export_tiny_sparse(tmp_path, max_context=64)
    backend = TritonBackend(SparseDecoder(tensors, record), "reference")
    backend.prefill(IDS[:4])
    got = backend.hidden_states(IDS)
    np.testing.assert_allclose(got, _reference_hidden(model, IDS), atol=5e-3)
    assert backend.position == 4
    head = backend.decoder.lm_head.float().numpy()  # (V, D)
    fresh = TritonBackend(SparseDecoder(tensors, record), "reference")
    np.testing.assert_allclose(got @ head.T, fresh.prefill(IDS, keep_logits=len(IDS)), atol=1e-4)
    continued = backend.decode(int(IDS[4]))
    backend.reset()
    backend.prefill(IDS[:4])
    np.testing.assert_allclose(continued, backend.decode(int(IDS[4])), atol=1e-6)
    with pytest.raises(RuntimeBackendError, match="hidden states of 0 tokens"):
        backend.hidden_states(np.array([], np.int64))
