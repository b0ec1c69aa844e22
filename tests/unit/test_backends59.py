"""The ONNX Runtime backends, review 59 (edgesdk/runtime/ort_backend.py, ort_fused_backend.py): a thread count past
what a session can take, a backend that fails while it is built giving its session back, and the two graph forms
following each other greedily through the KV cache's edges."""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("torch")

from edgesdk.errors import RuntimeBackendError  # noqa: E402
from edgesdk.runtime.ort_backend import MAX_THREADS, ClosedSession, OrtBackend, make_session_options  # noqa: E402
from edgesdk.runtime.ort_fused_backend import INITIAL_CAPACITY, OrtFusedBackend  # noqa: E402

VOCAB = 320  # tiny_llama's
MAX_CONTEXT = INITIAL_CAPACITY + 24  # the fused form's KV buffers grow once on the way
FORMS = {"standard": OrtBackend, "ort-fused": OrtFusedBackend}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """One tiny model in both graph forms: form -> (model path, graph facts)."""
    from edgesdk.export.onnx_export import ExportConfig, export_model
    from tests._utils.tiny import tiny_llama

    model = tiny_llama(hidden=64, heads=4, kv_heads=2)
    graphs = {}
    for form in FORMS:
        out = tmp_path_factory.mktemp(form)
        spec = export_model(model, out, ExportConfig(form=form, weights="fp32", max_context=MAX_CONTEXT))
        graphs[form] = (out / "model.onnx", spec.to_json())
    return graphs


def _frames_self(error: BaseException, kind: type) -> list:
    """The backends of class ``kind`` that the frames of ``error``'s traceback hold as ``self``."""
    found, tb = [], error.__traceback__
    while tb is not None:
        candidate = tb.tb_frame.f_locals.get("self")
        if isinstance(candidate, kind):
            found.append(candidate)
        tb = tb.tb_next
    return found


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("threads", [MAX_THREADS + 1, 2**31, np.int64(2**40)])
def test_a_thread_count_past_what_a_session_takes_is_refused_by_name(exported, form, threads):
    """Past 2**31 - 1 pybind11 refused the value ("incompatible function arguments"), reported as a bundle ONNX
    Runtime could not load, with 'edgesdk verify' as the fix; a count from 513 up started that many threads, a
    spinning pool far past any board's cores. llama.cpp refuses a count past GGML_MAX_N_THREADS (512)."""
    expected = f"threads={threads!r}: expected a whole number of intra-op threads of at least 1 and at most {MAX_THREADS}"
    with pytest.raises(RuntimeBackendError, match="^" + re.escape(expected)) as caught:
        FORMS[form](*exported[form], threads=threads)
    assert "could not load" not in str(caught.value)
    assert "verify" not in caught.value.fix


def test_the_largest_thread_count_is_set_as_given():
    assert make_session_options(MAX_THREADS).intra_op_num_threads == MAX_THREADS  # no session: no threads started
    assert make_session_options(np.int16(3)).intra_op_num_threads == 3


def test_a_fused_backend_whose_kv_buffers_do_not_fit_gives_its_session_back(exported):
    """The fused form allocates its first KV buffers after the session opened: where they did not fit (graph facts
    of a KV cache larger than memory), the MemoryError's traceback held the half-built backend and its session (the
    model's weights) for as long as it was kept (session.py chains it into a BundleError)."""
    path, graph = exported["ort-fused"]
    huge = {**graph, "kv_heads": [10**12] * len(graph["kv_heads"])}  # 10**12 heads x 256 x 16 floats a buffer
    with pytest.raises(MemoryError) as caught:
        OrtFusedBackend(path, huge, threads=1)
    backends = _frames_self(caught.value, OrtFusedBackend)
    assert backends
    assert all(isinstance(backend.session, ClosedSession) for backend in backends)


@pytest.mark.parametrize("form", FORMS)
def test_graph_facts_that_cannot_be_read_fail_before_a_session_opens(exported, form):
    """kv_heads, head_dim and vocab_size were read after the session opened: a fact that is no number left the
    session on the half-built backend in the error's traceback."""
    path, graph = exported[form]
    with pytest.raises(ValueError, match="invalid literal") as caught:
        FORMS[form](path, {**graph, "head_dim": "sixteen"}, threads=1)
    backends = _frames_self(caught.value, FORMS[form])
    assert backends
    assert not any("session" in vars(backend) for backend in backends)  # none was opened


def _greedy(backend, prompt: np.ndarray, steps: int) -> tuple[list[int], np.ndarray]:
    """Greedy tokens after ``prompt`` and every step's logits (steps + 1, vocab)."""
    logits = [backend.prefill(prompt)[0]]
    tokens = []
    for _ in range(steps):
        tokens.append(int(np.argmax(logits[-1])))
        logits.append(backend.decode(tokens[-1]))
    return tokens, np.stack(logits)


def test_both_forms_follow_each_other_through_growth_rewinds_and_the_context_end(exported):
    """Greedy decoding across the fused buffers' growth past INITIAL_CAPACITY, a rewind to the current length (no
    change), one into the prompt, one to 0 and a prefill of exactly max_context tokens gives the same tokens and
    logits within 1e-4 in both graph forms; the step after max_context is refused by name in both."""
    prompt = np.random.default_rng(59).integers(3, VOCAB, INITIAL_CAPACITY - 6)
    runs = {}
    for form, kind in FORMS.items():
        backend = kind(*exported[form], threads=1)
        tokens, logits = _greedy(backend, prompt, 12)  # the cache passes INITIAL_CAPACITY
        backend.rewind(backend.position)
        assert backend.position == len(prompt) + 12
        more, after = _greedy(backend, np.array([7]), 3)
        backend.rewind(40)
        resumed, again = _greedy(backend, prompt[40:50], 4)
        backend.rewind(0)
        assert backend.position == 0
        whole = backend.prefill(np.resize(prompt, MAX_CONTEXT), keep_logits=3)
        assert backend.position == MAX_CONTEXT
        with pytest.raises(RuntimeBackendError, match=rf"sequence of {MAX_CONTEXT + 1} tokens exceeds the bundle's "
                                                      rf"max_context {MAX_CONTEXT}"):
            backend.decode(5)
        assert backend.position == MAX_CONTEXT
        runs[form] = (tokens + more + resumed, np.concatenate([logits, after, again, whole]))
        backend.close()
        backend.close()  # a second close does nothing
        with pytest.raises(RuntimeBackendError, match=r"^decode on the closed ort-cpu backend"):
            backend.decode(5)
    (standard_tokens, standard_logits), (fused_tokens, fused_logits) = runs["standard"], runs["ort-fused"]
    assert standard_tokens == fused_tokens
    assert len(set(standard_tokens)) > 1
    scale = float(np.abs(standard_logits).max())
    assert float(np.abs(standard_logits - fused_logits).max()) <= 1e-4 * max(scale, 1.0)


@pytest.mark.parametrize(("terms", "option"), [("cli", "--threads N"), ("python", "threads=N")])
def test_open_runtime_refuses_a_thread_count_past_every_backend_s_bound_in_the_caller_s_terms(tiny_bundle, terms,
                                                                                                option):
    """--threads 600 was warned of as oversubscribing, then refused by ort-cpu's session as a backend that failed to
    load, its fix naming threads=N; every backend takes its count from here, so the bound is checked here first."""
    from edgesdk.errors import EdgeSDKError
    from edgesdk.runtime.session import open_runtime

    with pytest.raises(EdgeSDKError) as refused:
        open_runtime(tiny_bundle.path, threads=MAX_THREADS + 1, terms=terms)
    assert refused.value.problem == f"threads={MAX_THREADS + 1}: expected a whole number from 1 to {MAX_THREADS}"
    assert refused.value.fix.startswith(f"pass {option} with N from 1 to the board's ")
