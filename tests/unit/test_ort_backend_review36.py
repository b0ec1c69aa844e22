"""The ONNX Runtime backends' ``prefill(token_ids, keep_logits)`` (edgesdk/runtime/ort_backend.py and the fused and
power-gated forms over it) on real sessions of tiny exported models: how many rows of logits come back."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from edgesdk.errors import RuntimeBackendError  # noqa: E402

IDS = np.array([5, 17, 120, 33, 250, 9], np.int64)


@pytest.fixture(scope="module", params=["standard", "ort-fused", "gated"])
def backend(request, tmp_path_factory):
    from tests.unit.test_prompt_cache import BACKENDS

    return BACKENDS[request.param](tmp_path_factory.mktemp(request.param))


@pytest.mark.parametrize("keep", [0, -1, 1.5, True])
def test_keep_logits_below_one_or_not_a_count_is_refused_by_name(backend, keep):
    """The graphs slice the logits at -num_logits_to_keep: keep_logits=0 gave every position's row and -1 all but the
    first one's, neither the rows asked for. It is refused, naming the value, and the cache is left as it was."""
    backend.reset()
    backend.prefill(IDS[:2])
    with pytest.raises(RuntimeBackendError, match=rf"keep_logits={keep!r}: expected a whole number of at least 1"):
        backend.prefill(IDS, keep_logits=keep)
    assert backend.position == 2


def test_keep_logits_gives_the_last_rows_and_at_most_one_per_token(backend):
    backend.reset()
    every = backend.prefill(IDS, keep_logits=len(IDS))
    assert every.shape[0] == len(IDS)
    backend.reset()
    last_two = backend.prefill(IDS, keep_logits=np.int64(2))
    np.testing.assert_allclose(last_two, every[-2:], rtol=1e-4, atol=1e-4)
    backend.reset()
    assert backend.prefill(IDS, keep_logits=100).shape[0] == len(IDS)
