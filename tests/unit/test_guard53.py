"""Thermal guard review 53: the Raspberry Pi firmware's flags in the records and the status line.

``vcgencmd get_throttled`` (Raspberry Pi documentation, ``get_throttled``): bit 0 under-voltage, bit 1 Arm frequency
capped, bit 2 throttled, bit 3 soft temperature limit, now; bits 16-19 the same since boot.
"""

from __future__ import annotations

from edgesdk.profile import get_profile
from edgesdk.thermal.guard import Guard, Limits
from edgesdk.thermal.sensors import Reading, parse_throttled
from edgesdk.thermal.telemetry import Telemetry, summarize
from edgesdk.thermal.watch import ThermalHook
from tests._utils.clock import ManualClock

PROFILE = get_profile("rpi5")
ZONE = PROFILE.thermal.zones[0]


def run_steps(get_throttled: str, steps: int = 4) -> tuple[ThermalHook, list[dict]]:
    """A few decode steps of a cool Pi (50 °C) whose firmware answers ``get_throttled`` with ``get_throttled``."""
    clock = ManualClock()
    flags = parse_throttled(get_throttled)
    guard = Guard(Limits.resolve(PROFILE.thermal)[0], PROFILE.thermal_model)
    telemetry = Telemetry()
    hook = ThermalHook(clock, lambda: Reading(time=clock.t, zones={ZONE: 50.0}, throttled=flags, source="vcgencmd"),
                       guard, telemetry=telemetry)
    hook.begin(4, steps)
    hook.before_step("prefill")
    clock.sleep(0.1)
    hook.after_step("prefill", 1, 0.1)
    for _ in range(steps - 1):
        hook.before_step("decode")
        clock.sleep(0.05)
        hook.after_step("decode", 1, 0.05)
    return hook, [r for r in telemetry.records if r["kind"] != "wait"]


def test_the_soft_temperature_limit_is_recorded_as_throttled():
    """Bit 3 (the firmware's soft temperature limit lowers the Arm clock) paced the guard, but the records said
    ``throttled`` false, so the run summary's firmware throttle time (and ``thermal plan``'s row) left it out."""
    hook, records = run_steps("throttled=0x80008")
    assert hook.guard.firmware_limited
    assert all(r["throttled"] is True for r in records)
    assert summarize(records).throttle_s > 0


def test_flags_that_only_occurred_since_boot_are_not_throttling_now():
    hook, records = run_steps("throttled=0xf0000")
    assert not hook.guard.firmware_limited
    assert all(r["throttled"] is False for r in records)
    assert summarize(records).throttle_s == 0


def test_under_voltage_alone_is_no_slower_clock():
    _, records = run_steps("throttled=0x10001")
    assert all(r["throttled"] is False for r in records)


def test_the_status_line_names_under_voltage_not_throttling():
    """Under-voltage alone (bit 0: a weak supply) read "FIRMWARE THROTTLING", which points at cooling; the fix
    is the power supply."""
    hook, _ = run_steps("throttled=0x10001")
    text = hook.status_text()
    assert "UNDER-VOLTAGE" in text
    assert "power supply" in text
    assert "THROTTLING" not in text


def test_the_status_line_names_each_firmware_cause():
    assert "ARM CLOCK CAPPED" in run_steps("throttled=0x2")[0].status_text()
    assert "SOFT TEMPERATURE LIMIT" in run_steps("throttled=0x8")[0].status_text()
    both = run_steps("throttled=0x50005")[0].status_text()  # a weak supply the firmware throttles for
    assert "UNDER-VOLTAGE" in both
    assert "FIRMWARE THROTTLING" in both
    assert "FIRMWARE" not in run_steps("throttled=0x0")[0].status_text()


def test_the_under_voltage_warning_gives_its_fix():
    warnings: list[str] = []
    guard = Guard(Limits.resolve(PROFILE.thermal)[0], PROFILE.thermal_model, warn=warnings.append)
    guard.observe(0.0, Reading(time=0.0, zones={ZONE: 50.0}, throttled=parse_throttled("throttled=0x1")))
    assert len(warnings) == 1
    assert "under_voltage" in warnings[0]
    assert "power supply" in warnings[0]


def test_a_weak_supply_after_a_thermal_throttle_is_still_warned_of():
    """The firmware warning was given once per run: a board the firmware throttled for heat first never heard
    that its supply later sagged (under-voltage, whose fix is the supply, not cooling)."""
    warnings: list[str] = []
    guard = Guard(Limits.resolve(PROFILE.thermal)[0], PROFILE.thermal_model, warn=warnings.append)
    for t, value in ((0.0, "0x4"), (1.0, "0x4"), (2.0, "0x0"), (3.0, "0x4"), (4.0, "0x5"), (5.0, "0x5")):
        guard.observe(t, Reading(time=t, zones={ZONE: 50.0}, throttled=parse_throttled(f"throttled={value}")))
    assert len(warnings) == 2
    assert "under_voltage" not in warnings[0]
    assert "under_voltage" in warnings[1]
    assert "power supply" in warnings[1]


def test_an_unguarded_status_line_shows_the_firmware_flags():
    """``--no-guard`` runs watch the board only: a Pi whose supply sagged said nothing of it."""
    clock = ManualClock()
    flags = parse_throttled("throttled=0x50005")
    hook = ThermalHook(clock, lambda: Reading(time=clock.t, zones={ZONE: 50.0}, throttled=flags, source="vcgencmd"))
    hook.begin(4, 2)
    hook.before_step("prefill")
    hook.after_step("prefill", 1, 0.1)
    text = hook.status_text()
    assert "unguarded" in text
    assert "UNDER-VOLTAGE" in text
    assert "FIRMWARE THROTTLING" in text
