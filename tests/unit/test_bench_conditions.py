"""edgesdk bench records clocks, temperatures, throttling and load around its tests (runtime/bench_conditions.py)."""

from __future__ import annotations

import json
import os

from edgesdk.runtime.bench_conditions import snapshot, summary, warnings
from tests._utils.sysfs import make_cpufreq_policy, make_zone
from tests.unit.test_cli import assert_ok, invoke

CLEAN = {"load_1min": 0.1, "clocks": [{"policy": "policy0", "cpus": "0 1 2 3", "governor": "ondemand",
                                        "cur_mhz": 2400.0, "max_mhz": 2400.0, "hardware_max_mhz": 2400.0}],
         "temperatures_c": {"cpu-thermal": 52.0}, "throttled": {"throttled": False, "throttling_occurred": False},
         "nvpmodel": None}


OWN_CPUS = " ".join(str(cpu) for cpu in sorted(os.sched_getaffinity(0)))


def _board(root, capped_khz: int = 2_400_000, governor: str = "ondemand", temp: str = "61500"):
    thermal = root / "thermal"
    make_zone(thermal, 0, "cpu-thermal", temp)
    make_zone(thermal, 1, "gpu-thermal", "40000")  # not a zone of the profile: left out
    policy = make_cpufreq_policy(root, 0, capped_khz, 1_500_000, available=(1_500_000, 1_800_000, 2_400_000))
    (policy / "scaling_governor").write_text(governor + "\n")
    (policy / "scaling_cur_freq").write_text(f"{capped_khz}\n")
    (policy / "affected_cpus").write_text(f"{OWN_CPUS}\n")  # this process's cores: the bench warns of their clocks
    return thermal


def test_snapshot_reads_the_profile_zones_and_every_cpufreq_policy(tmp_path):
    thermal = _board(tmp_path, capped_khz=1_800_000, governor="schedutil")
    taken = snapshot(["cpu-thermal"], thermal, tmp_path, use_jtop=False)
    assert taken["temperatures_c"] == {"cpu-thermal": 61.5}
    assert taken["clocks"] == [{"policy": "policy0", "cpus": OWN_CPUS, "governor": "schedutil", "cur_mhz": 1800.0,
                                "max_mhz": 1800.0, "hardware_max_mhz": 2400.0}]
    assert taken["throttled"] is None
    nothing = snapshot(["cpu-thermal"], tmp_path / "none", tmp_path / "none", use_jtop=False)
    assert (nothing["temperatures_c"], nothing["clocks"]) == ({}, [])
    assert "clocks unknown" in summary(nothing, nothing)
    assert "temperature unknown" in summary(nothing, nothing)


def test_warnings_name_what_makes_the_figures_low():
    assert warnings(CLEAN, CLEAN, cores=4, throttle_c=80.0) == []
    capped = {**CLEAN, "clocks": [{**CLEAN["clocks"][0], "max_mhz": 1500.0, "governor": "powersave"}]}
    hot = {**CLEAN, "temperatures_c": {"cpu-thermal": 76.0},
           "throttled": {"throttled": False, "throttling_occurred": True}}
    busy = {**CLEAN, "load_1min": 3.1}
    found = warnings(busy, capped, cores=4, throttle_c=80.0)
    assert any("load average was 3.1 on 4 cores" in w for w in found)
    assert any("powersave governor" in w for w in found)
    assert any("capped at 1500 of 2400 MHz" in w for w in found)
    found = warnings(CLEAN, hot, cores=4, throttle_c=80.0)
    assert any("throttling_occurred" in w and "figures are low" in w for w in found)
    assert any("76 °C after the run, within 5 °C of the 80 °C throttle point" in w for w in found)
    # a throttle that had happened since boot before the run is not this run's
    assert warnings({**CLEAN, "throttled": hot["throttled"]}, {**CLEAN, "throttled": hot["throttled"]}, 4) == []


def test_bench_json_and_table_carry_the_conditions(tiny_bundle, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESDK_THERMAL_ROOT", str(_board(tmp_path, capped_khz=1_500_000)))
    monkeypatch.setenv("EDGESDK_CPUFREQ_ROOT", str(tmp_path))
    manifest = json.loads((tiny_bundle.path / "manifest.json").read_text())
    zone = manifest["target"]["thermal"]["zones"][0]  # the host profile's first zone, laid out here
    make_zone(tmp_path / "thermal", 2, zone, "70000")
    result = invoke("bench", tiny_bundle.path, "-p", 8, "-n", 4, "-r", 1, "--json", "--threads", 1)
    assert_ok(result)
    conditions = json.loads(result.stdout)["conditions"]
    assert conditions["before"]["temperatures_c"] == {zone: 70.0}
    assert conditions["after"]["clocks"][0]["max_mhz"] == 1500.0
    assert any("capped at 1500 of 2400 MHz" in w for w in conditions["warnings"])
    assert conditions["versions"]["onnxruntime"]
    result = invoke("bench", tiny_bundle.path, "-p", 8, "-n", 4, "-r", 1, "--threads", 1)
    assert_ok(result)
    assert f"{zone} 70.0 -> 70.0 °C" in result.stdout
    assert f"warning: policy0 (cpus {OWN_CPUS}) is capped at 1500 of 2400 MHz" in result.stdout


def test_garbled_cpufreq_files_read_as_unknown(tmp_path):
    from edgesdk.runtime.bench_conditions import read_clocks

    policy = make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000)
    (policy / "scaling_cur_freq").write_text("9" * 400 + "\n")  # int() takes it; a float of it overflows
    (policy / "scaling_max_freq").write_text("-5\n")
    odd = policy.parent / "policy²"  # a name whose digit int() refuses
    odd.mkdir()
    (odd / "scaling_max_freq").write_text("1000000\n")
    clocks = {clock["policy"]: clock for clock in read_clocks(tmp_path)}
    assert (clocks["policy0"]["cur_mhz"], clocks["policy0"]["max_mhz"]) == (None, None)
    assert clocks["policy²"]["max_mhz"] == 1000.0
