"""The guard's firmware flags are "now" only while the reading they came with is fresh."""

from __future__ import annotations

from edgesdk.thermal.guard import GuardConfig
from edgesdk.thermal.sensors import Reading
from tests.unit.test_thermal_guard import make_guard


def test_a_stale_reading_s_firmware_flags_are_not_reported_as_the_firmware_limiting_now():
    """A sensor that stopped answering leaves its last poll behind; after ``stale_s`` the guard treats its
    temperature as no data (fallback pacing) and must treat its ``get_throttled`` bits the same way: the
    telemetry's ``firmware_limited`` says the firmware reports throttling *now*, which nobody knows."""
    guard = make_guard()
    stale_s = GuardConfig().stale_s
    last = Reading(time=1.0, zones={"cpu-thermal": 55.0}, throttled={"throttled": True}, source="vcgencmd")
    guard.observe(1.0, last)
    guard.spend("decode", 1, 0.05)
    assert guard.state()["firmware_limited"]
    guard.observe(1.0 + stale_s + 1.0, last)  # the same poll, now older than stale_s
    state = guard.state()
    assert not state["firmware_limited"]
    assert not guard.sensor_ok  # still paced: the sensor-failed path holds the fallback rate
    assert guard.pacing
    assert guard.rate_limit_tok_s <= GuardConfig().fallback_fraction * 20.0 + 1e-9
