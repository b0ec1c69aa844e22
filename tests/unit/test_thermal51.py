"""Thermal area, review 51: the guard's ambient estimate, a frozen sensor, telemetry that survives a power cut."""

from __future__ import annotations

import json
import math
import os

from edgesdk.profile import get_profile
from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.thermal.guard import Guard, GuardConfig, Limits
from edgesdk.thermal.plan import _StubDecoder
from edgesdk.thermal.sensors import Reading
from edgesdk.thermal.simulator import PastHorizon, SimulatedBoard, SimulatedSensor, WorkModel
from edgesdk.thermal.telemetry import Telemetry
from edgesdk.thermal.watch import HorizonReached, ThermalHook

PI5 = get_profile("rpi5")


def _run(board: SimulatedBoard, read, prompt_tokens: int, horizon_s: float, config: GuardConfig | None = None,
         capped: bool = False):
    """Requests back to back on ``board`` under the guard until ``horizon_s``; the guard, the warnings, and the
    seconds the board spent above the guard's soft limit (sampled at every reading). ``capped``: the guard's
    clock cap acts on the simulated board (``--clock-cap``)."""
    sensor = SimulatedSensor(board, "cpu-thermal")
    warnings: list[str] = []
    guard = Guard(Limits.resolve(PI5.thermal, sensor.trips(PI5, sensor.zone))[0], PI5.thermal_model, config,
                  warn=warnings.append)
    over, last = [0.0], [0.0]

    def sample():
        if board.temp_c > guard.limits.soft_c:
            over[0] += board.t - last[0]
        last[0] = board.t
        return read(sensor)

    hook = ThermalHook(board, sample, guard, board, Telemetry(), clock_cap=board if capped else None,
                       horizon_s=horizon_s)
    try:
        while True:
            generate(_StubDecoder(), [2] * prompt_tokens, SamplingConfig(max_new_tokens=256), stop_ids=set(),
                     hook=hook)
    except (HorizonReached, PastHorizon):
        pass
    return guard, warnings, over[0]


def _board(start_c: float | None, ambient_c: float = 20.0, horizon_s: float = 1200.0) -> SimulatedBoard:
    return SimulatedBoard.from_profile(PI5, ambient_c, work=WorkModel(decode_tok_s=10.0, prefill_tok_s=40.0),
                                       horizon_s=horizon_s, start_c=start_c)


# -- (1) the ambient, estimated once from the first reading ---------------------------------------------------


def test_a_cold_booted_board_serving_long_prompts_stays_below_the_soft_limit():
    """A board read first at the room's temperature (a cold boot: ``edgesdk serve`` started with the board) had
    its ambient taken as if it had idled there, 26.6 °C too low on a Pi 5 (-6.6 °C in a 20 °C room): the model
    then under-predicted every prefill's heat, 2,000-token prompts (50 s each) ran unheld from the setpoint, and
    the board spent over 500 s of 20 minutes above the soft limit, most of it paused at the hard limit."""
    guard, _, over_s = _run(_board(start_c=20.0), lambda sensor: sensor.read(), 2000, 1200.0)
    assert over_s == 0.0
    assert abs(guard.ambient_c - 20.0) < 2.0


def test_the_ambient_estimate_follows_the_board_not_the_first_reading():
    """Readings of the model's own board, cold-started at 20 °C and computing half of the time: after a few time
    constants the guard's ambient is the board's, whatever the first reading suggested."""
    p = PI5.thermal_model
    tau = p.resistance_c_per_w * p.capacity_j_per_c
    guard = Guard(Limits.resolve(PI5.thermal)[0], p)
    temp, dt = 20.0, 0.5
    steady = 20.0 + p.resistance_c_per_w * (p.idle_w + 0.5 * (p.active_w - p.idle_w))
    for step in range(int(2 * tau / dt)):
        guard.observe(step * dt, Reading(time=step * dt, zones={"cpu-thermal": round(temp, 3)}))
        guard.spend("decode", 1, dt / 2)  # busy half of each interval
        temp = steady + (temp - steady) * math.exp(-dt / tau)
    assert abs(guard.ambient_c - 20.0) < 1.0


def test_a_board_that_starts_hot_is_not_held_for_ever():
    """The other way round: a board first read at its firmware's throttle point (a job ran before) overestimates
    the ambient; the guard paces it down and learns the room, and it keeps making tokens."""
    guard, _, _ = _run(_board(start_c=80.0), lambda sensor: sensor.read(), 64, 1200.0)
    assert abs(guard.ambient_c - 20.0) < 3.0
    assert guard.sensor_ok


# -- (2) a frozen sensor -------------------------------------------------------------------------------------


def _frozen_after(seconds: float):
    held: dict[str, float] = {}

    def read(sensor: SimulatedSensor) -> Reading:
        reading = sensor.read()
        if sensor.board.t >= seconds:
            held.setdefault("c", reading.zones["cpu-thermal"])
            reading.zones["cpu-thermal"] = held["c"]
        return reading

    return read


def test_a_sensor_frozen_while_the_board_works_is_taken_as_failed_and_paced():
    """A zone frozen at its value a minute into the run (a driver that stopped updating, a cached firmware
    reading) kept the guard at "normal" for ever: the board ran unpaced into the firmware's throttle. Now the
    reading that does not move while the model says it must is no data: a warning, and the fixed pace."""
    board = _board(start_c=None)
    guard, warnings, _ = _run(board, _frozen_after(60.0), 64, 900.0)
    assert not guard.sensor_ok
    assert guard.frozen_s is not None
    assert guard.frozen_s > 600
    assert any("frozen" in w and "thermal sensor failed" in w for w in warnings), warnings
    assert board.throttled_s == 0.0


def test_a_frozen_sensor_stays_failed_while_its_fixed_pace_caps_the_clock():
    """With --clock-cap the fallback pace caps the clock (the model's power there is the capped clock's, which the
    simulated board reports applying): a sensor taken as frozen stays so until its reading changes, it does not
    flip back to "ok" (and unpaced) every 30 s."""
    board = _board(start_c=None)
    guard, _, _ = _run(board, _frozen_after(60.0), 64, 900.0, GuardConfig(hot_clock_ratio=0.625), capped=True)
    assert not guard.sensor_ok
    assert board.throttled_s == 0.0


def test_a_real_steady_state_is_not_taken_as_frozen():
    """A board at rest reads the same value for minutes (its sensor coarse or the board settled): the model
    expects no change there, so the guard does not take it for a frozen sensor. Nor does a coarse sensor (0.5 °C
    steps) on a working board."""
    p = PI5.thermal_model
    guard = Guard(Limits.resolve(PI5.thermal)[0], p)
    for step in range(1200):  # ten minutes idle at 46.5 °C
        guard.observe(step * 0.5, Reading(time=step * 0.5, zones={"cpu-thermal": 46.5}))
    assert guard.sensor_ok
    assert guard.frozen_s is None

    def coarse(sensor: SimulatedSensor) -> Reading:
        reading = sensor.read()
        reading.zones["cpu-thermal"] = round(reading.zones["cpu-thermal"] * 2) / 2
        return reading

    guard, warnings, _ = _run(_board(start_c=None), coarse, 64, 900.0)
    assert guard.sensor_ok
    assert not warnings


# -- (3) telemetry through a power cut -----------------------------------------------------------------------


def test_telemetry_is_synced_to_disk_when_the_guard_changes_state_not_per_record(tmp_path, monkeypatch):
    """A power cut (where a board's thermal trouble ends) loses what the page cache holds: up to 30 s of records,
    the ones that show how the board got there. A record that changes the guard's level (or pause, sensor,
    firmware state) is fsynced; others are not (an fsync per record would cost more than the guard's budget)."""
    synced: list[int] = []
    real_fsync = os.fsync
    path = tmp_path / "run.jsonl"

    def spy(fd: int) -> None:  # os.fsync itself runs; the test only counts the records in the file at each call
        real_fsync(fd)
        synced.append(sum(1 for line in path.read_text().splitlines() if '"step"' in line))

    monkeypatch.setattr(os, "fsync", spy)
    telemetry = Telemetry(path, {"profile": "rpi5"}, keep=False)
    levels = ["normal"] * 5 + ["warm"] * 5 + ["hot"] * 5
    for index, level in enumerate(levels):
        telemetry.step(t=float(index), kind="decode", tokens=1, level=level, paused=False, sensor_ok=True)
    assert synced == [1, 6, 11]  # the first record, and each that changed the level
    telemetry.close()
    assert synced[-1] == len(levels)  # and at close
    assert [json.loads(line)["type"] for line in path.read_text().splitlines()][-1] == "step"
