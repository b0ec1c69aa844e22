"""Thermal sensors: jetson-stats zone names compared without case, and a vcgencmd that gives no reading."""

from __future__ import annotations

import shutil
import sys
import types
from pathlib import Path

import pytest

from edgesdk.thermal.sensors import Jtop, detect_sensors


@pytest.fixture
def jp5_jtop(monkeypatch):
    """A stand-in for jetson-stats' ``jtop`` client (its service cannot run here) listing a JetPack 5 Orin's
    zones as jtop names them: ``CPU-therm`` -> ``CPU``, ``tj-therm`` -> ``tj``, plus an NVMe hwmon sensor."""

    class JetPack5Jtop:
        def __init__(self, interval=1.0):
            self.interval = interval
            self.temperature = {"CPU": {"temp": 71.5, "online": True}, "GPU": {"temp": 66.0, "online": True},
                                "tj": {"temp": 69.0, "online": True}, "Composite": {"temp": 41.0, "online": True}}
            self.power = {"rail": {}, "tot": {}}
            self.nvpmodel = None

        def start(self):
            pass

        def attach(self, observer):
            self.observer = observer

        def ok(self, spin=False):
            self.observer(self)
            return True

        def close(self):
            pass

    module = types.ModuleType("jtop")
    module.jtop = JetPack5Jtop
    monkeypatch.setitem(sys.modules, "jtop", module)


def test_jtop_keeps_a_profiles_zone_whose_jetpack5_name_differs_in_case(jp5_jtop):
    """A profile naming ``cpu-thermal`` and ``tj-thermal`` watches ``CPU-therm`` through sysfs (types compared
    without case); through jtop the hottest zone, ``CPU`` at 71.5 °C, was dropped for not being ``cpu``."""
    sensor = Jtop(zones=["cpu-thermal", "tj-thermal"])
    reading = sensor.read()
    assert reading.zones == {"jtop:CPU": 71.5, "jtop:tj": 69.0}
    assert reading.max_c == 71.5


def _script(directory: Path, body: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "vcgencmd"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def _pi_tree(root: Path) -> Path:
    zone = root / "thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "type").write_text("cpu-thermal\n")
    (zone / "temp").write_text("48350\n")
    return root


def test_a_vcgencmd_the_user_cannot_use_is_named_in_a_note(tmp_path):
    """Outside the group 'video' vcgencmd prints an error and exits 255 at every poll: the firmware's reading
    was silently missing, with nothing in ``edgesdk thermal sensors`` to say why or what to do."""
    bin_dir = tmp_path / "bin"
    binary = _script(bin_dir, "echo 'VCHI initialization failed' >&2\nexit 255\n")
    sensor, _, notes = detect_sensors(["cpu-thermal"], _pi_tree(tmp_path / "thermal"), use_jtop=False,
                                      which=lambda name: shutil.which(name, path=str(bin_dir)))
    assert sensor.read().zones == {"cpu-thermal": 48.35, "vcgencmd": None}
    assert len(notes) == 1
    assert f"{binary} measure_temp gave no temperature" in notes[0]
    assert "usermod -aG video" in notes[0]


def test_the_vcgencmd_found_on_the_path_is_the_one_that_is_run(tmp_path):
    """``which`` found the program, but the sensor ran plain ``vcgencmd`` from its own PATH."""
    bin_dir = tmp_path / "bin"
    _script(bin_dir, 'case "$1" in\n  measure_temp) echo "temp=52.1\'C";;\n  get_throttled) echo throttled=0x0;;\nesac\n')
    sensor, _, notes = detect_sensors(["cpu-thermal"], _pi_tree(tmp_path / "thermal"), use_jtop=False,
                                      which=lambda name: shutil.which(name, path=str(bin_dir)))
    assert notes == []
    reading = sensor.read()
    assert reading.zones == {"cpu-thermal": 48.35, "vcgencmd": 52.1}
    assert reading.throttled is not None
    assert not any(reading.throttled.values())
