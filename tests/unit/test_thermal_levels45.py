"""Time at level: the telemetry records, the summary and the report's level plot agree on one convention.

A record books the interval since the record before it, at the guard level that interval passed in. Step
records carried the level read after the step, wait records the level of the chunks they book, and
``summarize`` charged each interval to its record's level: a 2 s prefill during which the board crossed a
threshold was counted at the level it led to. The ground truth here is the guard's own level over the
simulated board's clock: the level each ``observe`` sets holds until the next one.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

from edgesdk.profile import get_profile
from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.thermal.guard import Guard, Limits
from edgesdk.thermal.plan import _StubDecoder
from edgesdk.thermal.sensors import Reading
from edgesdk.thermal.simulator import SimulatedBoard, SimulatedSensor, WorkModel
from edgesdk.thermal.telemetry import StatusLine, Telemetry, summarize
from edgesdk.thermal.watch import ThermalHook
from tests._utils.clock import ManualClock

PROFILE = get_profile("rpi5")  # warm from 70 °C, hot from 71.5 °C, critical at 78 °C, resumes below 70 °C


class TimelineGuard(Guard):
    """The real guard, noting the level each observation leaves it at, on the clock it is given."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.timeline: list[tuple[float, str]] = []

    def observe(self, now, reading):
        level = super().observe(now, reading)
        self.timeline.append((now, level.value))
        return level


def seconds_at_level(timeline: list[tuple[float, str]], end: float) -> dict[str, float]:
    totals: dict[str, float] = {}
    for (start, level), (stop, _) in zip(timeline, [*timeline[1:], (end, None)], strict=True):
        totals[level] = totals.get(level, 0.0) + stop - start
    return {level: round(seconds, 2) for level, seconds in totals.items() if round(seconds, 2)}


def simulated_run(start_c: float, requests: int = 3, new_tokens: int = 8):
    """Requests of a 128-token prompt (a 2 s prefill at 64 tok/s) on a simulated Pi 5 starting at ``start_c``."""
    board = SimulatedBoard.from_profile(PROFILE, 25.0, work=WorkModel(decode_tok_s=10.0, prefill_tok_s=64.0),
                                        start_c=start_c)
    sensor = SimulatedSensor(board, PROFILE.thermal.zones[0])
    guard = TimelineGuard(Limits.resolve(PROFILE.thermal, sensor.trips(PROFILE, sensor.zone))[0],
                          PROFILE.thermal_model)
    telemetry = Telemetry()
    hook = ThermalHook(board, sensor.read, guard, board, telemetry)
    for _ in range(requests):
        generate(_StubDecoder(), [2] * 128, SamplingConfig(max_new_tokens=new_tokens), stop_ids=set(), hook=hook)
    return board, guard, telemetry


@pytest.mark.parametrize(("start_c", "before", "after"), [(69.8, "normal", "warm"), (71.2, "warm", "hot")])
def test_a_prefill_that_crosses_a_threshold_counts_at_the_level_it_ran_at(start_c, before, after):
    board, guard, telemetry = simulated_run(start_c)
    prefill = telemetry.records[0]
    assert prefill["kind"] == "prefill"
    assert prefill["duration_s"] == pytest.approx(2.0)
    assert prefill["level"] == before  # the guard read the board before the prefill: it ran at this level
    assert {level for t, level in guard.timeline if t < 1.99} == {before}
    assert next(level for t, level in guard.timeline if t > 1.99) == after  # ... and read the new level after it
    truth = seconds_at_level(guard.timeline, board.t)
    assert truth[before] == pytest.approx(2.0)
    assert summarize(telemetry.records).levels_s == truth  # was {after: 8.1}: the prefill counted at `after`


def test_a_pause_and_the_step_after_it_count_at_their_own_levels():
    board, guard, telemetry = simulated_run(77.7)  # hot; the first prefill takes the board to critical
    truth = seconds_at_level(guard.timeline, board.t)
    assert truth["critical"] > 60
    assert summarize(telemetry.records).levels_s == truth  # was 0.1 s (the step after the pause) off


class CountingClock(ManualClock):
    def __init__(self):
        super().__init__()
        self.sleeps = 0

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        super().sleep(seconds)


def test_pacing_that_the_guard_ends_while_waiting_is_booked_at_its_own_level():
    """A board paced at hot cools during a wait of the guard's: the level falls (to normal) and the wait
    ends. Its chunks, paced at hot and not yet in a wait record, were booked with the step that followed."""
    clock = CountingClock()
    cool = {"after": None}  # the sleep count after which the board reads 60 °C (hot until then)

    def temperature() -> float:
        return 60.0 if cool["after"] is not None and clock.sleeps > cool["after"] else 73.0

    guard = TimelineGuard(Limits.resolve(PROFILE.thermal)[0], PROFILE.thermal_model)
    telemetry = Telemetry()
    hook = ThermalHook(clock, lambda: Reading(time=clock.t, zones={"cpu-thermal": temperature()}), guard,
                       telemetry=telemetry, wait_record_s=60.0)  # one wait record a minute at most

    def step(seconds: float = 0.05) -> float:
        waited = hook.before_step("decode")
        clock.t += seconds
        hook.after_step("decode", 1, seconds)
        return waited

    hook.begin(5, 400)
    step(0.5)
    while step() <= 0 or clock.t < guard.since + guard.config.min_dwell_s:  # pacing, past the dwell in hot
        pass
    assert guard.level.value == "hot"
    cool["after"] = clock.sleeps  # cool during the next wait's first chunk
    waited = step()
    assert waited > 0
    assert guard.level.value == "normal"
    hot_wait = [r for r in telemetry.records if r["kind"] == "wait"][-1]
    assert (hot_wait["level"], hot_wait["wait_s"]) == ("hot", pytest.approx(waited))
    assert telemetry.records[-1]["level"] == "normal"  # the step ran at the level the guard read before it
    truth = seconds_at_level(guard.timeline, clock.t)
    assert summarize(telemetry.records).levels_s == truth


def test_the_report_draws_each_level_where_the_summary_counts_it():
    matplotlib = pytest.importorskip("matplotlib")
    from matplotlib import cbook

    from edgesdk.thermal.report import LEVELS, _level_steps

    board, guard, telemetry = simulated_run(69.8)
    t, level = _level_steps(telemetry.records)
    assert matplotlib is not None
    x, y = cbook.pts_to_prestep(t, level)  # the path ``ax.step(..., where="pre")`` draws
    drawn: dict[str, float] = {}
    for x0, x1, value in zip(x[:-1], x[1:], y[1:], strict=True):
        drawn[LEVELS[int(value)]] = drawn.get(LEVELS[int(value)], 0.0) + x1 - x0
    assert {k: round(v, 2) for k, v in drawn.items() if round(v, 2)} == summarize(telemetry.records).levels_s
    assert t[0] == 0.0  # the first record's interval starts with the run
    assert np.all(np.diff(t) >= 0)


def test_an_older_file_still_reads_as_it_did():
    """A version 1 file (a step record's level read after the step) reads as before: its time sums to the
    run, each interval at its record's level."""
    records = [{"type": "step", "t": 2.0, "kind": "prefill", "tokens": 1, "duration_s": 2.0, "wait_s": 0.0,
                "level": "warm"},
               {"type": "step", "t": 2.1, "kind": "decode", "tokens": 1, "duration_s": 0.1, "wait_s": 0.0,
                "level": "warm"}]
    assert summarize(records).levels_s == {"warm": 2.1}


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_a_warning_between_answers_prints_once(monkeypatch):
    """Status line in its "between answers" mode (stdout and stderr on one terminal without a usable TERM, or
    one log file): a warning that no step followed was printed twice, once as the warning and once as the
    status, since warn() made it the status text."""
    monkeypatch.setenv("TERM", "dumb")
    err, out = FakeTTY(), FakeTTY()
    status = StatusLine(err, out, min_interval_s=0.0)
    assert status.mode == "between"
    status.update("61.0 °C  normal", level="normal")
    status.between_answers()
    status.warn("policy0: cannot write scaling_max_freq")
    status.between_answers()
    assert err.getvalue().splitlines() == ["edgesdk thermal: 61.0 °C  normal",
                                           "edgesdk thermal: warning: policy0: cannot write scaling_max_freq",
                                           "edgesdk thermal: 61.0 °C  normal"]
    assert out.getvalue() == ""
