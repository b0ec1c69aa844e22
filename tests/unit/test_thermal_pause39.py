"""The thermal hook's pause on a simulated board, on each way it can end: the guard giving up on a board that
cannot cool, a plan's horizon inside the pause. Every second waited is in a "wait" record."""

from __future__ import annotations

import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.profile import get_profile
from edgesdk.thermal.guard import Guard, Limits
from edgesdk.thermal.plan import simulate
from edgesdk.thermal.simulator import SimulatedBoard, SimulatedSensor
from edgesdk.thermal.telemetry import Telemetry
from edgesdk.thermal.watch import BoardNeverCooled, ThermalHook


def hot_hook(max_pause_s: float) -> ThermalHook:
    """A guarded hook on a simulated Pi 5 at 55 °C ambient: it idles at 81.6 °C, past the 78 °C hard limit, and never
    cools below the 70 °C resume point."""
    profile = get_profile("rpi5")
    board = SimulatedBoard.from_profile(profile, 55.0)
    sensor = SimulatedSensor(board, profile.thermal.zones[0])
    limits, _ = Limits.resolve(profile.thermal, sensor.trips(profile, sensor.zone))
    return ThermalHook(board, sensor.read, Guard(limits, profile.thermal_model), board, Telemetry(),
                       max_pause_s=max_pause_s)


def test_a_pause_the_guard_gives_up_on_is_recorded_to_its_last_chunk():
    """The hook records a wait every second; a pause given up on 0.5 s after a record lost those 0.5 s, so the
    telemetry (and the run summary's paused time) said the board paused less than it did."""
    hook = hot_hook(max_pause_s=2.0)
    hook.begin(4, 4)
    with pytest.raises(BoardNeverCooled) as caught:
        hook.before_step("prefill")
    waits = [record for record in hook.telemetry.records if record["kind"] == "wait"]
    assert sum(record["wait_s"] for record in waits) == hook.waited_s == 2.0
    assert {record["level"] for record in waits} == {"critical"}
    assert "paused for 2 simulated s at 55 °C ambient, still at 81.6 °C" in caught.value.problem


def test_the_guard_giving_up_is_an_edgesdk_error():
    """``edgesdk run`` prints it with its fix and exits 1 (``edgesdk serve`` answers it 503: test_serve_thermal_pause39)."""
    hook = hot_hook(max_pause_s=1.0)
    hook.begin(4, 4)
    with pytest.raises(BoardNeverCooled) as caught:
        hook.before_step("prefill")
    error = caught.value
    assert isinstance(error, EdgeSDKError)
    assert error.exit_code == 1
    assert str(error) == f"{error.problem}\n  fix: {error.fix}"


@pytest.mark.parametrize("minutes", [1.0, 1.01])
def test_a_plan_that_ends_inside_a_pause_counts_all_of_it(minutes):
    """At 55 °C ambient the guarded run pauses from its first step to the plan's end: the summary's paused time is the
    whole plan (it was short by the chunk after the last record, and by the part of a chunk the horizon cut)."""
    run = simulate(get_profile("rpi5"), minutes, 55.0, True, decode_tok_s=8.0)
    assert run.summary.seconds == pytest.approx(minutes * 60)
    assert run.summary.paused_s == pytest.approx(minutes * 60)
    assert run.summary.tokens == 0
