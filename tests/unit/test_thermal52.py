"""Thermal review 52: zone types per JetPack version, and a simulated board's peak that no record saw."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgesdk.cli_thermal import past_shutdown_notes
from edgesdk.profile import get_profile
from edgesdk.thermal.plan import Workload, simulate
from edgesdk.thermal.sensors import SysfsThermal, detect_sensors
from edgesdk.thermal.telemetry import summarize

# An Orin on JetPack 5 (L4T R35), as tegrastats prints it there: "CPU@41.375C SOC2@39C ... GPU@-256C tj@41.468C":
# the zones are CPU-therm, GPU-therm, SOC0-therm ... and the junction zone tj-therm, lower case.
JETPACK5_ORIN = [("CPU-therm", 61500), ("GPU-therm", None), ("SOC0-therm", 59000), ("SOC1-therm", 59500),
                 ("SOC2-therm", 58500), ("tj-therm", 66000), ("Tboard_tegra", 45000)]


def _zones(root: Path, zones: list[tuple[str, int | None]]) -> Path:
    """``root`` as /sys/class/thermal with ``zones`` (type, m°C; None: a rail-gated zone with no temp file)."""
    for index, (kind, millidegree) in enumerate(zones):
        zone = root / f"thermal_zone{index}"
        zone.mkdir(parents=True)
        (zone / "type").write_text(f"{kind}\n")
        if millidegree is not None:
            (zone / "temp").write_text(f"{millidegree}\n")
    return root


@pytest.mark.parametrize("target", ["orin-nano-8gb", "orin-nx-16gb", "agx-orin-64gb"])
def test_a_jetpack5_orin_s_junction_zone_is_watched_whatever_its_case(tmp_path, target):
    """The Orin profiles name JetPack 5's junction zone Tj-therm; the board names it tj-therm. Compared as written,
    the zone that is the maximum of every on-die sensor (the one the fan and the critical trip follow) was left
    out, and the guard read the board 4.5 °C cooler than its hottest spot."""
    root = _zones(tmp_path / "thermal", JETPACK5_ORIN)
    sensor, _, notes = detect_sensors(get_profile(target).thermal.zones, root, which=lambda name: None,
                                      use_jtop=False)
    reading = sensor.read()
    assert "tj-therm" in reading.zones
    assert reading.max_c == 66.0
    assert "Tboard_tegra" not in reading.zones  # still the profile's zones only, no fallback to every zone
    assert not notes


def test_zone_types_of_another_case_are_still_one_type_each(tmp_path):
    """Two zones of one type in different cases are both watched, numbered as duplicates are."""
    root = _zones(tmp_path / "thermal", [("tj-therm", 50000), ("Tj-therm", 52000), ("cpu-thermal", 40000)])
    sysfs = SysfsThermal(root, ["TJ-THERM"])
    assert set(sysfs.read().zones) == {"tj-therm", "Tj-therm"}


def test_a_step_cut_by_the_plan_s_horizon_still_counts_in_the_maximum_temperature():
    """A plan shorter than one request's prefill (a long prompt) ends inside that step, which leaves no record: the
    unguarded run's maximum temperature was '-' and no note said that its board ran past the shutdown point, though
    the simulated board at 80 °C ambient heated from 106.6 °C to about 117 °C during that very step."""
    profile = get_profile("rpi5")
    run = simulate(profile, 10, 80.0, False, 35.0, workload=Workload(prompt_tokens=200_000, new_tokens=8))
    assert not run.telemetry.records  # the one step never ended
    assert run.summary.max_temp_c is not None
    assert run.summary.max_temp_c >= run.board.temp_c - 1e-3 > profile.thermal.shutdown_c
    assert past_shutdown_notes({"unguarded": run}, profile.thermal.shutdown_c)


def test_summarize_takes_the_board_s_own_maximum_over_the_readings():
    records = [{"type": "step", "t": 1.0, "kind": "decode", "tokens": 1, "duration_s": 1.0, "wait_s": 0.0,
                "temp_c": 60.0, "level": "unguarded"}]
    assert summarize(records).max_temp_c == 60.0
    assert summarize(records, max_temp_c=61.5).max_temp_c == 61.5
