"""ThermalHook behaviour found in review."""

from __future__ import annotations

import pytest

from edgesdk.profile import get_profile
from edgesdk.thermal.guard import Guard, Limits
from edgesdk.thermal.sensors import Reading
from edgesdk.thermal.telemetry import Telemetry, summarize
from edgesdk.thermal.watch import ThermalHook
from tests._utils.clock import ManualClock

PROFILE = get_profile("rpi5")  # critical at 78 °C, resumes below 70 °C


def test_telemetry_counts_every_second_of_a_critical_pause():
    """The guard waits in chunks of poll_s (0.5 s) and the hook writes a "wait" record at most every
    wait_record_s (1 s), but each record carried only its last chunk: a 30 s pause summed to 15 s of
    paused_s (``thermal plan --json``), and its last second was counted at the next step's level."""
    clock = ManualClock()
    limits, _ = Limits.resolve(PROFILE.thermal)
    guard = Guard(limits, PROFILE.thermal_model)
    telemetry = Telemetry()
    hook = ThermalHook(clock, lambda: Reading(time=clock.t, zones={"cpu-thermal": 80.0 if clock.t < 30 else 60.0}),
                       guard, telemetry=telemetry)
    hook.begin(5, 10)
    waited = hook.before_step("prefill")
    hook.after_step("prefill", 1, 0.1)
    assert waited == pytest.approx(30.0)
    summary = summarize(telemetry.records)
    assert summary.paused_s == pytest.approx(30.0)
    assert summary.levels_s["critical"] == pytest.approx(30.0)
    assert summary.mean_ttft_s == pytest.approx(30.1)  # the prefill record still carries the whole wait
    waits = [r for r in telemetry.records if r["kind"] == "wait"]
    assert len(waits) <= 31  # still about one record a second


def test_a_step_that_ends_critical_does_not_count_its_wait_as_a_pause():
    """A step record carries the wait before it (and then carried the level read after it). A board paced at hot
    that reached critical during the step had its pacing wait summed as paused_s (and a step after
    a pause counted that pause a second time): pauses are booked in their "wait" records only."""
    clock = ManualClock()
    limits, _ = Limits.resolve(PROFILE.thermal)
    guard = Guard(limits, PROFILE.thermal_model)
    telemetry = Telemetry()
    temperature = {"now": 75.0}  # hot: the guard paces
    hook = ThermalHook(clock, lambda: Reading(time=clock.t, zones={"cpu-thermal": temperature["now"]}),
                       guard, telemetry=telemetry)
    hook.begin(5, 10)
    for _ in range(40):  # past the bucket: a step waits
        if hook.before_step("decode") > 0:
            break
        hook.after_step("decode", 1, 0.05)
    temperature["now"] = 80.0  # the step takes the board to critical
    hook.after_step("decode", 1, 0.05)
    last = telemetry.records[-1]
    assert guard.level.value == "critical"
    assert last["level"] == "hot"  # the level the step ran at (telemetry module docstring); critical from here on
    assert last["wait_s"] > 0
    assert summarize(telemetry.records).paused_s == 0.0


def test_a_pause_ended_by_a_failed_sensor_is_counted_once():
    """A sensor that fails during a critical pause ends it (paused needs a working sensor) with the
    level still critical: the step after it carries the pause's 2.5 s again, and summarize counted 5 s."""
    clock = ManualClock()
    limits, _ = Limits.resolve(PROFILE.thermal)
    guard = Guard(limits, PROFILE.thermal_model)
    telemetry = Telemetry()
    hook = ThermalHook(clock, lambda: Reading(time=clock.t, zones={"cpu-thermal": 80.0} if clock.t < 2.25 else {}),
                       guard, telemetry=telemetry)
    hook.begin(5, 10)
    assert hook.before_step("prefill") == pytest.approx(2.5)
    hook.after_step("prefill", 1, 0.1)
    assert telemetry.records[-1]["level"] == "critical"
    assert not telemetry.records[-1]["sensor_ok"]
    assert summarize(telemetry.records).paused_s == pytest.approx(2.5)
