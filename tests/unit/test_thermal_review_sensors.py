"""Sensor behaviour found in review."""

from __future__ import annotations

import sys
import types

import pytest

from edgesdk.thermal.sensors import Jtop, jtop_name


@pytest.fixture
def jtop_with_hwmon(monkeypatch):
    """jetson-stats v7.2 on an Orin with an NVMe drive: thermal zones by their cut type name, plus the
    hwmon sensors it adds by label (``jtop/core/temperature.py``)."""

    class FakeJtop:
        def __init__(self, interval=1.0):
            self.temperature = {"cpu": {"temp": 55.5, "online": True}, "tj": {"temp": 57.25, "online": True},
                                "Composite": {"temp": 84.0, "online": True},  # the NVMe drive
                                "iwlwifi_1": {"temp": 61.0, "online": True}}
            self.power = {"rail": {}, "tot": {}}
            self.nvpmodel = None

        def start(self):
            pass

        def attach(self, observer):  # called with every new set of stats
            self.observer = observer

        def ok(self, spin=False):  # the reader thread is alive, and has fresh stats at every read
            self.observer(self)
            return True

        def close(self):
            pass

    module = types.ModuleType("jtop")
    module.jtop = FakeJtop
    monkeypatch.setitem(sys.modules, "jtop", module)


def test_jtop_keeps_only_the_profiles_zones(jtop_with_hwmon):
    """jtop's temperatures were merged unfiltered: a hot NVMe drive (84 °C) became the board's
    temperature, and the guard paced or paused generation for a disk the profile never names."""
    reading = Jtop(zones=["cpu-thermal", "tj-thermal"]).read()
    assert reading.zones == {"jtop:cpu": 55.5, "jtop:tj": 57.25}
    assert reading.max_c == 57.25


def test_jtop_keeps_every_sensor_when_none_of_the_profiles_zones_is_there(jtop_with_hwmon):
    # a Xavier zone on an Orin: as sysfs, watch everything (CPU-therm would be jtop's cpu, names compared without case)
    reading = Jtop(zones=["AUX-therm"]).read()
    assert set(reading.zones) == {"jtop:cpu", "jtop:tj", "jtop:Composite", "jtop:iwlwifi_1"}


@pytest.mark.parametrize(("zone_type", "name"), [("cpu-thermal", "cpu"), ("soc0-thermal", "soc0"),
                                                 ("Tboard_tegra", "Tboard"), ("CPU-therm", "CPU"),
                                                 ("a_b-c", "a_b")])
def test_jtop_names_zones_as_jetson_stats_does(zone_type, name):
    assert jtop_name(zone_type) == name
