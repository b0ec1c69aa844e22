"""Runtime backends (edgesdk/runtime/ort_backend.py, ort_fused_backend.py, triton_backend.py, backend.py) on real tiny
models: a decode step takes exactly one token id (a one-element array is that id), and the Triton backend's rewind
takes whole numbers only, as the ONNX Runtime backends' does."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import RuntimeBackendError

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def model():
    from tests._utils.tiny import on_sparse_grid, tiny_llama

    return on_sparse_grid(tiny_llama(hidden=64, heads=4, kv_heads=2))


@pytest.fixture(scope="module")
def backends(model, tmp_path_factory):
    return open_backends(model, tmp_path_factory)


def open_backends(model, tmp_path_factory) -> dict:
    """{name: backend} of the same tiny model: the standard and fused ONNX graphs on onnxruntime's CPU provider, and
    the block-sparse weights on the kernels' PyTorch twins (the triton backend's CPU path)."""
    from safetensors.torch import load_file

    from edgesdk.export.onnx_export import ExportConfig, export_model
    from edgesdk.export.sparse_export import SparseExportConfig, export_sparse
    from edgesdk.runtime.ort_backend import OrtBackend
    from edgesdk.runtime.ort_fused_backend import OrtFusedBackend
    from edgesdk.runtime.sparse_decoder import SparseDecoder
    from edgesdk.runtime.triton_backend import TritonBackend

    opened = {}
    for form, backend_class in (("standard", OrtBackend), ("ort-fused", OrtFusedBackend)):
        out = tmp_path_factory.mktemp(form)
        spec = export_model(model, out, ExportConfig(form=form, weights="fp32", max_context=32))
        opened[form] = backend_class(out / "model.onnx", spec.to_json(), threads=1)
    out = tmp_path_factory.mktemp("sparse")
    record = export_sparse(model, out, SparseExportConfig(), max_context=32)
    opened["triton"] = TritonBackend(SparseDecoder(load_file(str(out / record["weights"])), record, mode="reference"),
                                     "reference")
    return opened


@pytest.mark.parametrize("name", ["standard", "ort-fused", "triton"])
def test_decode_of_the_argmax_of_a_prefills_logits_is_that_token(backends, name):
    """``prefill`` returns (rows, vocab), so ``logits.argmax(-1)`` is a (1,) array, the next token. The ONNX Runtime
    backends fed it as (1, 1, 1) ids: onnxruntime's "Invalid rank for input: input_ids" (the fused graph's first
    decode step too). It is that token, as the same id given as an int."""
    backend = backends[name]
    backend.reset()
    token = backend.prefill(np.array([3, 4, 5])).argmax(-1)
    assert token.shape == (1,)
    backend.decode(int(token[0]))
    want = backend.decode(7)
    backend.reset()
    backend.prefill(np.array([3, 4, 5]))
    backend.decode(token)  # the (1,) array
    assert backend.position == 4
    np.testing.assert_allclose(backend.decode(np.array([7])), want, rtol=0, atol=1e-6)
    assert backend.position == 5


@pytest.mark.parametrize("name", ["standard", "ort-fused", "triton"])
@pytest.mark.parametrize("given", [[7, 8], np.array([7, 8]), np.array([[7, 8]]), []])
def test_a_decode_step_of_several_ids_or_none_is_refused_by_name(backends, name, given):
    """A decode step appends one token. Two ids were numpy's "truth value of an array with more than one element is
    ambiguous" in the ONNX Runtime backends, and the Triton backend ran them as one step, returning the last one's
    logits as if one token had been decoded. The cache is left as it was."""
    backend = backends[name]
    backend.reset()
    backend.prefill(np.array([3, 4]))
    count = np.asarray(given).size
    with pytest.raises(RuntimeBackendError, match=rf"^decode of {count} token ids \(shape .*\): expected one") \
            as caught:
        backend.decode(given)
    assert "one token id per decode step" in caught.value.fix
    assert "prefill" in caught.value.fix
    assert backend.position == 2
    assert backend.decode(5).shape == (backend.vocab_size,)


@pytest.mark.parametrize("name", ["standard", "ort-fused", "triton"])
def test_a_decode_id_outside_the_vocabulary_is_still_refused(backends, name):
    backend = backends[name]
    backend.reset()
    backend.prefill(np.array([3]))
    for given in (backend.vocab_size, np.array([-1])):
        with pytest.raises(RuntimeBackendError, match=r"^decode with token id -?\d+ at position 0: expected an id"):
            backend.decode(given)
    assert backend.position == 1


@pytest.mark.parametrize("length", [1.0, 2.5, True, "2", None])
def test_the_triton_backend_refuses_a_rewind_to_no_whole_number_as_the_ort_backends_do(backends, length):
    """The ONNX Runtime backends refuse ``rewind(2.5)`` by name; the Triton backend made 2.5 (or True) its decoder's
    position, and the next step failed in torch's words (or, for True, ran on from position True)."""
    for name in ("standard", "triton"):
        backend = backends[name]
        backend.reset()
        backend.prefill(np.array([3, 4, 5, 6]))
        with pytest.raises(RuntimeBackendError, match=r"^cannot rewind the KV cache to .* tokens: expected a whole "
                                                      r"number") as caught:
            backend.rewind(length)
        assert "whole number of tokens" in caught.value.fix
        assert backend.position == 4
        assert type(backend.position) is int
    backend = backends["triton"]
    with pytest.raises(RuntimeBackendError, match=r"^cannot rewind the KV cache to 5 tokens: it holds 4"):
        backend.rewind(5)
    backend.rewind(np.int64(2))
    assert backend.position == 2
    assert type(backend.position) is int
