"""An Orin on JetPack 5 (L4T R35) names its thermal zones ``CPU-therm``, ``GPU-therm``, ``SOC0-therm`` ...
(NVIDIA's R35 fan profile documentation lists them in nvfancontrol.conf), where JetPack 6 names them
``cpu-thermal`` ...: the Orin profiles named JetPack 6's only, so on JetPack 5 the guard noted that none of the
profile's zones exist and watched every zone of the board, its board sensors (Tboard_tegra, Tdiode_tegra) too."""

from __future__ import annotations

import pytest

from edgesdk.profile import get_profile
from edgesdk.thermal.sensors import detect_sensors
from tests.unit.test_thermal_boards37 import sysfs_tree

JETPACK5_ORIN = [("CPU-therm", "61500", [("passive", 99000, 0)]), ("GPU-therm", "58000", []),
                 ("CV0-therm", "57000", []), ("SOC0-therm", "59000", []), ("SOC1-therm", "59500", []),
                 ("SOC2-therm", "58500", []), ("Tboard_tegra", "45000", []), ("Tdiode_tegra", "47000", []),
                 ("PMIC-Die", "100000", [("critical", 120000, 0)])]


@pytest.mark.parametrize("target", ["orin-nano-8gb", "orin-nx-16gb", "agx-orin-64gb"])
def test_a_jetpack5_orin_is_watched_on_its_own_zones_without_a_fallback(tmp_path, target):
    root = sysfs_tree(tmp_path / "sys", JETPACK5_ORIN)
    zones = get_profile(target).thermal.zones
    sensor, trips, notes = detect_sensors(zones, root, which=lambda name: None, use_jtop=False)
    reading = sensor.read()
    assert not any("watching all" in note for note in notes), notes
    assert {"Tboard_tegra", "Tdiode_tegra", "PMIC-Die"}.isdisjoint(reading.zones)
    assert {"CPU-therm", "GPU-therm", "SOC0-therm"} <= set(reading.zones)
    assert reading.max_c == 61.5
    assert {t.zone for t in trips} == {"CPU-therm"}
