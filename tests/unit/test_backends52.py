"""ONNX Runtime and TensorRT backends, review 52 (edgesdk/runtime/backend.py, ort_backend.py, ort_fused_backend.py,
tensorrt_backend.py), on real tiny models."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import RuntimeBackendError
from edgesdk.runtime.backend import prefill_passes

pytest.importorskip("torch")

MAX_CONTEXT = 32


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """{form: (model path, graph spec)} of one tiny model in the standard and the fused graph form."""
    from edgesdk.export.onnx_export import ExportConfig, export_model
    from tests._utils.tiny import tiny_llama

    model = tiny_llama(hidden=64, heads=4, kv_heads=2)
    forms = {}
    for form in ("standard", "ort-fused"):
        out = tmp_path_factory.mktemp(form)
        spec = export_model(model, out, ExportConfig(form=form, weights="fp32", max_context=MAX_CONTEXT))
        forms[form] = (out / "model.onnx", spec.to_json())
    return forms


def open_backend(exported, form: str):
    from edgesdk.runtime.ort_backend import OrtBackend
    from edgesdk.runtime.ort_fused_backend import OrtFusedBackend

    path, graph = exported[form]
    return {"standard": OrtBackend, "ort-fused": OrtFusedBackend}[form](path, graph, threads=1)


def count_passes(backend) -> list[int]:
    """The tokens of each pass the backend runs from now on (its ``_run`` wrapped, still running)."""
    passes = []
    run = backend._run

    def counted(ids, keep):
        passes.append(int(ids.shape[1]))
        return run(ids, keep)

    backend._run = counted
    return passes


def test_prefill_passes_cover_the_prompt_and_keep_the_rows_asked_for():
    """Eleven tokens in passes of four, the logits of the last six kept: three passes, the first keeping none."""
    assert prefill_passes(11, 6, 4) == [(0, 4, 0), (4, 8, 3), (8, 11, 3)]
    assert prefill_passes(11, 1, 4) == [(0, 4, 0), (4, 8, 0), (8, 11, 1)]
    assert prefill_passes(8, 8, 4) == [(0, 4, 4), (4, 8, 4)]
    assert prefill_passes(3, 1, 4) == [(0, 3, 1)]
    for bad in (0, -2, 2.5, True):
        with pytest.raises(RuntimeBackendError, match=rf"a prefill pass of at most {bad!r} tokens: expected a whole"):
            prefill_passes(11, 1, bad)


@pytest.mark.parametrize("form", ["standard", "ort-fused"])
@pytest.mark.parametrize("keep", [1, 6, 11])
def test_a_prompt_longer_than_max_prefill_runs_in_passes_with_the_logits_of_one_pass(exported, form, keep):
    """The ONNX Runtime backends ran every prompt in one pass, so the ort-trt profile had to hold max_context input
    ids (session.ort_trt_options), as the tensorrt backend's did not: it runs a longer prompt in passes of its
    profile's max seq. With ``max_prefill`` they run it in passes of that many, each after the ones before in the
    KV cache, with the logits (and the cache) of one pass."""
    whole, chunked = open_backend(exported, form), open_backend(exported, form)
    chunked.max_prefill = 4
    passes = count_passes(chunked)
    prompt = np.arange(3, 14, dtype=np.int64)  # 11 tokens: passes of 4, 4 and 3
    expected = whole.prefill(prompt, keep_logits=keep)
    got = chunked.prefill(prompt, keep_logits=keep)
    assert passes == [4, 4, 3]
    assert got.shape == expected.shape == (keep, whole.vocab_size)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    assert chunked.position == whole.position == len(prompt)
    for token in (5, 9):
        np.testing.assert_allclose(chunked.decode(token), whole.decode(token), rtol=0, atol=1e-5)
    assert passes == [4, 4, 3, 1, 1]  # a decode step is one pass of one token


@pytest.mark.parametrize("form", ["standard", "ort-fused"])
def test_a_chunked_prompt_past_the_context_is_refused_before_its_first_pass(exported, form):
    """A prompt that overflows the context is refused whole, the cache left as it was, not after the passes that
    fit have filled it."""
    backend = open_backend(exported, form)
    backend.max_prefill = 4
    reference = open_backend(exported, form)
    for opened in (backend, reference):
        opened.prefill(np.arange(3, 3 + MAX_CONTEXT - 6))
    with pytest.raises(RuntimeBackendError, match=rf"sequence of {MAX_CONTEXT + 4} tokens exceeds the bundle's "
                                                  rf"max_context {MAX_CONTEXT}"):
        backend.prefill(np.arange(40, 50))
    assert backend.position == MAX_CONTEXT - 6
    np.testing.assert_allclose(backend.decode(7), reference.decode(7), rtol=0, atol=1e-5)
