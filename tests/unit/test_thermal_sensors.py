"""Thermal sensors on real files in a temporary sysfs tree, vcgencmd output, a fake jetson-stats."""

from __future__ import annotations

import shutil
import sys
import time
import types
from pathlib import Path

import pytest

from edgesdk.thermal.sensors import (
    Combined,
    Jtop,
    Poller,
    Reading,
    SysfsThermal,
    Vcgencmd,
    detect_sensors,
    parse_measure_temp,
    parse_millidegree,
    parse_throttled,
)
from tests._utils.sysfs import make_zone


@pytest.fixture
def pi5_tree(tmp_path) -> Path:
    """A Pi 5 like tree: cpu-thermal with fan (active) trips and a critical trip, plus an unwanted zone."""
    root = tmp_path / "thermal"
    make_zone(root, 0, "cpu-thermal", "45123\n",
              [("active", 50000, 5000), ("active", 60000, 5000), ("critical", 110000, 0)])
    make_zone(root, 1, "rp1_adc", "38000\n")
    return root


@pytest.mark.parametrize(("text", "expected"), [
    ("45123\n", 45.123), ("0", 0.0), ("-5000", -5.0), ("  71000  ", 71.0),
    ("-256000", None),  # jetson-stats TEMPERATURE_OFFLINE: rail-gated sensor
    ("abc", None), ("", None), ("45.1", None), ("999999", None), ("-100000", None),
    ("9" * 400, None),  # too many digits for a float: OverflowError, not ValueError
])
def test_millidegree_parsing(text, expected):
    assert parse_millidegree(text) == expected


def test_zones_are_picked_by_type(pi5_tree):
    sysfs = SysfsThermal(pi5_tree, ["cpu-thermal"])
    assert list(sysfs.zones) == ["cpu-thermal"]
    reading = sysfs.read()
    assert reading.zones == {"cpu-thermal": 45.123}
    assert reading.max_c == 45.123
    assert reading.source == "sysfs"
    assert not sysfs.notes


def test_unknown_zone_types_fall_back_to_every_zone_with_a_note(pi5_tree):
    sysfs = SysfsThermal(pi5_tree, ["tj-thermal"])
    assert set(sysfs.zones) == {"cpu-thermal", "rp1_adc"}
    assert "tj-thermal" in sysfs.notes[0]
    assert "watching all" in sysfs.notes[0]
    assert sysfs.read().max_c == 45.123


def test_trip_points_are_read_with_their_type_and_hysteresis(pi5_tree):
    trips = SysfsThermal(pi5_tree, ["cpu-thermal"]).trips()
    assert [(t.kind, t.temp_c, t.hyst_c) for t in trips] == [
        ("active", 50.0, 5.0), ("active", 60.0, 5.0), ("critical", 110.0, 0.0)]
    assert {t.zone for t in trips} == {"cpu-thermal"}


def test_unreadable_trip_points_are_skipped(tmp_path):
    zone = make_zone(tmp_path, 0, "cpu-thermal", "50000", [("passive", 80000, None), ("critical", "garbage", None)])
    (zone / "trip_point_2_temp").write_text("95000")  # no type file
    trips = SysfsThermal(tmp_path, ["cpu-thermal"]).trips()
    assert [(t.index, t.kind, t.temp_c) for t in trips] == [(0, "passive", 80.0)]


@pytest.mark.parametrize(("content", "why"), [
    ("-256000", "offline sensor reads -256 °C"),
    ("not a number\n", "garbage"),
    ("", "empty file"),
    (None, "missing temp file"),
])
def test_failed_zone_reads_as_no_data(tmp_path, content, why):
    make_zone(tmp_path, 0, "gpu-thermal", content)
    make_zone(tmp_path, 1, "cpu-thermal", "61000")
    reading = SysfsThermal(tmp_path, ["gpu-thermal", "cpu-thermal"]).read()
    assert reading.zones["gpu-thermal"] is None, why
    assert reading.max_c == 61.0  # the other zone still counts; -256 is never "cold"


def test_unreadable_temp_file_and_vanished_zone_are_no_data(tmp_path):
    zone = make_zone(tmp_path, 0, "cpu-thermal", None)
    (zone / "temp").mkdir()  # reading a directory fails like an EIO/ENODATA read would
    sysfs = SysfsThermal(tmp_path, ["cpu-thermal"])
    assert sysfs.read().zones == {"cpu-thermal": None}
    assert sysfs.read().max_c is None
    shutil.rmtree(zone)  # the zone disappears (driver unloaded)
    assert sysfs.read().zones == {"cpu-thermal": None}


def test_zone_without_type_is_ignored_and_duplicates_are_numbered(tmp_path):
    make_zone(tmp_path, 0, None, "50000")
    make_zone(tmp_path, 1, "cpu-thermal", "50000")
    make_zone(tmp_path, 2, "cpu-thermal", "52000")
    assert set(SysfsThermal.discover(tmp_path)) == {"cpu-thermal", "cpu-thermal#2"}


def test_every_zone_of_a_wanted_type_is_watched(tmp_path):
    """Two acpitz zones (common on x86 laptops): the hotter second one is watched too."""
    make_zone(tmp_path, 0, "acpitz", "40000\n", trips=[("critical", 105000, None)])
    make_zone(tmp_path, 1, "acpitz", "97000\n", trips=[("critical", 100000, None)])
    make_zone(tmp_path, 2, "iwlwifi_1", "30000\n")
    sysfs = SysfsThermal(tmp_path, ["x86_pkg_temp", "acpitz"])
    assert list(sysfs.zones) == ["acpitz", "acpitz#1"]
    assert sysfs.read().max_c == 97.0
    assert sysfs.notes == []
    assert {(t.zone, t.temp_c) for t in sysfs.trips()} == {("acpitz", 105.0), ("acpitz#1", 100.0)}


def test_no_zones_at_all(tmp_path):
    sysfs = SysfsThermal(tmp_path / "missing", ["cpu-thermal"])
    assert not sysfs
    assert sysfs.read().max_c is None
    assert sysfs.trips() == []


@pytest.mark.parametrize(("text", "expected"), [
    ("temp=48.3'C\n", 48.3), ("temp=90.8'C", 90.8), ("temp=-3.0'C", -3.0),
    ("temp=-256.0'C", None), ("error=1 error_msg=\"Command not registered\"", None), ("", None), (None, None),
])
def test_vcgencmd_measure_temp(text, expected):
    assert parse_measure_temp(text) == expected


def test_get_throttled_bits_are_decoded():
    flags = parse_throttled("throttled=0x50005\n")
    assert flags["under_voltage"]
    assert flags["throttled"]
    assert not flags["arm_freq_capped"]
    assert not flags["soft_temp_limit"]
    assert flags["under_voltage_occurred"]
    assert flags["throttling_occurred"]
    assert not flags["arm_freq_capping_occurred"]
    assert not flags["soft_temp_limit_occurred"]
    assert not any(parse_throttled("throttled=0x0").values())
    assert parse_throttled("throttled=0xe0000")["soft_temp_limit_occurred"]
    assert parse_throttled("garbage") is None
    decimal = parse_throttled("throttled=010")  # 10 = 0b1010: bits 1 and 3
    assert [name for name, on in decimal.items() if on] == ["arm_freq_capped", "soft_temp_limit"]
    assert parse_throttled("throttled=0X4")["throttled"]
    assert parse_throttled("throttled=" + "1" * 5000) is None


def test_garbage_numbers_in_a_zone_and_from_vcgencmd_are_no_data(tmp_path):
    """A trip point with hundreds of digits (int -> float overflows) and a get_throttled with a leading
    zero (int(..., 0) refuses it) used to raise: the first crashed `run --watch-thermal` at start,
    the second lost vcgencmd's temperature too."""
    from edgesdk.thermal.sensors import detect_sensors

    zone = make_zone(tmp_path, 0, "cpu-thermal", "9" * 400 + "\n", [("critical", "9" * 400, None)])
    (zone / "trip_point_1_type").write_text("passive\n")
    (zone / "trip_point_1_temp").write_text("60000\n")
    sensor, trips, _ = detect_sensors(["cpu-thermal"], tmp_path, which=lambda name: None, use_jtop=False)
    assert [(t.kind, t.temp_c) for t in trips] == [("passive", 60.0)]
    assert sensor.read().zones == {"cpu-thermal": None}
    answers = {"measure_temp": "temp=61.5'C\n", "get_throttled": "throttled=010\n"}
    reading = Vcgencmd(runner=lambda args: answers[args[1]]).read()
    assert reading.zones == {"vcgencmd": 61.5}
    assert reading.throttled is not None
    assert parse_throttled(None) is None


def test_vcgencmd_sensor_with_a_fake_runner():
    calls = []

    def runner(args):
        calls.append(args)
        return {"measure_temp": "temp=71.4'C\n", "get_throttled": "throttled=0x20002\n"}[args[1]]

    reading = Vcgencmd(runner).read()
    assert calls == [["vcgencmd", "measure_temp"], ["vcgencmd", "get_throttled"]]
    assert reading.zones == {"vcgencmd": 71.4}
    assert reading.throttled["arm_freq_capped"]
    assert reading.throttled["arm_freq_capping_occurred"]


def test_vcgencmd_failing_command_is_no_data():
    reading = Vcgencmd(lambda args: None).read()
    assert reading.zones == {"vcgencmd": None}
    assert reading.throttled is None
    assert Vcgencmd.available(lambda name: None) is False


def test_missing_vcgencmd_binary_is_no_data():
    reading = Vcgencmd(binary="/nonexistent/vcgencmd").read()
    assert reading.max_c is None


@pytest.fixture
def fake_jtop(monkeypatch):
    """A stand-in for jetson-stats' ``jtop`` module with the v7.2 attribute names (reference §2b)."""

    class FakeJtop:
        def __init__(self, interval=1.0):
            self.interval = interval
            self.started = self.closed = False
            self.temperature = {"cpu": {"temp": 55.5, "online": True}, "gpu": {"temp": -256.0, "online": False},
                                "tj": {"temp": 57.25, "online": True}}
            self.power = {"rail": {"VDD_CPU_GPU_CV": {"online": True, "power": 4200, "avg": 4000},
                                   "VDD_SOC": {"online": True, "power": 1800}},
                          "tot": {"name": "VDD_IN", "power": 9100}}
            self.nvpmodel = types.SimpleNamespace(name="25W", id=1)

        def start(self):
            self.started = True

        def attach(self, observer):  # called with every new set of stats
            self.observer = observer

        def ok(self, spin=False):  # the reader thread is alive, and has fresh stats at every read
            self.observer(self)
            return True

        def close(self):
            self.closed = True

    module = types.ModuleType("jtop")
    module.jtop = FakeJtop
    monkeypatch.setitem(sys.modules, "jtop", module)
    return FakeJtop


def test_jtop_temperatures_power_rails_and_nvpmodel(fake_jtop):
    sensor = Jtop(interval_s=0.5)
    assert sensor.jetson.started
    assert sensor.jetson.interval == 0.5
    reading = sensor.read()
    assert reading.zones == {"jtop:cpu": 55.5, "jtop:gpu": None, "jtop:tj": 57.25}  # offline GPU: no data
    assert reading.power_w == {"VDD_CPU_GPU_CV": 4.2, "VDD_SOC": 1.8, "total": 9.1}
    assert reading.nvpmodel == "25W"
    sensor.close()
    assert sensor.jetson.closed


def test_broken_jtop_socket_is_no_data(fake_jtop):
    sensor = Jtop()
    sensor.jetson.temperature = None  # what a dead service looks like: attribute access fails
    assert sensor.read().max_c is None


def test_jtop_is_optional(monkeypatch):
    monkeypatch.setitem(sys.modules, "jtop", None)  # not installed
    with pytest.raises(ImportError):
        Jtop()
    sensor, _, notes = detect_sensors(["cpu-thermal"], "/nonexistent", which=lambda name: None)
    assert sensor is None
    assert notes == ["no thermal zones under /nonexistent"]


def test_detect_combines_sysfs_vcgencmd_and_jtop(pi5_tree, fake_jtop, monkeypatch):
    monkeypatch.setattr(Vcgencmd, "read", lambda self: Reading(0.0, {"vcgencmd": 45.9}, {"throttled": False}))
    sensor, trips, notes = detect_sensors(["cpu-thermal"], pi5_tree, which=lambda name: "/usr/bin/vcgencmd")
    assert sensor.source == "sysfs cpu-thermal+vcgencmd+jetson-stats"
    reading = sensor.read()
    assert reading.zones["cpu-thermal"] == 45.123
    assert reading.zones["vcgencmd"] == 45.9
    assert reading.zones["jtop:cpu"] == 55.5
    assert "jtop:tj" not in reading.zones  # not one of the profile's zones
    assert reading.power_w["total"] == 9.1
    assert reading.throttled == {"throttled": False}
    assert len(trips) == 3
    assert not notes
    sensor.close()


def test_one_failing_sensor_does_not_hide_the_others(pi5_tree):
    class Broken:
        def read(self):
            raise OSError("gone")

    combined = Combined([Broken(), SysfsThermal(pi5_tree, ["cpu-thermal"])], ["broken", "sysfs"])
    assert combined.read().zones == {"cpu-thermal": 45.123}


def test_poller_reads_in_the_background_and_keeps_the_last_good_reading(pi5_tree):
    sysfs = SysfsThermal(pi5_tree, ["cpu-thermal"])
    poller = Poller(sysfs, interval_s=0.01).start()
    try:
        assert poller.latest.max_c == 45.123
        (pi5_tree / "thermal_zone0" / "temp").write_text("70500\n")
        deadline = time.monotonic() + 60
        while poller.latest.max_c != 70.5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert poller.latest.max_c == 70.5
        failed = []

        def gone():
            failed.append(time.monotonic())
            raise OSError("sensor gone")

        def wait_for_failed_reads(count: int) -> None:
            deadline = time.monotonic() + 60
            while len(failed) < count and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(failed) >= count, failed

        sysfs.read = gone  # reads now raise
        # One thread reads in turn: once a read has failed, a good read already under way when the sensor went has
        # landed (a fixed sleep lost that race on a loaded machine, the late read landing after it)
        wait_for_failed_reads(1)
        good = poller.latest
        assert good.max_c == 70.5
        wait_for_failed_reads(len(failed) + 3)
        assert poller.latest is good  # the guard sees its age grow and treats it as stale
    finally:
        poller.stop()
    assert not poller._thread.is_alive()
