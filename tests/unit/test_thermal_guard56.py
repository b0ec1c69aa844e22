"""Thermal guard: a pause entered straight from below hot, the integral while the firmware limits the board, and
the warning for a stale reading."""

from __future__ import annotations

from edgesdk.profile import get_profile
from edgesdk.thermal.guard import Guard, Level, Limits
from edgesdk.thermal.sensors import Reading
from edgesdk.thermal.simulator import SimulatedBoard, SimulatedSensor

RPI5 = get_profile("rpi5")


def _guarded_board(ambient_c: float, start_c: float) -> tuple[Guard, SimulatedBoard, SimulatedSensor]:
    board = SimulatedBoard.from_profile(RPI5, ambient_c, start_c=start_c)
    sensor = SimulatedSensor(board)
    limits, _ = Limits.resolve(RPI5.thermal, sensor.trips(RPI5))
    return Guard(limits, RPI5.thermal_model), board, sensor


def test_a_pause_entered_from_normal_ends_into_hot_at_the_steady_state_rate():
    """A first reading above the hard limit (a board still hot from an earlier run) went from normal straight to
    critical: the integral was never seeded with the rate that holds the setpoint, so the pause (which holds it)
    ended into hot, after one time constant, pacing a Pi 5 in a 45 °C enclosure at 82 % of the unpaced rate, where
    the model's steady state is 2.4 %: back at the hard limit in seconds, and paused again for 238 s."""
    guard, board, sensor = _guarded_board(ambient_c=45.0, start_c=79.0)
    guard.observe(board.t, sensor.read())
    assert guard.level is Level.CRITICAL
    while guard.paused:
        board.sleep(0.5)
        guard.observe(board.t, sensor.read())
    assert guard.level is Level.HOT  # the board idles at 71.6 °C, above resume_c: the pause ends by its time bound
    model = RPI5.thermal_model
    steady = ((guard.setpoint_c - 45.0) / model.resistance_c_per_w - model.idle_w) / (model.active_w - model.idle_w)
    assert guard.fraction <= max(steady, guard.config.min_fraction) + 0.01


def _reading(t: float, temp_c: float, **flags: bool) -> Reading:
    return Reading(t, {"cpu-thermal": temp_c}, throttled=flags or None)


def test_firmware_limiting_does_not_wind_the_integral_up():
    """Under-voltage pins the pace at the fixed fallback rate; a board held just below the setpoint by it wound the
    PI integral up for as long as the flag stood (0.22 -> 0.89 in 5 minutes), and the pace jumped to 96 % of the
    unpaced rate the moment the flag cleared, from a board already in hot."""
    limits, _ = Limits.resolve(RPI5.thermal)
    guard = Guard(limits, RPI5.thermal_model)
    guard.observe(0.0, _reading(0.0, 60.0))
    guard.observe(1.0, _reading(1.0, 72.5))
    assert guard.level is Level.HOT
    paced = guard.fraction
    assert paced < guard.config.fallback_fraction
    t = 1.0
    for _ in range(600):
        t += 0.5
        guard.observe(t, _reading(t, 72.5, under_voltage=True))
        assert guard.fraction <= guard.config.fallback_fraction
    t += 0.5
    guard.observe(t, _reading(t, 72.5, under_voltage=False))
    assert not guard.firmware_limited
    assert guard.level is Level.HOT
    # from the fixed pace it held, plus the proportional term (Kp = RC / (K response_s)) of the 0.5 °C it is under
    model = RPI5.thermal_model
    gain = model.resistance_c_per_w * (model.active_w - model.idle_w)
    kp = model.resistance_c_per_w * model.capacity_j_per_c / (gain * guard.config.response_s)
    assert guard.fraction <= guard.config.fallback_fraction + kp * (guard.setpoint_c - 72.5) + 0.01


def test_a_stale_reading_is_named_as_stale_not_as_no_data():
    """A poller whose sensor read hangs keeps its last reading; the guard took it as no data, rightly, but warned
    "no data from sysfs cpu-thermal", blaming a sensor that had answered, and gave neither its age nor the limit."""
    limits, _ = Limits.resolve(RPI5.thermal)
    warnings: list[str] = []
    guard = Guard(limits, RPI5.thermal_model, warn=warnings.append)
    reading = Reading(0.0, {"cpu-thermal": 60.0}, source="sysfs cpu-thermal")
    guard.observe(0.0, reading)
    guard.observe(12.0, reading)
    assert not guard.sensor_ok
    (warning,) = warnings
    assert "no data from" not in warning
    assert "12 s old" in warning
    assert f"stale_s {guard.config.stale_s:g} s" in warning
    assert "sysfs cpu-thermal" in warning
