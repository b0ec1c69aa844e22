"""Reusing the previous answer's KV cache (edgesdk/runtime/prompt_cache.py): every backend rewinds to
the same logits as a fresh prefill, and generation with the cache gives the answers it gives without."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgesdk.errors import RuntimeBackendError  # noqa: E402
from edgesdk.export.onnx_export import ExportConfig, export_model  # noqa: E402
from edgesdk.runtime.generate import SamplingConfig, generate  # noqa: E402
from edgesdk.runtime.ort_backend import OrtBackend  # noqa: E402
from edgesdk.runtime.ort_fused_backend import OrtFusedBackend  # noqa: E402
from edgesdk.runtime.ort_gated_backend import OrtGatedBackend  # noqa: E402
from edgesdk.runtime.prompt_cache import PromptCache, common_prefix_length  # noqa: E402
from tests._utils.backends import NoRewind  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402

VOCAB = 320  # tiny_llama's


def _ids(seed: int, count: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, VOCAB, count)]


def _standard(tmp_path):
    spec = export_model(tiny_llama(heads=4, kv_heads=2), tmp_path, ExportConfig(form="standard", max_context=128))
    return OrtBackend(tmp_path / "model.onnx", spec.to_json(), threads=1)


def _fused(tmp_path):
    spec = export_model(tiny_llama(heads=4, kv_heads=2), tmp_path, ExportConfig(form="ort-fused", max_context=512))
    return OrtFusedBackend(tmp_path / "model.onnx", spec.to_json(), threads=1)


def _gated(tmp_path):
    from tests.unit.test_power_export import _gated_model

    model, _, _ = _gated_model("llama-gqa")
    spec = export_model(model, tmp_path, ExportConfig(form="ort-fused", max_context=128))
    return OrtGatedBackend(tmp_path / "model.onnx", spec.to_json(), threads=1)


def _triton_twins(tmp_path):
    from edgesdk.runtime.sparse_decoder import SparseDecoder
    from edgesdk.runtime.triton_backend import TritonBackend
    from tests._utils.tiny import export_tiny_sparse

    _, tensors, record = export_tiny_sparse(tmp_path, max_context=128)
    return TritonBackend(SparseDecoder(tensors, record, mode="reference"), "reference")


BACKENDS = {"standard": _standard, "ort-fused": _fused, "gated": _gated, "triton-reference": _triton_twins}


@pytest.fixture(scope="module", params=sorted(BACKENDS))
def backend(request, tmp_path_factory):
    return BACKENDS[request.param](tmp_path_factory.mktemp(request.param))


def test_common_prefix_length():
    assert common_prefix_length([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_length([1, 2], [1, 2, 3]) == 2
    assert common_prefix_length([], [1]) == 0
    assert common_prefix_length([7], [8]) == 0


def test_rewound_cache_continues_as_a_fresh_prefill(backend):
    """Prefill and decode one sequence, rewind into its prompt, prefill another continuation: the logits
    equal one prefill of that whole sequence."""
    first, second = _ids(1, 40), _ids(2, 30)
    backend.reset()
    backend.prefill(np.array(first))
    for token in _ids(3, 5):
        backend.decode(token)
    backend.rewind(25)
    assert backend.position == 25
    continued = backend.prefill(np.array(second), keep_logits=len(second))
    steps = np.stack([backend.decode(token) for token in _ids(4, 6)])
    backend.reset()
    whole = backend.prefill(np.array(first[:25] + second + _ids(4, 6)), keep_logits=len(second) + 6)
    np.testing.assert_allclose(continued, whole[: len(second)], atol=2e-4)
    np.testing.assert_allclose(steps, whole[len(second):], atol=2e-4)
    backend.rewind(0)
    assert backend.position == 0


@pytest.mark.parametrize("length", [-1, 11])
def test_rewinding_outside_the_cache_is_refused(backend, length):
    backend.reset()
    backend.prefill(np.array(_ids(5, 10)))
    with pytest.raises(RuntimeBackendError, match=f"rewind the KV cache to {length} tokens: it holds 10"):
        backend.rewind(length)
    assert backend.position == 10


def _answer(backend, prompt, cache=None, max_new_tokens=8, **kwargs):
    return generate(backend, prompt, SamplingConfig(max_new_tokens=max_new_tokens), stop_ids=set(), cache=cache,
                    **kwargs)


def test_a_conversation_reuses_what_the_cache_holds_and_answers_as_without_it(backend):
    """Turn two repeats turn one's prompt and answer: only what follows is prefilled, and every answer
    equals the one generated from an empty cache."""
    cache = PromptCache(backend)
    prompt = _ids(6, 20)
    answer, stats = _answer(backend, prompt, cache)
    assert stats.cached_tokens == 0
    # The last new token was sampled but never fed: the cache holds the prompt and all but it.
    assert cache.tokens == prompt + answer[:-1]
    assert backend.position == len(cache.tokens)
    follow_up = prompt + answer + _ids(7, 9)
    reused, stats = _answer(backend, follow_up, cache)
    assert stats.cached_tokens == len(prompt) + len(answer) - 1
    assert stats.prompt_tokens == len(follow_up)
    assert reused == _answer(backend, follow_up)[0]
    assert stats.to_json()["cached_tokens"] == stats.cached_tokens


def test_the_same_prompt_again_prefills_only_its_last_token(backend):
    cache = PromptCache(backend)
    prompt = _ids(8, 16)
    first, _ = _answer(backend, prompt, cache)
    again, stats = _answer(backend, prompt, cache)
    assert stats.cached_tokens == len(prompt) - 1  # its logits give the first new token
    assert again == first


def test_no_reuse_when_asked_or_when_the_backend_was_driven_past_the_cache(backend):
    cache = PromptCache(backend)
    prompt = _ids(9, 16)
    expected, _ = _answer(backend, prompt, cache)
    _, stats = _answer(backend, prompt, cache, reuse_cache=False)
    assert stats.cached_tokens == 0
    backend.decode(3)  # a step the cache did not see: its record no longer matches the backend
    answer, stats = _answer(backend, prompt, cache)
    assert stats.cached_tokens == 0
    assert answer == expected


def test_an_answer_cut_short_leaves_the_cache_consistent(backend):
    """A token callback that raises (a stop string, a client gone) ends the answer between steps: the
    cache still lists exactly what the backend holds, so the next turn reuses it correctly."""
    cache = PromptCache(backend)
    prompt = _ids(10, 12)
    seen = []

    def stop_after_three(token):
        seen.append(token)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _answer(backend, prompt, cache, on_token=stop_after_three)
    assert cache.tokens == prompt + seen[:2]
    assert backend.position == len(cache.tokens)
    follow_up = prompt + seen + _ids(11, 4)
    answer, stats = _answer(backend, follow_up, cache)
    assert stats.cached_tokens == len(prompt) + 2
    assert answer == _answer(backend, follow_up)[0]



def test_a_backend_that_cannot_rewind_prefills_every_prompt_whole(tmp_path):
    backend = NoRewind(_fused(tmp_path))
    cache = PromptCache(backend)
    assert not cache.supported
    prompt = _ids(12, 10)
    first, _ = _answer(backend, prompt, cache)
    again, stats = _answer(backend, prompt, cache)
    assert stats.cached_tokens == 0
    assert again == first


def test_a_gated_backend_starts_its_controller_over_on_rewind(tmp_path):
    backend = _gated(tmp_path)
    backend.prefill(np.array(_ids(13, 8)))
    for token in _ids(14, 4):
        backend.decode(token)
    assert backend.stats()["blocks_total"] > 0
    backend.rewind(8)
    assert backend.stats()["blocks_total"] == 0
