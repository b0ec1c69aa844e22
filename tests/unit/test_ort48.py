"""Runtime backends (edgesdk/runtime/triton_backend.py, ort_backend.py) on real tiny models: an empty list of token
ids is refused as 0 tokens by every backend alike."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import RuntimeBackendError

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def triton_backend(tmp_path_factory):
    """The triton backend on the kernels' PyTorch twins (the CPU path ``EDGESDK_KERNELS=reference`` opens)."""
    from edgesdk.runtime.sparse_decoder import SparseDecoder
    from edgesdk.runtime.triton_backend import TritonBackend
    from tests._utils.tiny import export_tiny_sparse

    _, tensors, record = export_tiny_sparse(tmp_path_factory.mktemp("sparse48"), max_context=16)
    return TritonBackend(SparseDecoder(tensors, record, mode="reference"), "reference")


@pytest.fixture(scope="module")
def ort_backend(tmp_path_factory):
    from edgesdk.export.onnx_export import ExportConfig, export_model
    from edgesdk.runtime.ort_backend import OrtBackend
    from tests._utils.tiny import tiny_llama

    out = tmp_path_factory.mktemp("standard48")
    spec = export_model(tiny_llama(heads=4, kv_heads=2), out, ExportConfig(form="standard", max_context=16))
    return OrtBackend(out / "model.onnx", spec.to_json(), threads=1)


@pytest.mark.parametrize("which", ["triton", "ort"])
def test_an_empty_list_of_ids_is_refused_as_0_tokens_by_every_backend(which, triton_backend, ort_backend):
    """numpy reads ``[]`` as float64: the triton backend checked the dtype first and refused a prefill of ``[]`` as
    "token ids of dtype float64 ([]): expected whole numbers", where the ONNX Runtime backends say "prefill of 0
    tokens" (llama.cpp's llama_decode: "n_tokens == 0"). The cache is left as it was."""
    backend = triton_backend if which == "triton" else ort_backend
    backend.reset()
    backend.prefill(np.array([3, 4]))
    with pytest.raises(RuntimeBackendError, match=r"^prefill of 0 tokens: there is no position") as caught:
        backend.prefill([])
    assert "at least one token id" in caught.value.fix
    with pytest.raises(RuntimeBackendError, match=r"^hidden states of 0 tokens"):
        backend.hidden_states([])
    assert backend.position == 2
    assert backend.decode(5).shape == (backend.vocab_size,)
