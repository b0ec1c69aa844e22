"""The host-memory KV cache store at its edges (edgesdk/runtime/cache_store.py, prompt_cache.py): a budget
that holds one conversation, and what the store keeps when caches contain each other."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")


@pytest.fixture(scope="module", params=["standard", "ort-fused", "gated", "triton-reference"])
def backend(request, tmp_path_factory):
    from tests.unit.test_prompt_cache import BACKENDS

    return BACKENDS[request.param](tmp_path_factory.mktemp(request.param))


def _ids(seed: int, count: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 320, count)]


def _answer(backend, prompt, cache=None, **kwargs):
    from edgesdk.runtime.generate import SamplingConfig, generate

    return generate(backend, prompt, SamplingConfig(max_new_tokens=6), stop_ids=set(), cache=cache, **kwargs)


@pytest.mark.parametrize(("kv_heads", "cut"), [(2, 0), (1, 0), (1, 5)])
def test_a_loaded_standard_cache_outlives_the_saved_copy_it_came_from(tmp_path, kv_heads, cut):
    """The standard form wraps a loaded state's arrays without copying them. Rewound to its whole length
    (a prompt that continues it), or with one KV head (where a shorter slice is contiguous too), the
    cache was rebuilt on views that did not keep those arrays alive: once the store let go of them
    (evicted), the next prefill read freed memory (NaN logits, or another cache's keys)."""
    import gc

    from edgesdk.export.onnx_export import ExportConfig, export_model
    from edgesdk.runtime.ort_backend import OrtBackend
    from tests._utils.tiny import tiny_llama

    spec = export_model(tiny_llama(heads=4, kv_heads=kv_heads), tmp_path,
                        ExportConfig(form="standard", max_context=128))
    backend = OrtBackend(tmp_path / "model.onnx", spec.to_json(), threads=1)
    ids, tail = _ids(40, 70), _ids(41, 4)
    backend.prefill(np.array(ids))
    state, _ = backend.save_cache()
    backend.reset()
    backend.load_cache(state)
    backend.rewind(len(ids) - cut)
    del state
    gc.collect()
    junk = [np.full((1, kv_heads, len(ids), 16), np.nan, np.float32) for _ in range(64)]  # reuses freed memory
    continued = backend.prefill(np.array(ids[len(ids) - cut:] + tail), keep_logits=len(tail))
    del junk
    backend.reset()
    whole = backend.prefill(np.array(ids + tail), keep_logits=len(tail))
    np.testing.assert_allclose(continued, whole, atol=2e-4)
