"""Guard levels, hysteresis, dwell, sensor failures and pacing, read from a temporary sysfs tree.

rpi5 limits: resume 70, soft 75, hard 78, firmware throttle 80 °C. With the default GuardConfig the
thresholds are warm 70, hot 71.5 (setpoint 73 - 1.5), critical 78; hysteresis 1 °C, dwell 10 s.
"""

from __future__ import annotations

import pytest

from edgesdk.profile import get_profile
from edgesdk.thermal.guard import Guard, GuardConfig, Level, Limits
from edgesdk.thermal.sensors import SysfsThermal, Trip
from tests._utils.sysfs import make_zone

PROFILE = get_profile("rpi5")


class Tree:
    """One ``cpu-thermal`` zone on disk and a hand-driven clock."""

    def __init__(self, root):
        self.zone = make_zone(root, 0, "cpu-thermal", None)
        self.now = 0.0
        self.sysfs = SysfsThermal(root, ["cpu-thermal"], clock=lambda: self.now)

    def write(self, text: str) -> None:
        (self.zone / "temp").write_text(text)

    def feed(self, guard: Guard, temp_c: float, dt: float = 1.0) -> Level:
        self.now += dt
        self.write(f"{round(temp_c * 1000)}\n")
        return guard.observe(self.now, self.sysfs.read())


class Gate:
    """A backend with the power gate's compute-budget knob."""

    def __init__(self):
        self.budgets = []

    def set_compute_budget(self, fraction: float) -> None:
        self.budgets.append(fraction)


@pytest.fixture
def tree(tmp_path):
    return Tree(tmp_path)


def make_guard(**kwargs) -> Guard:
    warnings = kwargs.pop("warnings", None)
    limits, _ = Limits.resolve(PROFILE.thermal)
    return Guard(limits, PROFILE.thermal_model, GuardConfig(**kwargs), kwargs.pop("target", None),
                 warn=None if warnings is None else warnings.append)


def test_thresholds_come_from_the_profile():
    guard = make_guard()
    assert guard.thresholds == {Level.WARM: 70, Level.HOT: 71.5, Level.CRITICAL: 78}
    assert guard.setpoint_c == 73


def test_levels_rise_at_once(tree):
    guard = make_guard()
    assert tree.feed(guard, 60) is Level.NORMAL
    assert tree.feed(guard, 70.0, dt=0.1) is Level.WARM
    assert tree.feed(guard, 71.5, dt=0.1) is Level.HOT
    assert tree.feed(guard, 78.0, dt=0.1) is Level.CRITICAL
    assert guard.paused


def test_a_jump_goes_straight_to_critical(tree):
    guard = make_guard()
    tree.feed(guard, 60)
    assert tree.feed(guard, 90) is Level.CRITICAL


def test_critical_holds_until_below_the_resume_temperature(tree):
    guard = make_guard()
    tree.feed(guard, 79)
    assert tree.feed(guard, 75, dt=30) is Level.CRITICAL  # cooler, but not below resume_c
    assert tree.feed(guard, 70.2, dt=30) is Level.CRITICAL
    assert tree.feed(guard, 69.6, dt=30) is Level.WARM  # 69.6 + 1 °C hysteresis is still warm
    assert not guard.paused


def test_critical_respects_the_minimum_dwell(tree):
    guard = make_guard()
    tree.feed(guard, 79)
    assert tree.feed(guard, 60, dt=5) is Level.CRITICAL  # below resume, but only 5 s in critical
    assert tree.feed(guard, 60, dt=5) is Level.NORMAL


def test_hysteresis_on_the_way_down(tree):
    guard = make_guard()
    tree.feed(guard, 71.6)
    assert guard.level is Level.HOT
    assert tree.feed(guard, 71.0, dt=20) is Level.HOT  # below 71.5 but inside the 1 °C band
    assert tree.feed(guard, 70.4, dt=1) is Level.WARM
    assert tree.feed(guard, 69.3, dt=20) is Level.WARM  # below 70 but inside the band
    assert tree.feed(guard, 68.9, dt=1) is Level.NORMAL


def test_minimum_dwell_before_stepping_down(tree):
    guard = make_guard()
    tree.feed(guard, 72)
    assert tree.feed(guard, 60, dt=4) is Level.HOT
    assert tree.feed(guard, 60, dt=4) is Level.HOT
    assert tree.feed(guard, 60, dt=4) is Level.NORMAL  # 12 s after entering hot


def test_oscillation_around_a_threshold_does_not_flap(tree):
    guard = make_guard(min_dwell_s=0.0)
    tree.feed(guard, 70.2)
    levels = {tree.feed(guard, t) for t in (69.8, 70.1, 69.5, 70.3, 69.2)}
    assert levels == {Level.WARM}


def test_warm_and_hot_lower_the_compute_budget_through_the_power_gate(tree):
    gate = Gate()
    limits, _ = Limits.resolve(PROFILE.thermal)
    guard = Guard(limits, PROFILE.thermal_model, GuardConfig(min_dwell_s=0.0), budget_target=gate)
    for temp in (60, 70.5, 72, 79, 69.5, 60):
        tree.feed(guard, temp, dt=1)
    assert gate.budgets == [0.75, 0.5, 0.75, 1.0]  # warm, hot (and critical), back to warm, normal
    plain = Guard(limits, PROFILE.thermal_model, budget_target=object())  # no power gate: still works
    assert plain.budget_target is None
    tree.feed(plain, 72)
    assert plain.budget == 0.5
    assert plain.level is Level.HOT


@pytest.mark.parametrize(("content", "what"), [
    ("-256000\n", "offline sensor (-256 °C)"),
    ("garbage\n", "garbage"),
    (None, "temp file missing"),
])
def test_failed_sensor_warns_once_and_paces_at_a_fixed_rate(tree, content, what):
    warnings = []
    guard = make_guard(warnings=warnings)
    tree.feed(guard, 60)
    guard.spend("decode", 1, 0.05)  # unpaced rate now known: 20 tok/s
    tree.now += 1
    if content is None:
        (tree.zone / "temp").unlink()
    else:
        tree.write(content)
    for _ in range(3):
        tree.now += 1
        guard.observe(tree.now, tree.sysfs.read())
    assert not guard.sensor_ok, what
    assert len(warnings) == 1
    assert "fixed 50%" in warnings[0]
    assert guard.pacing
    assert guard.rate_limit_tok_s == pytest.approx(10.0)
    assert guard.budget == 0.5
    guard.spend("decode", 1, 0.05)
    assert guard.wait_s("decode") == pytest.approx(0.1)  # a steady 10 tok/s, no stored burst
    assert tree.feed(guard, 61) is Level.NORMAL  # data again: back to normal operation
    assert guard.sensor_ok
    assert not guard.pacing
    assert guard.wait_s("decode") == 0


def test_stale_reading_and_no_reading_are_failures(tree):
    warnings = []
    guard = make_guard(warnings=warnings, stale_s=5.0)
    tree.feed(guard, 60)
    old = tree.sysfs.read()
    assert guard.observe(tree.now + 4.9, old) is Level.NORMAL
    assert guard.sensor_ok
    guard.observe(tree.now + 5.1, old)  # a poller stuck on its last reading
    assert not guard.sensor_ok
    guard.observe(tree.now + 6, None)
    assert not guard.sensor_ok
    assert len(warnings) == 1


def test_no_zone_at_all_is_a_failed_sensor(tmp_path):
    sysfs = SysfsThermal(tmp_path / "empty", ["cpu-thermal"])
    guard = make_guard()
    guard.observe(0.0, sysfs.read())
    assert not guard.sensor_ok
    assert guard.pacing


def test_pacing_waits_before_a_request_and_between_tokens(tree):
    guard = make_guard()
    guard.begin(100)
    tree.feed(guard, 60)
    guard.spend("decode", 1, 0.05)  # 20 tok/s unpaced
    assert guard.wait_s("prefill") == 0
    assert guard.wait_s("decode") == 0
    tree.feed(guard, 72)
    assert guard.level is Level.HOT
    rate = guard.rate_limit_tok_s
    assert 0 < rate < 20
    assert guard.wait_s("prefill") == 0  # entering hot starts with one request's worth of credit
    for _ in range(100):
        guard.spend("decode", 1, 0.05)
    assert guard.wait_s("decode") == pytest.approx(1 / rate, rel=1e-6)
    assert guard.wait_s("prefill") == pytest.approx(100 / rate, rel=1e-6)  # the next request waits for its credit
    tree.feed(guard, 79)
    assert guard.wait_s("decode") == guard.config.poll_s  # critical: paused, asked again after each poll


def test_rate_controller_slows_down_when_hotter_and_speeds_up_when_cooler(tree):
    guard = make_guard()
    tree.feed(guard, 72)
    guard.spend("decode", 1, 0.05)
    start = guard.fraction
    tree.feed(guard, 74.5, dt=5)
    hotter = guard.fraction
    tree.feed(guard, 71.8, dt=5)
    assert hotter < start < 1.0
    assert guard.fraction > hotter


def test_board_trip_points_lower_the_limits():
    trips = [Trip("cpu-thermal", 0, "active", 50.0), Trip("cpu-thermal", 1, "passive", 76.0),
             Trip("cpu-thermal", 2, "critical", 100.0)]
    limits, notes = Limits.resolve(PROFILE.thermal, trips)
    assert (limits.resume_c, limits.soft_c, limits.hard_c, limits.throttle_c, limits.shutdown_c) == (66, 71, 74, 76, 100)
    assert len(notes) == 2
    assert "cpu-thermal[1] 76 °C" in notes[0]
    assert "lowered by 4" in notes[0]
    same, notes = Limits.resolve(PROFILE.thermal, [Trip("cpu-thermal", 0, "critical", 110.0),
                                                   Trip("cpu-thermal", 1, "active", 60.0)])
    assert (same.soft_c, same.throttle_c, same.shutdown_c) == (75, 80, 110)
    assert notes == []


def test_a_critical_trip_below_the_throttle_point_lowers_every_limit():
    """Orin Nano profile: throttle 99, shutdown 104.5 (5.5 °C apart). A board whose critical trip is
    88 °C shuts down below the profile's hard limit: every limit moves down under it."""
    orin = get_profile("orin-nano-8gb").thermal
    limits, notes = Limits.resolve(orin, [Trip("cpu-thermal", 0, "critical", 88.0)])
    assert limits.shutdown_c == 88.0
    assert limits.throttle_c == pytest.approx(82.5)  # the profile's 5.5 °C below the board's trip
    assert (limits.resume_c, limits.soft_c, limits.hard_c) == pytest.approx((63.5, 68.5, 73.5))  # moved by 16.5
    assert limits.hard_c < limits.throttle_c < limits.shutdown_c
    assert any("critical trip cpu-thermal[0] 88 °C" in note and "lowered by 16.5" in note for note in notes)
    guard = Guard(limits, get_profile("orin-nano-8gb").thermal_model)
    assert guard.thresholds[Level.CRITICAL] < 88.0


def test_unset_and_implausible_trips_are_ignored_with_a_note(tmp_path):
    """x86_pkg_temp exposes unset passive trips as 0 m°C; the host profile watches it."""
    from edgesdk.thermal.sensors import detect_sensors

    make_zone(tmp_path, 0, "x86_pkg_temp", "45000\n", trips=[("passive", 0, None), ("passive", 0, None)])
    make_zone(tmp_path, 1, "acpitz", "40000\n", trips=[("hot", 30000, None), ("critical", 115000, None)])
    host = get_profile("host")
    _, trips, _ = detect_sensors(host.thermal.zones, tmp_path, which=lambda name: None, use_jtop=False)
    limits, notes = Limits.resolve(host.thermal, trips)
    profile_limits, _ = Limits.resolve(host.thermal)
    assert limits == profile_limits
    assert sum("x86_pkg_temp[" in note and "0 °C ignored" in note for note in notes) == 2
    assert any("acpitz[0] 30 °C ignored" in note and "resume point 75 °C" in note for note in notes)


def test_firmware_flags_pace_at_the_fixed_rate_until_they_clear():
    """vcgencmd get_throttled: under-voltage or throttling now slows the board whatever the temperature
    says, so the guard paces at the fallback rate; the since-boot bits alone change nothing."""
    from edgesdk.thermal.sensors import Reading

    def reading(t: float, flags: dict | None = None) -> Reading:
        return Reading(time=t, zones={"cpu-thermal": 55.0}, throttled=flags, source="vcgencmd")

    warnings = []
    guard = make_guard(warnings=warnings)
    guard.observe(1.0, reading(1.0))
    guard.spend("decode", 1, 0.05)  # 20 tok/s unpaced
    assert not guard.pacing
    for t in (2.0, 3.0):
        guard.observe(t, reading(t, {"under_voltage": True, "throttled": True, "under_voltage_occurred": True}))
    assert guard.level is Level.NORMAL
    assert guard.pacing
    assert guard.rate_limit_tok_s == pytest.approx(10.0)
    assert guard.state()["firmware_limited"]
    assert len(warnings) == 1
    assert "under_voltage, throttled" in warnings[0]  # in bit order, as the status line names them
    guard.observe(4.0, reading(4.0, {"under_voltage_occurred": True, "throttling_occurred": True}))
    assert not guard.pacing
    assert guard.wait_s("decode") == 0


def test_firmware_flags_pace_an_answer_from_its_first_tokens():
    """Under-voltage at a cool temperature leaves the thermal headroom (the bucket) full: without a bucket
    of one token while the flags are up, a whole answer went through at the unpaced rate the warning said
    was halved. The hook drives the guard on a simulated clock; each step takes 0.05 s (20 tok/s unpaced)."""
    from edgesdk.thermal.sensors import Reading
    from edgesdk.thermal.watch import ThermalHook
    from tests._utils.clock import ManualClock

    clock, guard = ManualClock(), make_guard()
    flags = {}
    hook = ThermalHook(clock, lambda: Reading(time=clock.t, zones={"cpu-thermal": 55.0}, throttled=dict(flags),
                                              source="vcgencmd"), guard)
    hook.begin(1, 128)
    hook.after_step("decode", 1, 0.05)  # the unpaced rate is known: 20 tok/s
    flags["under_voltage"] = True
    start = clock.t
    for _ in range(40):
        hook.before_step("decode")
        clock.t += 0.05
        hook.after_step("decode", 1, 0.05)
    assert guard.rate_limit_tok_s == pytest.approx(10.0)
    assert 40 / (clock.t - start) < 11.0
