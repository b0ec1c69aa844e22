"""The ONNX Runtime backends at their edges: a prefill of no tokens."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from edgesdk.errors import RuntimeBackendError  # noqa: E402


@pytest.fixture(scope="module", params=["standard", "ort-fused"])
def backend(request, tmp_path_factory):
    from edgesdk.export.onnx_export import ExportConfig, export_model
    from edgesdk.runtime.ort_backend import OrtBackend
    from edgesdk.runtime.ort_fused_backend import OrtFusedBackend
    from tests._utils.tiny import tiny_llama

    folder = tmp_path_factory.mktemp(request.param)
    spec = export_model(tiny_llama(), folder, ExportConfig(form=request.param, max_context=64))
    opener = OrtBackend if request.param == "standard" else OrtFusedBackend
    return opener(folder / "model.onnx", spec.to_json(), threads=1)


@pytest.mark.parametrize("held", [0, 6])
def test_a_prefill_of_no_tokens_is_named_and_leaves_the_cache_as_it_was(backend, held):
    """An empty prefill was onnxruntime's RuntimeError from inside the graph (a Reshape of the standard form,
    GroupQueryAttention of the fused one), naming neither the call nor what to pass."""
    ids = np.random.default_rng(3).integers(0, 320, 8)
    backend.reset()
    whole = backend.prefill(ids, keep_logits=2)
    backend.rewind(held)
    with pytest.raises(RuntimeBackendError, match="prefill of 0 tokens") as caught:
        backend.prefill(np.array([], np.int64))
    assert "at least one token id" in caught.value.fix
    assert backend.position == held
    backend.rewind(0)
    np.testing.assert_allclose(backend.prefill(ids, keep_logits=2), whole, atol=1e-5)
