"""Thermal guard: the power model under a ``--compute-budget`` below 1, and the ambient guessed from a first reading
that was a bad read (0 °C, a spike)."""

from __future__ import annotations

from edgesdk.power.controller import ControllerConfig, TauController
from edgesdk.profile import get_profile
from edgesdk.thermal.guard import Guard, Level, Limits
from edgesdk.thermal.sensors import Reading
from edgesdk.thermal.simulator import SimulatedBoard, SimulatedSensor

RPI5 = get_profile("rpi5")
MODEL = RPI5.thermal_model


def _limits() -> Limits:
    return Limits.resolve(RPI5.thermal, SimulatedSensor.trips(RPI5))[0]


def test_a_compute_budget_below_1_is_not_taken_for_a_frozen_sensor():
    """``--compute-budget 0.3`` holds the power gate under 30 % of the FFN blocks from the first step: the board
    draws far less than the profile's active power. The guard judged the model's power wrong only when its own
    budget was below 1, so at the normal level a bare Pi 5 (20 °C room, computing half the time) whose sensor reads
    whole degrees, warming far slower than the model predicted, was taken as a frozen sensor within a minute and
    paced at the fixed fallback rate for the rest of the run."""
    gate = TauController(ControllerConfig(compute_budget=0.3))
    dynamic = 0.3 * (MODEL.active_w - MODEL.idle_w)  # the gated board's power: most FFN blocks skipped
    board = SimulatedBoard(MODEL.model_copy(update={"active_w": MODEL.idle_w + dynamic}),
                           RPI5.thermal.firmware_throttle_c, ambient_c=20.0)
    warnings: list[str] = []
    guard = Guard(_limits(), MODEL, budget_target=gate, warn=warnings.append)

    def read() -> Reading:
        return Reading(board.t, {"cpu-thermal": float(round(board.temp_c))}, source="sysfs cpu-thermal")

    guard.observe(board.t, read())
    assert guard.budget_in_force == 0.3
    while board.t < 600.0:
        board.compute("decode", 1, 0.5)  # WorkModel without rates: the measured 0.5 s
        guard.spend("decode", 5, 0.5)
        board.sleep(0.5)
        guard.observe(board.t, read())
        assert guard.sensor_ok, warnings
    assert guard.level is Level.NORMAL
    assert not guard.pacing
    assert warnings == []


def _guard_a_warm_board(first_c: float | None) -> tuple[Guard, SimulatedBoard, list[float]]:
    """A Pi 5 in a 45 °C enclosure read first at 73 °C (or at ``first_c``: a bad read), decoding as the guard
    allows for 300 s; the ambient the guard holds at each poll."""
    board = SimulatedBoard.from_profile(RPI5, 45.0, start_c=73.0)
    sensor = SimulatedSensor(board, "cpu-thermal")
    guard = Guard(Limits.resolve(RPI5.thermal, sensor.trips(RPI5))[0], MODEL)
    first = sensor.read()
    if first_c is not None:
        first.zones = {"cpu-thermal": first_c}
    guard.observe(board.t, first)
    ambients = []
    while board.t < 300.0:
        wait = guard.wait_s("decode")
        if wait > 0:
            board.sleep(min(wait, guard.config.poll_s))
        else:
            guard.spend("decode", 1, board.compute("decode", 1, 0.1))
        guard.observe(board.t, sensor.read())
        ambients.append(guard.ambient_c)
    return guard, board, ambients


def test_a_first_reading_of_0_c_does_not_set_the_ambient():
    """The first reading is the one a bad read cannot be held at (there is no last one): a sensor's 0 °C there set a
    Pi 5's ambient to -26.6 °C. The board, read at 73 °C next, entered hot at the full rate (its steady-state rate is
    2 %), reached the hard limit and was paused; the first re-estimate, measured across the jump, put the ambient at
    the board's own temperature (75.9 °C)."""
    clean, clean_board, _ = _guard_a_warm_board(None)
    guard, board, ambients = _guard_a_warm_board(0.0)
    assert abs(ambients[0] - clean.ambient_c) < 3.0  # 73 °C - R idle_w, then re-estimated as the clean guard's
    assert all(40.0 < ambient < 50.0 for ambient in ambients)  # a 45 °C enclosure
    assert board.peak_c < RPI5.thermal.hard_limit_c
    assert abs(board.peak_c - clean_board.peak_c) < 0.1
    assert guard.level is Level.HOT
    assert not guard.paused


def test_a_first_reading_that_spiked_does_not_set_the_ambient():
    """A first reading of 150 °C (garbage a sensor can give inside the valid range) is taken, hot being the safe
    side, and the reading back at 60 °C, once a second poll confirms it, re-seeds the ambient: seeded from the spike
    alone, it stayed at 123 °C, above the board, until the first re-estimate."""
    guard = Guard(_limits(), MODEL)
    for t, temp in enumerate((150.0, 60.0, 60.0)):
        guard.observe(0.5 * t, Reading(0.5 * t, {"cpu-thermal": temp}))
    assert guard.temp_c == 60.0
    assert guard.ambient_c == 60.0 - MODEL.resistance_c_per_w * MODEL.idle_w
