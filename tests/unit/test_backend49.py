"""ONNX Runtime backends (edgesdk/runtime/ort_backend.py, ort_fused_backend.py) on real tiny graphs: a KV cache
state that does not fit the backend is refused by name before the cache changes (llama.cpp's
``llama_kv_cache::state_read_data``: "mismatched layer count", "mismatched key row size", "not enough cells in kv
cache to restore state"), and a rewind length that is no whole number is refused."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import RuntimeBackendError

pytest.importorskip("torch")

MAX_CONTEXT = 16


@pytest.fixture(scope="module", params=["standard", "ort-fused"])
def backend(request, tmp_path_factory):
    from edgesdk.export.onnx_export import ExportConfig, export_model
    from edgesdk.runtime.ort_backend import OrtBackend
    from edgesdk.runtime.ort_fused_backend import OrtFusedBackend
    from tests._utils.tiny import tiny_llama

    out = tmp_path_factory.mktemp("backend49")
    spec = export_model(tiny_llama(heads=4, kv_heads=2), out,
                        ExportConfig(form=request.param, max_context=MAX_CONTEXT))
    cls = OrtBackend if request.param == "standard" else OrtFusedBackend
    return cls(out / "model.onnx", spec.to_json(), threads=1)


def _state(backend, length: int, dtype=np.float32, heads=None) -> list[np.ndarray]:
    return [np.zeros((1, heads or kv, length, backend.head_dim), dtype) for kv in backend.kv_heads for _ in range(2)]


@pytest.mark.parametrize(("case", "message"), [
    ("longer than max_context", r"^load_cache of 20 tokens: the bundle's max_context is 16"),
    ("other kv heads", r"^load_cache array 0 \(layer 0 key\) is float32 \(1, 4, 5, 16\): expected float32 "
                       r"\(1, 2, tokens, 16\)"),
    ("a layer short", r"^load_cache of 3 arrays: this backend's KV cache has 4"),
    ("float16", r"^load_cache array 0 \(layer 0 key\) is float16"),
    ("lengths differ", r"^load_cache array 3 \(layer 1 value\) is float32 \(1, 2, 4, 16\): expected float32 "
                       r"\(1, 2, 5, 16\)"),
])
def test_a_cache_state_that_does_not_fit_is_refused_and_the_cache_kept(backend, case, message):
    """The standard backend took every such state (a 20-token cache in a 16-token context among them) and failed in
    the next step with an onnxruntime error, its cache broken until a reset; the fused one raised numpy's broadcast
    error or cast a float16 state silently."""
    state = {"longer than max_context": _state(backend, 20),
             "other kv heads": _state(backend, 5, heads=4),
             "a layer short": _state(backend, 5)[:-1],
             "float16": _state(backend, 5, np.float16),
             "lengths differ": _state(backend, 5)[:-1] + _state(backend, 4)[-1:]}[case]
    backend.reset()
    ids = np.arange(3, 9)
    expected = backend.prefill(ids)
    backend.rewind(5)
    with pytest.raises(RuntimeBackendError, match=message) as caught:
        backend.load_cache(state)
    assert "save_cache" in caught.value.fix
    assert backend.position == 5
    np.testing.assert_allclose(backend.prefill(ids[5:]), expected, atol=1e-5)  # the cache is as it was


def test_a_state_that_fits_still_loads_bit_for_bit(backend):
    backend.reset()
    ids = np.arange(3, 3 + MAX_CONTEXT)
    whole = backend.prefill(ids, MAX_CONTEXT)
    backend.rewind(10)
    state, nbytes = backend.save_cache()
    backend.reset()
    backend.prefill(ids[:2])
    backend.load_cache(tuple(state))
    assert backend.position == 10
    assert nbytes == sum(array.nbytes for array in state)
    again, _ = backend.save_cache()
    assert all(np.array_equal(a, b) for a, b in zip(state, again, strict=True))
    np.testing.assert_allclose(backend.prefill(ids[10:], 6), whole[10:], atol=1e-5)


@pytest.mark.parametrize("length", [2.5, True, "3"])
def test_a_rewind_length_that_is_no_whole_number_is_refused(backend, length):
    """The fused backend took 2.5 as its position (its next steps fed onnxruntime truncated lengths and its
    save_cache failed); the standard one raised a TypeError from a slice."""
    backend.reset()
    backend.prefill(np.arange(3, 9))
    with pytest.raises(RuntimeBackendError, match=r"^cannot rewind the KV cache to .* tokens: expected a whole "):
        backend.rewind(length)
    assert backend.position == 6
    assert type(backend.position) is int
    backend.rewind(np.int64(4))
    assert backend.position == 4
    assert type(backend.position) is int


@pytest.mark.parametrize("bad", [2**64 - 1, 2**63])
def test_a_uint64_id_past_int64_is_named_as_given_not_wrapped(backend, bad):
    """The ids were cast to int64 before the range check, which wraps a uint64 id of 2**63 or more: 2**64 - 1 was
    refused as "token id -1"."""
    backend.reset()
    with pytest.raises(RuntimeBackendError, match=rf"^prefill with token id {bad} at position 1: expected an id "):
        backend.prefill(np.array([5, bad], np.uint64))
    assert backend.position == 0
    assert backend.prefill(np.array([5, 6], np.uint64)).shape == (1, backend.vocab_size)
