"""Thermal telemetry summaries: a first-token time only for a request that had a first token."""

from __future__ import annotations

import pytest

from edgesdk.profile import get_profile
from edgesdk.thermal.guard import Guard, Level, Limits
from edgesdk.thermal.plan import Workload, simulate
from edgesdk.thermal.sensors import Reading
from edgesdk.thermal.telemetry import summarize

RPI5 = get_profile("rpi5")


def prefill(t: float, seconds: float, prompt_tokens: int, prompt_left: int, prompt_step: int) -> dict:
    """A prefill step record of a prompt the guard prefills in steps."""
    return {"type": "step", "t": t, "kind": "prefill", "tokens": 1 if prompt_left == 0 else 0, "duration_s": seconds,
            "wait_s": 0.0, "level": "normal", "prompt_tokens": prompt_tokens, "prompt_left": prompt_left,
            "prompt_step": prompt_step}


def test_a_run_cut_inside_its_first_prompt_has_no_time_to_first_token():
    """thermal plan --prefill-tok-s 1 --prompt-tokens 10000 --minutes 60: the guarded run prefilled the prompt in
    steps and the horizon came before the last one, yet its table showed a mean time to first token of 3549.50 s (the
    steps' time so far) for a run that produced no first token."""
    run = simulate(RPI5, 60, 25.0, True, 35.0, prefill_tok_s=1.0, workload=Workload(prompt_tokens=10000))
    prefills = [record for record in run.telemetry.records if record.get("kind") == "prefill"]
    assert prefills
    assert all(record["prompt_left"] > 0 for record in prefills)  # no step yielded a first token
    assert run.summary.tokens == 0
    assert run.summary.requests == 1  # the prompt begun is still a request
    assert run.summary.mean_ttft_s is None  # before the fix: 3549.4973


def test_an_abandoned_prompt_is_a_request_without_a_first_token():
    """A prompt abandoned between its steps (serve's client gone, a 503) is a request of its own, not merged into the
    next one; only the answered request has a first-token time (before the fix: the mean of 40 s and 6 s, 23 s)."""
    records = [prefill(20.0, 20.0, 512, 1488, 1), prefill(40.0, 20.0, 512, 976, 2),  # abandoned after 2 steps
               prefill(46.0, 6.0, 240, 0, 1)]
    summary = summarize(records)
    assert summary.requests == 2
    assert summary.mean_ttft_s == pytest.approx(6.0)


def reading(t: float, temp_c: float) -> Reading:
    return Reading(time=t, zones={"cpu": temp_c})


def test_a_pause_does_not_wind_the_rate_controllers_integral_down():
    """Paused at the hard limit the rate is not applied, yet the PI controller went on integrating the error: a
    pause of one time constant (238 s on a Pi 5) wound the integral down to min_fraction (0.02), so a pause that ended
    into hot paced the board at 2 % until it climbed back, where the integral held before the pause was 0.18."""
    limits, _ = Limits.resolve(RPI5.thermal)
    guard = Guard(limits, RPI5.thermal_model)
    guard.unpaced_tok_s = 10.0
    t = 0.0
    for temp_c in (60.0, 72.0, 73.0, 74.0, 75.0, 76.0, 77.0):  # into hot, pacing up to the hard limit
        t += 1.0
        guard.observe(t, reading(t, temp_c))
    before = guard._integral
    assert guard.level is Level.HOT
    assert before > 0.1
    t += 1.0
    guard.observe(t, reading(t, 78.5))
    assert guard.paused
    while guard.paused:  # a board in a warm enclosure: ends the pause after RC, below hard - hysteresis
        t += 0.5
        guard.observe(t, reading(t, 77.9 if t < 300.0 else 76.5))
    assert guard.level is Level.HOT
    # after the pause, one poll's integration at 76.5 °C: before the fix 0.02 (min_fraction)
    assert guard._integral == pytest.approx(before + guard._ki * (guard.setpoint_c - 76.5) * 0.5)
