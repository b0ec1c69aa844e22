"""The Triton backend refuses a KV cache state that does not fit before its cache changes, as the ONNX Runtime
backends do (llama.cpp's ``state_read_data``): a state of another bundle, too long or of another dtype failed inside
torch's copy with the cache left at position 0. Run through the decoder's reference twin on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import RuntimeBackendError
from tests.unit.test_gpu_runtime46 import triton_backend  # noqa: F401 (a fixture)

torch = pytest.importorskip("torch")


def _cases(state):
    too_long = [torch.zeros(1, t.shape[1], 10_000, t.shape[3], dtype=t.dtype) for t in state]
    other_heads = [torch.zeros(1, t.shape[1] + 1, t.shape[2], t.shape[3], dtype=t.dtype) for t in state]
    other_dtype = [t.to(torch.float64) for t in state]
    uneven = [t if i else t[:, :, :-1] for i, t in enumerate(state)]
    return {"too long": (too_long, "max_context"), "other heads": (other_heads, "expected"),
            "other dtype": (other_dtype, "expected"), "a layer missing": (state[:-2], "KV cache has"),
            "uneven": (uneven, "expected")}


def test_a_state_that_does_not_fit_is_refused_and_the_cache_kept(triton_backend):  # noqa: F811
    backend = triton_backend
    backend.reset()
    backend.prefill(np.array([3, 5, 7, 9]), keep_logits=1)
    state, _ = backend.save_cache()
    after = backend.prefill(np.array([11]), keep_logits=1)
    for name, (bad, said) in _cases(state).items():
        backend.load_cache(state)
        with pytest.raises(RuntimeBackendError) as refused:
            backend.load_cache(bad)
        assert said in refused.value.problem, name
        assert backend.position == 4, name  # the cache as it was
        np.testing.assert_array_equal(backend.prefill(np.array([11]), keep_logits=1), after)
