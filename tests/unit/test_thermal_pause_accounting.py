"""How long a run paused, as the telemetry summary reads it from the "wait" records: only the time the guard
really held generation (critical with a working sensor), each run of waiting booked in the state it happened in."""

from __future__ import annotations

import pytest

from edgesdk.profile import get_profile
from edgesdk.thermal.guard import Guard, Limits
from edgesdk.thermal.sensors import Reading
from edgesdk.thermal.telemetry import Telemetry, summarize
from edgesdk.thermal.watch import ThermalHook
from tests._utils.clock import ManualClock


def guarded(temperature):
    """A hook over the rpi5 guard on a manual clock, reading ``temperature(t)`` (None: the sensor gives no data)."""
    profile = get_profile("rpi5")
    clock, telemetry = ManualClock(), Telemetry()
    guard = Guard(Limits.resolve(profile.thermal)[0], profile.thermal_model)
    hook = ThermalHook(clock, lambda: Reading(time=clock.t, zones={"cpu-thermal": temperature(clock.t)}), guard,
                       telemetry=telemetry)
    return hook, clock, guard, telemetry


def step(hook, clock, kind: str = "decode", seconds: float = 0.1) -> float:
    waited = hook.before_step(kind)
    clock.t += seconds
    hook.after_step(kind, 1, seconds)
    return waited


def test_a_sensor_that_fails_during_a_pause_ends_the_pause_and_its_pacing_is_not_counted_as_paused():
    hook, clock, guard, telemetry = guarded(lambda t: 80.0 if t < 2.25 else None)  # critical, then no data
    hook.begin(5, 50)
    step(hook, clock, "prefill")
    for _ in range(20):
        step(hook, clock)
    assert not guard.sensor_ok  # a conservative fixed rate, still at level critical, not paused
    assert not guard.paused
    waits = [r for r in telemetry.records if r["kind"] == "wait"]
    assert any(not r["paused"] and r["level"] == "critical" for r in waits)
    summary = summarize(telemetry.records)
    assert summary.paused_s == pytest.approx(sum(r["wait_s"] for r in waits if r["paused"]))
    assert summary.paused_s < 5  # the pause lasted until the sensor failed; 90 s of pacing followed


def test_pacing_that_turns_into_a_pause_and_back_is_booked_apart():
    temperature = {"at": lambda t: 75.0}  # hot: the guard paces
    hook, clock, guard, telemetry = guarded(lambda t: temperature["at"](t))
    hook.begin(5, 200)
    step(hook, clock, "prefill")
    while step(hook, clock, seconds=0.05) <= 0:  # until the token bucket is empty and pacing waits
        pass
    start, first = clock.t, len(telemetry.records)
    temperature["at"] = lambda t: 75.0 if t < start + 0.6 else (80.0 if t < start + 20.6 else 60.0)
    waited = step(hook, clock, seconds=0.05)
    waits = [r for r in telemetry.records[first:] if r["kind"] == "wait"]
    paused = sum(r["wait_s"] for r in waits if r["paused"])
    assert paused == pytest.approx(20.0, abs=0.5)  # the time spent at 80 degrees, the pause's own chunks only
    assert all(r["level"] == "critical" for r in waits if r["paused"])
    assert all(r["level"] != "critical" for r in waits if not r["paused"])
    assert summarize(telemetry.records[first:]).paused_s == pytest.approx(paused)
    assert waited > paused  # the step's wait also holds the pacing before the pause
