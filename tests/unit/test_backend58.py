"""The ONNX Runtime backends, embeddings and the server's metrics at their edges: a no-op StepHook under the metrics
hook, token ids past int64, and a numpy integer thread count."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import RuntimeBackendError
from edgesdk.runtime.generate import StepHook
from edgesdk.serve.metrics import MetricsHook, ServeMetrics
from tests.unit.test_ort55 import export_both_forms


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export_both_forms(tmp_path_factory)


def _backend(exported, form: str, threads=1):
    from edgesdk.runtime.ort_backend import OrtBackend
    from edgesdk.runtime.ort_fused_backend import OrtFusedBackend

    path, graph = exported[form]
    return (OrtBackend if form == "standard" else OrtFusedBackend)(path, graph, threads=threads)


class QuietHook(StepHook):
    """The StepHook protocol's own methods: every one a no-op, ``before_step`` returning None."""


def test_a_no_op_hook_under_the_metrics_hook_counts_no_wait(exported):
    """generate reads a None from before_step as no wait (the protocol allows a no-op hook); the metrics hook passed
    it to ServeMetrics.waited, whose += raised a TypeError in the answer's first step."""
    from edgesdk.runtime.generate import SamplingConfig, generate

    backend = _backend(exported, "standard")
    metrics = ServeMetrics()
    hook = MetricsHook(metrics, QuietHook(), backend)
    assert hook.before_step("prefill") == 0.0
    tokens, stats = generate(backend, [1, 2, 3], SamplingConfig(max_new_tokens=3), set(), hook=hook)
    assert len(tokens) == 3
    assert stats.waited_s == 0.0
    assert metrics.thermal_wait_seconds == 0.0
    assert metrics.decodes == 3  # the prefill and two decode steps


def test_a_hook_that_raised_with_no_wait_recorded_counts_none():
    """A hook that raises before its step and has no ``waited_s`` (or a None one) adds no wait, not a TypeError
    hiding its own error."""

    class Refusing(QuietHook):
        waited_s = None

        def before_step(self, kind):
            raise KeyboardInterrupt

    metrics = ServeMetrics()
    with pytest.raises(KeyboardInterrupt):
        MetricsHook(metrics, Refusing()).before_step("decode")
    assert metrics.thermal_wait_seconds == 0.0


@pytest.mark.parametrize("form", ["standard", "ort-fused"])
def test_an_embedding_of_an_id_past_int64_names_the_id(exported, form):
    """embed_tokens made an int64 array of the ids: one past int64 was numpy's OverflowError ("Python int too large
    to convert to C long"), naming no id, where the backend names any id out of its vocabulary."""
    from edgesdk.runtime.embedding import embed_tokens

    backend = _backend(exported, form)
    with pytest.raises(RuntimeBackendError) as caught:
        embed_tokens(backend, [5, 2**63])
    assert "token id 9223372036854775808 at position 1" in caught.value.problem
    assert embed_tokens(backend, [5, 6]).tokens == 2  # ids in the vocabulary embed as before


@pytest.mark.parametrize("form", ["standard", "ort-fused"])
@pytest.mark.parametrize("call", ["prefill", "hidden_states"])
def test_a_list_of_a_negative_id_and_one_past_int64_names_the_negative_id(exported, form, call):
    """np.asarray([-1, 2**63]) is a float64 array: the backend read the list so before checking it, and refused it
    as ids of dtype float64 ("expected whole numbers"), not by the id -1 that is no row of the embedding."""
    backend = _backend(exported, form)
    with pytest.raises(RuntimeBackendError) as caught:
        getattr(backend, call)([-1, 2**63])
    assert "token id -1 at position 0" in caught.value.problem
    assert backend.position == 0


@pytest.mark.parametrize("form", ["standard", "ort-fused"])
def test_a_numpy_integer_thread_count_opens_the_session(exported, form):
    """threads=np.int64(2) is a whole number of threads; it was refused as "expected a whole number"."""
    backend = _backend(exported, form, threads=np.int64(2))
    assert backend.session.get_session_options().intra_op_num_threads == 2
