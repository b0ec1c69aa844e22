"""Thermal telemetry, status line and ``thermal sensors`` defects found in review 47."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.profile import get_profile
from edgesdk.thermal.guard import Guard, Limits
from edgesdk.thermal.sensors import Poller, SysfsThermal
from edgesdk.thermal.telemetry import Telemetry, load
from edgesdk.thermal.watch import ThermalHook
from tests._utils.clock import ManualClock

PROFILE = get_profile("rpi5")


def _zone(root, temp_mc: int = 70000):
    zone = root / "thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "type").write_text("cpu-thermal\n")
    (zone / "temp").write_text(f"{temp_mc}\n")


@pytest.mark.parametrize("guarded", [False, True])
def test_a_reading_the_poller_stopped_renewing_is_recorded_as_no_data(tmp_path, guarded):
    """The poller keeps its last reading when its sensor hangs (a blocked sysfs read) or raises. The guard
    takes a reading older than ``stale_s`` as no data, but the records, the status line (and /health)
    showed its temperature as current: ``thermal report`` drew a flat line at the last value, and an
    unguarded run (``--telemetry`` alone) wrote ``sensor_ok: true`` for a sensor that had stopped."""
    _zone(tmp_path / "sys")
    clock = ManualClock()
    sensor = SysfsThermal(tmp_path / "sys", ["cpu-thermal"], clock=clock.now)
    poller = Poller(sensor, interval_s=3600.0).start()  # read once; the next poll never comes (a hung read)
    try:
        guard = Guard(Limits.resolve(PROFILE.thermal)[0], PROFILE.thermal_model) if guarded else None
        telemetry = Telemetry(tmp_path / "run.jsonl")
        hook = ThermalHook(clock, lambda: poller.latest, guard, telemetry=telemetry)
        hook.begin(4, 4)
        hook.before_step("prefill")
        hook.after_step("prefill", 1, 0.1)
        clock.sleep(30.0)  # the sensor's last reading is now 30 s old (stale_s is 5 s)
        hook.before_step("decode")  # guarded: the guard paces at its fallback rate, with "wait" records
        hook.after_step("decode", 1, 0.1)
        telemetry.close()
    finally:
        poller.stop()
    _, records = load(tmp_path / "run.jsonl")
    assert records[0]["temp_c"] == 70.0
    assert [r["kind"] for r in records][-1] == "decode"
    assert all(r["temp_c"] is None and r["zones"] == {"cpu-thermal": None} for r in records[1:])
    assert records[-1]["sensor_ok"] is False
    assert hook.status_text().startswith("--.- °C")
    assert hook.reading.max_c is None  # what /health shows


def test_a_fresh_reading_is_recorded_as_read(tmp_path):
    """A reading within ``stale_s`` (a poll a few seconds old) is still the temperature now."""
    _zone(tmp_path / "sys", 65500)
    clock = ManualClock()
    sensor = SysfsThermal(tmp_path / "sys", ["cpu-thermal"], clock=clock.now)
    poller = Poller(sensor, interval_s=3600.0).start()
    try:
        telemetry = Telemetry()
        hook = ThermalHook(clock, lambda: poller.latest, telemetry=telemetry)
        clock.sleep(4.0)
        hook.after_step("decode", 1, 0.1)
    finally:
        poller.stop()
    assert telemetry.records[0]["temp_c"] == 65.5
    assert telemetry.records[0]["sensor_ok"] is True


def _vcgencmd(bin_dir, throttled: str):
    """A ``vcgencmd`` on PATH that answers as a Raspberry Pi's firmware does."""
    bin_dir.mkdir()
    script = bin_dir / "vcgencmd"
    script.write_text(f"""#!/bin/sh
case "$1" in
  measure_temp) echo "temp=52.1'C" ;;
  get_throttled) echo "throttled={throttled}" ;;
esac
""")
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def _sensors_text(tmp_path, throttled: str) -> str:
    _zone(tmp_path / "sys", 51000)
    env = _vcgencmd(tmp_path / "bin", throttled)
    result = CliRunner(env=env).invoke(main, ["thermal", "sensors", "--target", "rpi5", "--root",
                                              str(tmp_path / "sys")], prog_name="edgesdk")
    assert result.exit_code == 0, result.output
    return result.stdout


def test_thermal_sensors_prints_the_firmware_throttle_bits(tmp_path):
    """``vcgencmd get_throttled`` (bits 0-3 now, 16-19 since boot, Raspberry Pi documentation) is read and
    the guard paces while a bit 0-3 is set, but the text form of ``thermal sensors`` ("what the guard would
    read") printed only the temperatures: a board slowed by its supply looked fine. Only --json showed it."""
    text = _sensors_text(tmp_path, "0x50005")
    assert ("firmware get_throttled 0x50005: now under_voltage, throttled; "
            "since boot under_voltage_occurred, throttling_occurred") in text
    assert "vcgencmd             52.1 °C" in text


def test_thermal_sensors_says_when_no_throttle_bit_is_set(tmp_path):
    assert "firmware get_throttled 0x0: no under-voltage" in _sensors_text(tmp_path, "0x0")
