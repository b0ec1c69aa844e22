"""Log-probabilities of a row with an overflowed (+inf) logit, and the refusal of a FIM prompt for a vocabulary
without the FIM tokens."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from edgesdk.runtime.fim import FimTokens, fim_ids, infill_ids
from edgesdk.runtime.logprobs import NO_CHANCE, LogprobRecorder, log_softmax


def test_logprobs_of_a_row_with_a_positive_infinite_logit_are_finite_and_complete():
    logits = np.array([1.0, np.inf, 0.0, -np.inf, 2.0], np.float16)  # a float16 engine's overflow at token 1
    recorder = LogprobRecorder(top=3)
    picked = recorder.entry(logits, 1)
    other = recorder.entry(logits, 4)
    assert picked.logprob == 0.0  # all the probability
    assert other.logprob == NO_CHANCE
    assert [token for token, _ in picked.top] == [1, 0, 2]  # the overflowed one first, the rest tied in id order
    assert all(math.isfinite(value) for _, value in picked.top)
    json.dumps([picked.logprob, other.logprob, picked.top], allow_nan=False)  # valid JSON, no NaN


def test_log_softmax_shares_the_probability_among_overflowed_logits():
    rows = np.array([[0.0, np.inf, np.inf, 5.0], [1.0, 2.0, 3.0, 4.0]])
    scores = log_softmax(rows)  # (2, 4)
    np.testing.assert_allclose(scores[0], [-np.inf, math.log(0.5), math.log(0.5), -np.inf])
    expected = rows[1] - math.log(np.exp(rows[1]).sum())
    np.testing.assert_allclose(scores[1], expected)


@pytest.mark.parametrize("build", [
    lambda fim: fim_ids(fim, [10], [11], None),
    lambda fim: infill_ids(fim, [10], [11], [], [("a.py", "x")], lambda text: [12], None, n_ctx=4096),
])
def test_fim_prompt_refusal_names_the_missing_token_and_the_fix(build):
    fim = FimTokens(pre=1, suf=2, rep=4)  # no FIM middle token
    with pytest.raises(ValueError, match="no FIM middle token") as caught:
        build(fim)
    message = str(caught.value)
    assert "use a code model" in message
