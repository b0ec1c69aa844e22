"""Thermal guard, review 57: a frozen sensor under the guard's own clock cap (--clock-cap)."""

from __future__ import annotations

import pytest

from edgesdk.profile import get_profile
from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.thermal.cpufreq import CpuFreqCap
from edgesdk.thermal.guard import CLOCK_CAP_RATIO, Guard, GuardConfig, Level, Limits
from edgesdk.thermal.plan import _StubDecoder
from edgesdk.thermal.sensors import Reading
from edgesdk.thermal.simulator import PastHorizon, SimulatedBoard, SimulatedSensor, WorkModel, power_ratio
from edgesdk.thermal.telemetry import Telemetry
from edgesdk.thermal.watch import HorizonReached, ThermalHook, open_session
from tests._utils.sysfs import make_cpufreq_policy, make_zone

PI5 = get_profile("rpi5")
ZONE = "cpu-thermal"


def _frozen_from(sensor: SimulatedSensor, freeze_c: float):
    """The sensor's readings, frozen at the first one at or above ``freeze_c`` (a driver that stopped updating)."""
    held: dict[str, float] = {}

    def read() -> Reading:
        reading = sensor.read()
        if "c" in held or reading.zones[ZONE] >= freeze_c:
            held.setdefault("c", reading.zones[ZONE])
            reading.zones[ZONE] = held["c"]
        return reading

    return read


def _run_frozen(ambient_c: float, clock_cap: bool, horizon_s: float = 1200.0):
    """A bare simulated Pi 5 serving 64+256-token requests back to back under the guard until ``horizon_s``, its
    sensor frozen at 72 °C (in the guard's hot band, under the 73 °C setpoint) as it first gets there."""
    board = SimulatedBoard.from_profile(PI5, ambient_c, work=WorkModel(decode_tok_s=10.0, prefill_tok_s=40.0),
                                        horizon_s=horizon_s)
    sensor = SimulatedSensor(board, ZONE)
    warnings: list[str] = []
    config = GuardConfig(hot_clock_ratio=CLOCK_CAP_RATIO if clock_cap else None)
    guard = Guard(Limits.resolve(PI5.thermal, sensor.trips(PI5, ZONE))[0], PI5.thermal_model, config,
                  warn=warnings.append)
    hook = ThermalHook(board, _frozen_from(sensor, 72.0), guard, board, Telemetry(), horizon_s=horizon_s,
                       clock_cap=board if clock_cap else None)
    try:
        while True:
            generate(_StubDecoder(), [2] * 64, SamplingConfig(max_new_tokens=256), stop_ids=set(), hook=hook)
    except (HorizonReached, PastHorizon):
        pass
    return board, guard, warnings


@pytest.mark.parametrize("ambient_c", [20.0, 30.0])
def test_a_sensor_frozen_while_the_guard_caps_the_clock_is_taken_as_failed(ambient_c):
    """With --clock-cap the guard caps the clock while it paces, and the model's power was then "not known": a run
    of identical readings was never judged, so a sensor frozen in the hot band under the setpoint was trusted for
    ever. The controller wound its rate up to the full unpaced rate at the capped clock, and the board heated past
    the hard limit (78 °C) into the firmware's throttle (80 °C) with the guard still reading 72 °C, no warning.
    The cap's power is modelled now (f V^2): the sensor is taken as frozen, warned of once, and the board is paced
    at the fallback rate with the clock still capped, as it is without the cap."""
    board, guard, warnings = _run_frozen(ambient_c, clock_cap=True)
    assert not guard.sensor_ok
    assert guard.frozen_s is not None
    failed = [w for w in warnings if "thermal sensor failed" in w]
    assert len(failed) == 1, warnings
    assert "frozen" in failed[0]
    assert guard.clock_ratio == CLOCK_CAP_RATIO
    assert guard.fraction <= guard.config.fallback_fraction
    assert board.peak_c < guard.limits.hard_c
    assert board.throttled_s == 0.0


def test_the_capped_and_uncapped_guards_both_catch_the_same_frozen_sensor():
    """Both paths treat the frozen sensor the same way: taken as failed, one warning, the fallback pace."""
    for clock_cap in (False, True):
        _, guard, warnings = _run_frozen(20.0, clock_cap=clock_cap)
        assert not guard.sensor_ok, clock_cap
        assert guard.fraction <= guard.config.fallback_fraction
        assert sum("frozen" in w for w in warnings) == 1, (clock_cap, warnings)


def test_a_steady_reading_at_the_capped_clock_is_not_taken_as_frozen():
    """The judgement under the cap takes the capped clock's power, not the full clock's: a board in a 32 °C room
    busy half of the time at the capped clock settles at 73.4 °C (2.8 W + 6.2 W x 0.5 x 0.502 = 4.36 W, R 9.5 °C/W),
    where the full clock's power says 88 °C; its coarse sensor reading that value for ten minutes is a board at
    rest, not a frozen sensor."""
    p = PI5.thermal_model
    guard = Guard(Limits.resolve(PI5.thermal)[0], p, GuardConfig(hot_clock_ratio=CLOCK_CAP_RATIO))
    share, ambient = 0.5, 32.0
    steady = ambient + p.resistance_c_per_w * (p.idle_w + (p.active_w - p.idle_w) * share * power_ratio(CLOCK_CAP_RATIO))
    assert steady > guard.thresholds[Level.HOT]  # the guard paces, so the clock is capped
    guard.ambient_c = ambient  # the room, as the ambient tracking learns it before a cap (not from a first reading)
    guard.clock_applied = CLOCK_CAP_RATIO  # as the hook reports it, the actuator's cap applied as asked
    dt = 0.5
    for step in range(1200):  # ten minutes at the same reading
        guard.observe(step * dt, Reading(time=step * dt, zones={ZONE: round(steady, 1)}))
        guard.spend("decode", 1, dt * share)
    assert guard.clock_ratio == CLOCK_CAP_RATIO
    assert guard.sensor_ok
    assert guard.frozen_s is None


def _settled_at(guard: Guard, temp_c: float, share: float = 0.5, minutes: float = 10.0) -> Guard:
    """``guard`` reading ``temp_c`` at every half-second poll for ``minutes``, the board busy ``share`` of the time."""
    dt = 0.5
    for step in range(int(minutes * 60 / dt)):
        guard.observe(step * dt, Reading(time=step * dt, zones={ZONE: temp_c}))
        guard.spend("decode", 1, dt * share)
    return guard


def test_a_settled_board_is_not_taken_as_frozen_where_the_cap_applied_is_not_known():
    """The cap the guard asks for is not the clock the board runs at (rounded up to an offered frequency, held up by
    scaling_min_freq, a write that failed; another board's table, a Jetson's GPU power): counting its compute at the
    asked cap's share of power, a Pi 5 in a 32 °C room settled at full clock, busy half the time and read at
    76.3 °C for ten minutes, was taken as a frozen sensor and paced at the fallback rate. With no clock reported as
    applied the capped power is not known, and the run is not judged, as before the cap was modelled."""
    guard = _settled_at(Guard(Limits.resolve(PI5.thermal)[0], PI5.thermal_model,
                              GuardConfig(hot_clock_ratio=CLOCK_CAP_RATIO)), 76.3)
    assert guard.clock_ratio == CLOCK_CAP_RATIO  # the guard paces and asks for the cap all along
    assert guard.sensor_ok
    assert guard.frozen_s is None


def test_a_reported_cap_is_judged_at_the_clock_applied():
    """With the cap reported as applied, a reading held for ten minutes where the model expects the board to move is
    still judged, at the clock applied: 70 °C under the capped clock (which settles near 73.4 °C in a 32 °C room),
    76.3 °C under a cap held up at full clock by scaling_min_freq (full power: 88 °C)."""
    p = PI5.thermal_model
    capped = Guard(Limits.resolve(PI5.thermal)[0], p, GuardConfig(hot_clock_ratio=CLOCK_CAP_RATIO))
    capped.ambient_c, capped.clock_applied = 32.0, CLOCK_CAP_RATIO
    assert not _settled_at(capped, 70.0).sensor_ok  # 73.4 °C expected at the capped clock: 70 °C cannot hold
    pinned = Guard(Limits.resolve(PI5.thermal)[0], p, GuardConfig(hot_clock_ratio=CLOCK_CAP_RATIO))
    pinned.ambient_c, pinned.clock_applied = 32.0, 1.0
    assert not _settled_at(pinned, 76.3).sensor_ok  # 88 °C expected at full clock


def test_cpufreq_reports_the_clock_it_applied_and_the_hook_passes_it_on_with_its_power_table(tmp_path):
    """cpufreq's cap rounds up to an offered frequency and never goes below scaling_min_freq: the clock applied is
    the one written over the ceiling (1.8 of 2.4 GHz where the floor is 1.8 GHz), not the 62.5 % asked; the hook
    hands it to the guard on every board, saying whether the Pi 5's power table applies to it."""
    offered = [1_500_000 + 100_000 * i for i in range(10)]
    make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_800_000, offered)
    cap = CpuFreqCap(tmp_path)
    assert cap.applied_ratio is None  # nothing asked
    guard = Guard(Limits.resolve(PI5.thermal)[0], PI5.thermal_model, GuardConfig(hot_clock_ratio=CLOCK_CAP_RATIO))
    temps = iter([76.0] * 4)

    class Clock:
        t = 0.0

        def now(self):
            Clock.t += 1.0
            return Clock.t

    def read():
        return Reading(time=Clock.t, zones={ZONE: next(temps)})

    for table in (True, False):
        hook = ThermalHook(Clock(), read, guard, clock_cap=cap, cap_pi5_table=table)
        hook._observe()
        assert cap.applied_ratio == 0.75
        assert guard.clock_applied == 0.75
        assert guard.clock_pi5_table is table
        assert guard._dynamic_share == (power_ratio(0.75) if table else 0.75)
    cap.set_ratio(None)
    assert cap.applied_ratio is None


def test_a_frozen_sensor_is_caught_under_a_cpufreq_cap_on_a_board_that_is_not_a_pi5(tmp_path):
    """cpufreq's applied cap was passed on to the guard for a profile named rpi5 only: on a Pi 4 (a Jetson, a copy of
    rpi5.yaml under another name) the capped power was not known, so under --clock-cap a run of identical readings
    was never judged while the guard paced, and a sensor frozen at 72 °C let the controller wind up to the full rate
    while a board in a 40 °C room heated into the firmware's throttle. The cap applied is reported on every cpufreq board; where
    the Pi 5's f V^2 table does not apply, the capped power is taken as f alone (more than the board draws: a settled
    board errs towards "frozen", the safe side), and the frozen sensor is caught."""
    pi4 = get_profile("rpi4")
    make_cpufreq_policy(tmp_path, 0, 1_500_000, 600_000, [600_000 + 100_000 * i for i in range(10)])
    cpufreq = CpuFreqCap(tmp_path)
    board = SimulatedBoard.from_profile(pi4, 40.0, work=WorkModel(decode_tok_s=10.0, prefill_tok_s=40.0),
                                        horizon_s=1200.0)

    class Cap:  # cpufreq, the board's clock following the cap it applied (a real board's does)
        applied_ratio = property(lambda self: cpufreq.applied_ratio)

        def set_ratio(self, ratio):
            cpufreq.set_ratio(ratio)
            board.set_ratio(cpufreq.applied_ratio)

    sensor = SimulatedSensor(board, ZONE)
    warnings: list[str] = []
    guard = Guard(Limits.resolve(pi4.thermal, sensor.trips(pi4, ZONE))[0], pi4.thermal_model,
                  GuardConfig(hot_clock_ratio=CLOCK_CAP_RATIO), warn=warnings.append)
    hook = ThermalHook(board, _frozen_from(sensor, 72.0), guard, board, Telemetry(), horizon_s=1200.0, clock_cap=Cap())
    try:
        while True:
            generate(_StubDecoder(), [2] * 64, SamplingConfig(max_new_tokens=256), stop_ids=set(), hook=hook)
    except (HorizonReached, PastHorizon):
        pass
    assert guard.clock_ratio == CLOCK_CAP_RATIO
    assert guard.clock_applied == cpufreq.applied_ratio == 1_000_000 / 1_500_000  # 62.5 % asked: 937.5 MHz, up
    assert not guard.sensor_ok
    assert sum("frozen" in w for w in warnings) == 1, warnings
    assert guard.fraction <= guard.config.fallback_fraction
    assert board.peak_c < guard.limits.hard_c
    assert board.throttled_s == 0.0


@pytest.mark.parametrize(("profile", "table", "moves"), [
    (PI5.model_copy(update={"name": "my-pi5-4gb"}), True, True), (get_profile("rpi4"), False, True),
    (get_profile("orin-nano-8gb"), False, False)])
def test_the_pi5_power_table_is_chosen_by_the_profile_s_soc_not_its_name(tmp_path, monkeypatch, profile, table,
                                                                          moves):
    """A copy of rpi5.yaml under another name is still a BCM2712 board, whose clock the Pi 5's table models; a Pi 4
    is not (its capped power is taken as f alone); a Jetson may decode on its GPU, whose power a CPU clock cap
    barely moves, so its capped power is left unknown."""
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    make_cpufreq_policy(tmp_path / "fs", 0, 2_400_000, 600_000, [600_000 + 100_000 * i for i in range(19)])
    make_zone(tmp_path / "thermal", 0, profile.thermal.zones[0], "50000\n")
    session = open_session(profile, guard=True, status=False, sysfs_root=str(tmp_path / "thermal"),
                           clock_cap=True, cpufreq_root=str(tmp_path / "fs"))
    try:
        assert session.hook.cap_pi5_table is table
        assert session.hook.cap_moves_power is moves
    finally:
        session.close()
