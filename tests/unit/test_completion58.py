"""The completer's answers at its edges (a real runtime of the tiny bundle, the simulated thermal guard).

- A request that only evaluates its prompt (POST /completion's ``n_predict`` 0, /v1/completions' ``max_tokens`` 0,
  the prompt-scoring ``echo`` with ``logprobs``) on a board that never cools got the guard's ``BoardNeverCooled`` raw,
  which the server answers as its own 500, while the same request with a token to generate got the 503
  ``board_too_hot`` a client may retry: the prefill is held back by the guard the same way in both.
"""

from __future__ import annotations

import pytest

from edgesdk.profile import get_profile
from edgesdk.serve.api import ApiError, parse_text_request
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.thermal.watch import open_session

# A Pi 5 at 55 °C ambient idles past its 78 °C hard limit: the guard pauses at once and the board never cools
# below the 70 °C resume point (tests/unit/test_serve_thermal_pause39.py's board).
HOT_AMBIENT_C = 55.0


@pytest.fixture
def hot(runtime, tmp_path):
    thermal = open_session(get_profile("rpi5"), guard=True, simulate=True, status=False, ambient_c=HOT_AMBIENT_C,
                           telemetry_path=str(tmp_path / "serve.jsonl"), clock_cap=False)
    yield Completer(runtime, ServeDefaults(max_tokens=4), hook=thermal.hook)
    thermal.close()


@pytest.mark.parametrize("body", [{"prompt": "hello", "max_tokens": 0},
                                  {"prompt": "hello", "max_tokens": 0, "echo": True, "logprobs": 1}])
def test_a_prompt_only_request_on_a_board_that_never_cools_is_the_503_board_too_hot(hot, body):
    with pytest.raises(ApiError) as caught:
        hot.complete(parse_text_request(body, completer=hot))
    assert caught.value.status == 503
    assert caught.value.code == "board_too_hot"
    assert "never cooled below the guard's resume point" in str(caught.value)
    assert hot.metrics.finished["error"] == 1  # counted once, as a failed answer
