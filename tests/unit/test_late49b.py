"""Second reading of the late thermal-guard commit (review 49b).

* A prefill "fitting in the bucket" was not held, but before a decode step had measured the decode rate the bucket's
  depth is the request's tokens (not bounded by the thermal headroom: :attr:`Guard._depth`) and a token stands for a
  second of compute (:attr:`Guard._unit_tok_s`), so a 40 s prompt "fitted" a 256-token request's bucket: after a
  prompt-only request (``max_tokens`` 0, an embedding) had taught the guard its prefill rate, a 4,000-token prompt ran
  unheld from a board at 76 °C, which the model says ends far above the soft limit.
* ``BoardNeverCooled`` (``edgesdk run``'s error, ``edgesdk serve``'s 503 ``board_too_hot``) said only that the board
  never cooled below the resume point, though a pause now also ends after one time constant below the hard limit
  less the hysteresis: the temperature a user must get the board under was not named.
"""

from __future__ import annotations

import pytest

from edgesdk.profile import get_profile
from edgesdk.runtime.hooked_pass import hooked_pass
from edgesdk.thermal.guard import Guard, Limits
from edgesdk.thermal.sensors import Reading
from edgesdk.thermal.simulator import SimulatedBoard, SimulatedSensor, WorkModel
from edgesdk.thermal.watch import BoardNeverCooled, ThermalHook, settle_time_s

PROFILE = get_profile("rpi5")  # resume 70 °C, setpoint 73 °C, soft 75 °C, hard 78 °C, hysteresis 1 °C
ZONE = PROFILE.thermal.zones[0]


def prompt_only_guard(temp: float) -> Guard:
    """A guard that learned a 100 tok/s prefill from a prompt-only request (no decode step ran), now at ``temp``."""
    guard = Guard(Limits.resolve(PROFILE.thermal)[0], PROFILE.thermal_model)
    guard.observe(0.0, Reading(time=0.0, zones={ZONE: 60.0}))
    guard.begin(0, 1000)
    guard.spend("prefill", 0, 10.0)
    guard.observe(1.0, Reading(time=1.0, zones={ZONE: temp}))
    assert (guard.prefill_tok_s, guard.unpaced_tok_s) == (100.0, None)
    return guard


@pytest.mark.parametrize("max_new_tokens", [16, 256])
def test_a_long_prefill_is_held_before_any_decode_rate_is_known(max_new_tokens):
    guard = prompt_only_guard(76.0)
    assert guard.level.value == "hot"
    assert not guard.paused
    guard.begin(max_new_tokens, 4000)  # 40 s of prefill at 100 tok/s from 76 °C
    assert guard.prefill_held  # before the fix: 40 s "fitted" a bucket of 16 or 256 tokens
    assert guard.wait_s("prefill") == guard.config.poll_s
    assert guard.holding


def test_a_prefill_the_model_lets_through_is_not_held_before_a_decode_rate_either():
    guard = prompt_only_guard(71.0)  # from 71 °C, 1 s of prefill ends well under the soft limit
    guard.begin(256, 100)
    assert not guard.prefill_held


def test_a_board_that_never_cools_names_both_temperatures_a_pause_ends_under():
    board = SimulatedBoard.from_profile(PROFILE, 60.0, work=WorkModel(decode_tok_s=10.0, prefill_tok_s=100.0),
                                        start_c=80.0)  # idles near 86 °C: above the hard limit
    sensor = SimulatedSensor(board, ZONE)
    guard = Guard(Limits.resolve(PROFILE.thermal, sensor.trips(PROFILE, ZONE))[0], PROFILE.thermal_model)
    hook = ThermalHook(board, sensor.read, guard, board, max_pause_s=settle_time_s(board))
    with pytest.raises(BoardNeverCooled) as caught:
        hooked_pass(hook, 16, lambda: None)
    hard, hysteresis = guard.limits.hard_c, guard.config.hysteresis_c
    message = str(caught.value)
    assert f"never cooled below the guard's resume point {guard.limits.resume_c:g} °C" in message
    # before the fix: the second way a pause ends, and the temperature it needs, went unsaid
    assert f"nor below {hard - hysteresis:g} °C (hard limit {hard:g} °C less the {hysteresis:g} °C hysteresis)" \
        in message
    assert "lower --ambient" in caught.value.fix
