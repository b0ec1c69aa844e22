"""The sensors on temporary copies of real boards' sysfs layouts, and vcgencmd as a real program.

Layouts (``targets-thermal.md`` §2a, §2c, §2d): ``/sys/class/thermal/thermal_zoneN`` are symlinks into
``/sys/devices/virtual/thermal``, beside ``cooling_deviceN`` (``type``, ``cur_state``, ``max_state``);
Jetson Orin zones ``cpu-thermal`` ... ``tj-thermal`` with passive 99 °C and critical 104.5 °C trips and
fan (active) trips on ``tj-thermal``, a rail-gated sensor at -256 °C, board sensors and a PMIC zone the
profile does not watch; a Raspberry Pi 5 ``cpu-thermal`` zone with its critical 110 °C trip and the four
fan trips of its device tree (50, 60, 67.5, 75 °C), the fan as a cooling device and as hwmon ``pwmfan``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from edgesdk.profile import get_profile
from edgesdk.thermal.guard import Guard, GuardConfig, Level, Limits
from edgesdk.thermal.sensors import (
    Combined,
    SysfsThermal,
    Vcgencmd,
    detect_sensors,
    run_command,
)
from tests._utils.sysfs import make_zone

ORIN_ZONES = [  # (type, temp m°C, trips (type, m°C, hyst m°C))
    ("cpu-thermal", "51218", [("passive", 99000, 0), ("critical", 104500, 0)]),
    ("gpu-thermal", "-256000", [("passive", 99000, 0), ("critical", 104500, 0)]),  # rail-gated
    ("soc0-thermal", "49500", [("passive", 99000, 0), ("critical", 104500, 0)]),
    ("soc1-thermal", "50000", [("passive", 99000, 0), ("critical", 104500, 0)]),
    ("soc2-thermal", "48000", [("passive", 99000, 0), ("critical", 104500, 0)]),
    ("tj-thermal", "51718", [("active", 35000, 0), ("active", 74000, 0), ("active", 95000, 0),
                             ("critical", 104500, 0)]),
    ("tboard-thermal", "40000", [("critical", 107000, 0)]),
    ("PMIC-Die", "100000", [("critical", 120000, 0)]),
]
PI5_TRIPS = [("critical", 110000, 0), ("active", 50000, 5000), ("active", 60000, 5000),
             ("active", 67500, 5000), ("active", 75000, 5000)]


def sysfs_tree(sys_root: Path, zones, cooling=()) -> Path:
    """``sys_root/class/thermal`` as the kernel shows it: symlinks into ``devices/virtual/thermal``."""
    devices = sys_root / "devices" / "virtual" / "thermal"
    for index, (kind, temp, trips) in enumerate(zones):
        zone = make_zone(devices, index, kind, None if temp is None else temp + "\n", trips)
        (zone / "mode").write_text("enabled\n")
    for index, (kind, state, max_state) in enumerate(cooling):
        device = devices / f"cooling_device{index}"
        device.mkdir(parents=True)
        for name, value in (("type", kind), ("cur_state", state), ("max_state", max_state)):
            (device / name).write_text(f"{value}\n")
    link_dir = sys_root / "class" / "thermal"
    link_dir.mkdir(parents=True)
    for entry in sorted(devices.iterdir()):
        (link_dir / entry.name).symlink_to(Path("../../devices/virtual/thermal") / entry.name)
    return link_dir


@pytest.fixture
def orin(tmp_path) -> Path:
    return sysfs_tree(tmp_path / "sys", ORIN_ZONES, [("pwm-fan", 1, 3), ("cpufreq-cpu0", 0, 12)])


@pytest.fixture
def pi5(tmp_path) -> Path:
    root = sysfs_tree(tmp_path / "sys", [("cpu-thermal", "48350", PI5_TRIPS)], [("pwm-fan", 2, 4)])
    hwmon = tmp_path / "sys" / "class" / "hwmon" / "hwmon2"
    hwmon.mkdir(parents=True)
    for name, value in (("name", "pwmfan"), ("fan1_input", "3011"), ("pwm1", "102")):
        (hwmon / name).write_text(f"{value}\n")
    return root


def script(directory: Path, name: str, body: str) -> Path:
    """An executable shell script ``directory/name``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


# -- Jetson Orin ---------------------------------------------------------------------------------
def test_orin_zones_are_the_profiles_and_an_offline_sensor_is_no_data(orin):
    profile = get_profile("orin-nano-8gb")
    sensor, trips, notes = detect_sensors(profile.thermal.zones, orin, which=lambda name: None, use_jtop=False)
    assert notes == []
    reading = sensor.read()
    assert reading.zones == {"cpu-thermal": 51.218, "gpu-thermal": None, "soc0-thermal": 49.5,
                             "soc1-thermal": 50.0, "soc2-thermal": 48.0, "tj-thermal": 51.718}
    assert reading.max_c == 51.718  # tj (the max of the die), never the PMIC's 100 °C or a cooling device
    kinds = {(t.zone, t.kind, t.temp_c) for t in trips}
    assert ("tj-thermal", "active", 74.0) in kinds
    assert ("cpu-thermal", "passive", 99.0) in kinds
    assert {t.zone for t in trips} == set(reading.zones)
    limits, limit_notes = Limits.resolve(profile.thermal, trips)
    assert limits == Limits(80.0, 85.0, 90.0, 99.0, 104.5)  # NVIDIA's trips match the profile: nothing moves
    assert limit_notes == []


def test_orin_with_tj_disabled_and_empty_falls_back_to_the_other_zones(orin):
    """Some p3767 kernels leave tj-thermal disabled, reading nothing (targets-thermal §2a)."""
    tj = orin / "thermal_zone5"
    (tj / "mode").write_text("disabled\n")
    (tj / "temp").write_text("")
    reading = SysfsThermal(orin, get_profile("orin-nano-8gb").thermal.zones).read()
    assert reading.zones["tj-thermal"] is None
    assert reading.max_c == 51.218


def test_orin_l4t_trips_below_the_profiles_lower_the_limits(tmp_path):
    """An L4T device tree may differ from mainline (§2a): a passive trip at 95 °C moves every limit down."""
    zones = [(kind, temp, [("passive", 95000, 0) if t == "passive" else (t, v, h) for t, v, h in trips])
             for kind, temp, trips in ORIN_ZONES]
    root = sysfs_tree(tmp_path / "sys", zones)
    profile = get_profile("orin-nano-8gb")
    _, trips, _ = detect_sensors(profile.thermal.zones, root, which=lambda name: None, use_jtop=False)
    limits, notes = Limits.resolve(profile.thermal, trips)
    assert limits == Limits(76.0, 81.0, 86.0, 95.0, 104.5)
    assert any("passive trip" in note and "lowered by 4" in note for note in notes)


def test_a_jetson_whose_zones_the_profile_does_not_name_never_watches_the_pmic(tmp_path):
    """A Jetson Nano (JetPack 4) names its zones ``CPU-therm`` ... and has ``PMIC-Die``, which reads a fixed
    100 °C (tegrastats' ``PMIC@100C``). With zones named as JetPack 6's Orin names them none of its zones
    exists and every zone is watched: the PMIC's 100 °C was the board's temperature, so the guard paused
    generation on a 38 °C board and never resumed."""
    nano = [("AO-therm", "38500", []), ("CPU-therm", "32000", [("passive", 97000, 0)]), ("GPU-therm", "30500", []),
            ("PLL-therm", "29000", []), ("PMIC-Die", "100000", [("critical", 120000, 0)]),
            ("thermal-fan-est", "31250", [("active", 51000, 0)])]
    root = sysfs_tree(tmp_path / "sys", nano)
    profile = get_profile("orin-nano-8gb")
    jetpack6 = tuple(zone for zone in profile.thermal.zones if zone.endswith("-thermal"))
    sensor, trips, notes = detect_sensors(jetpack6, root, which=lambda name: None, use_jtop=False)
    reading = sensor.read()
    assert "PMIC-Die" not in reading.zones
    assert reading.max_c == 38.5
    assert len(notes) == 1
    assert "watching all of ['AO-therm', 'CPU-therm', 'GPU-therm', 'PLL-therm', 'thermal-fan-est']" in notes[0]
    assert "not PMIC-Die: a PMIC zone reads a fixed value" in notes[0]
    assert {t.zone for t in trips} == {"CPU-therm", "thermal-fan-est"}
    guard = Guard(Limits.resolve(profile.thermal, trips)[0], profile.thermal_model)
    assert guard.observe(reading.time, reading) is Level.NORMAL
    assert not guard.paused


# -- Raspberry Pi 5 --------------------------------------------------------------------------------
def test_pi5_zone_trips_and_vcgencmd_as_a_real_program(pi5, tmp_path):
    bin_dir = tmp_path / "bin"
    script(bin_dir, "vcgencmd", 'case "$1" in\n'
                                "  measure_temp) echo \"temp=48.3'C\";;\n"
                                "  get_throttled) echo throttled=0x50005;;\n"
                                "  *) echo 'error=2 error_msg=\"Invalid arguments\"'; exit 2;;\n"
                                "esac\n")
    profile = get_profile("rpi5")
    sensor, trips, notes = detect_sensors(profile.thermal.zones, pi5, use_jtop=False,
                                          which=lambda name: shutil.which(name, path=str(bin_dir)))
    assert notes == []
    assert sensor.source == "sysfs cpu-thermal+vcgencmd"
    sensor.sensors[1].binary = str(bin_dir / "vcgencmd")
    reading = sensor.read()
    assert reading.zones == {"cpu-thermal": 48.35, "vcgencmd": 48.3}
    # 0x50005: under-voltage and throttled now; under-voltage and throttling since boot
    # (Raspberry Pi documentation, get_throttled)
    assert reading.throttled == {"under_voltage": True, "arm_freq_capped": False, "throttled": True,
                                 "soft_temp_limit": False, "under_voltage_occurred": True,
                                 "arm_freq_capping_occurred": False, "throttling_occurred": True,
                                 "soft_temp_limit_occurred": False}
    assert [(t.kind, t.temp_c, t.hyst_c) for t in trips] == [(k, v / 1000, h / 1000) for k, v, h in PI5_TRIPS]
    limits, limit_notes = Limits.resolve(profile.thermal, trips)
    assert limits == Limits(70.0, 75.0, 78.0, 80.0, 110.0)  # fan trips are not limits
    assert limit_notes == []


@pytest.mark.parametrize("body", [
    "echo 'VCHI initialization failed' >&2\nexit 255\n",  # not in the video group
    "echo 'error=1 error_msg=\"Command not registered\"'\n",  # an old firmware, exit status 0
    "echo \"temp=NaN'C\"\n",
])
def test_a_vcgencmd_that_prints_an_error_is_no_data(tmp_path, body):
    vcgencmd = script(tmp_path, "vcgencmd", body)
    reading = Vcgencmd(binary=str(vcgencmd)).read()
    assert reading.zones == {"vcgencmd": None}
    assert reading.throttled is None


def test_no_vcgencmd_on_the_path_is_no_sensor(pi5, tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    sensor, _, notes = detect_sensors(["cpu-thermal"], pi5, use_jtop=False,
                                      which=lambda name: shutil.which(name, path=str(empty)))
    assert sensor.source == "sysfs cpu-thermal"
    assert notes == []


def test_a_hung_vcgencmd_is_killed_and_left_alone_for_a_while(pi5, tmp_path):
    """A vcgencmd that never answered was run (and waited for, up to its timeout) twice at every poll,
    so the sysfs zone read in the same poll reached the guard two timeouts old: at the defaults (2 s
    each, 5 s stale) the guard took a board at 48 °C for a failed sensor and paced it at half speed."""
    calls = tmp_path / "calls"
    hung = script(tmp_path / "bin", "vcgencmd", f'echo "$1" >> {calls}\nexec sleep 30\n')
    now = [0.0]
    vcgencmd = Vcgencmd(runner=lambda args: run_command(args, timeout=0.2), binary=str(hung),
                        clock=lambda: now[0])  # retried after 30 s by default
    combined = Combined([SysfsThermal(pi5, ["cpu-thermal"]), vcgencmd], ["sysfs", "vcgencmd"])
    reading = combined.read()
    assert reading.zones == {"cpu-thermal": 48.35, "vcgencmd": None}
    assert calls.read_text().split() == ["measure_temp"]  # killed; get_throttled not tried after it
    for step in range(1, 30):  # a poll every simulated second: vcgencmd is not run again meanwhile
        now[0] = float(step)
        assert combined.read().zones == {"cpu-thermal": 48.35, "vcgencmd": None}
    assert calls.read_text().split() == ["measure_temp"]
    now[0] = 30.0  # retried after retry_s
    combined.read()
    assert calls.read_text().split() == ["measure_temp", "measure_temp"]
    script(tmp_path / "bin", "vcgencmd", "case \"$1\" in measure_temp) echo \"temp=49.1'C\";; "
                                         "*) echo throttled=0x0;; esac\n")
    now[0] = 60.0  # answering again: read every poll
    assert combined.read().zones == {"cpu-thermal": 48.35, "vcgencmd": 49.1}
    now[0] = 60.5
    assert combined.read().zones == {"cpu-thermal": 48.35, "vcgencmd": 49.1}


# -- odd but real zone files -------------------------------------------------------------------
def test_a_temp_read_that_fails_is_no_data_and_the_other_zones_still_count(orin):
    """``temp`` opens but its read fails (EIO here; ENODATA, EAGAIN and EINVAL come the same way, an
    OSError from read())."""
    temp = orin / "thermal_zone0" / "temp"
    temp.unlink()
    temp.symlink_to("/proc/self/mem")  # opens, and reading offset 0 fails with EIO
    with pytest.raises(OSError):  # noqa: PT011 (the errno is the kernel's)
        temp.read_text()
    reading = SysfsThermal(orin, ["cpu-thermal", "tj-thermal"]).read()
    assert reading.zones == {"cpu-thermal": None, "tj-thermal": 51.718}


def test_a_zone_that_disappears_after_listing_is_no_data(orin):
    sysfs = SysfsThermal(orin, ["cpu-thermal", "tj-thermal"])
    target = (orin / "thermal_zone5").resolve()
    shutil.rmtree(target)  # the zone's device went away (module unloaded, overlay removed)
    assert sysfs.read().zones == {"cpu-thermal": 51.218, "tj-thermal": None}
    assert [t.zone for t in sysfs.trips()] == ["cpu-thermal", "cpu-thermal"]
    assert SysfsThermal.discover(orin).get("tj-thermal") is None  # its dangling link is no zone


def test_negative_millidegrees_are_cold_not_garbage(tmp_path):
    root = sysfs_tree(tmp_path / "sys", [("cpu-thermal", "-18250", PI5_TRIPS)])
    assert SysfsThermal(root, ["cpu-thermal"]).read().max_c == -18.25


@pytest.mark.parametrize(("trip", "kept"), [
    (0, False),  # unset
    (-273150, False),  # THERMAL_TEMP_INVALID-like
    (2147483647, False),  # INT_MAX: "no trip" in some drivers
    (300000, False),  # past any physical reading
    (125000, True),  # a loose but real critical trip: kept, and above the profile's, it changes nothing
])
def test_zero_and_absurd_trip_points_never_become_limits(tmp_path, trip, kept):
    root = sysfs_tree(tmp_path / "sys", [("cpu-thermal", "48000", [("critical", trip, 0), ("passive", trip, 0)])])
    trips = SysfsThermal(root, ["cpu-thermal"]).trips()
    limits, _ = Limits.resolve(get_profile("rpi5").thermal, trips)
    assert limits == Limits(70.0, 75.0, 78.0, 80.0, 110.0)
    assert bool([t for t in trips if t.kind == "critical" and t.temp_c > 0]) is kept


def test_guard_walks_the_levels_on_a_pi5_tree_through_a_failed_read(pi5):
    """Every level on a simulated clock, from real files: rises at once, falls only past the hysteresis
    and after the dwell; a read that fails in between is a sensor failure that changes no level."""
    profile = get_profile("rpi5")
    now = [0.0]
    sysfs = SysfsThermal(pi5, profile.thermal.zones, clock=lambda: now[0])
    warnings = []
    guard = Guard(Limits.resolve(profile.thermal, sysfs.trips())[0], profile.thermal_model,
                  GuardConfig(min_dwell_s=10.0, hysteresis_c=1.0), warn=warnings.append)
    temp = pi5 / "thermal_zone0" / "temp"

    def feed(text: str, dt: float = 2.0) -> Level:
        now[0] += dt
        if os.path.islink(temp):
            temp.unlink()
        temp.write_text(text)
        return guard.observe(now[0], sysfs.read())

    walk = [("60000", Level.NORMAL), ("70000", Level.WARM), ("71600", Level.HOT), ("78000", Level.CRITICAL),
            *[("69900", Level.CRITICAL)] * 4,  # below resume, but within the 10 s dwell (t = 8 s to 16 s)
            ("69900", Level.WARM),  # dwell done: 69.9 + 1 °C of hysteresis is still warm
            *[("69500", Level.WARM)] * 5,  # 10 s later: 69.5 + 1 °C is still warm
            ("68900", Level.NORMAL)]
    assert [feed(text) for text, _ in walk] == [level for _, level in walk]
    assert not guard.pacing
    temp.write_text("")  # the sensor has no data yet (ENODATA reads as an empty or failed read)
    now[0] += 2.0
    assert guard.observe(now[0], sysfs.read()) is Level.NORMAL
    assert not guard.sensor_ok
    assert guard.pacing  # the fixed conservative rate
    assert len(warnings) == 1
    assert feed("72000") is Level.HOT
    assert guard.sensor_ok
