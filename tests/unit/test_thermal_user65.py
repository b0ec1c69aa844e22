"""What a Jetson Orin or Raspberry Pi 5 owner met with the thermal guard, on sysfs trees laid out as a board's.

* The Jetson power mode never reached the telemetry or the status line, and without jetson-stats nothing read it:
  it is read from ``var/lib/nvpmodel/status`` under the file-system root above the thermal directory, written to the
  meta record, to a step record where it changed, and shown in the status text.
* ``edgesdk env`` read ``/sys`` where ``$EDGESDK_THERMAL_ROOT`` and ``$EDGESDK_CPUFREQ_ROOT`` moved it for ``thermal
  sensors`` and the guard.
* With stdout and stderr on one pipe (``run ... 2>&1 | tee log``) or a terminal without a size (a serial console), a
  pause printed nothing until the answer ended.
* ``run --stats`` called a critical pause "thermal pacing".
* A Raspberry Pi profile on a machine without ``vcgencmd`` said nothing of the firmware bits the guard then never reads.
* Offline zones (-256 °C) printed as "no data", and a board of offline zones showed "SENSOR FAILED".
* ``thermal plan --clock-cap`` on a Jetson predicted the cap's gain from the Pi 5's clock and voltage points silently.
"""

from __future__ import annotations

import io
import json
import os
import pty
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.cli_run import Pacing, _pacing, _stats_line, _waited
from edgesdk.envinfo import collect_env
from edgesdk.profile import get_profile
from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.session import open_runtime
from edgesdk.thermal.guard import Guard, Limits
from edgesdk.thermal.sensors import SysfsThermal, detect_sensors
from edgesdk.thermal.simulator import RealClock, SimulatedBoard, SimulatedSensor, WorkModel
from edgesdk.thermal.telemetry import StatusLine, Telemetry, load
from edgesdk.thermal.watch import ThermalHook, open_session
from tests._utils.sysfs import make_cpufreq_policy, make_zone

ORIN = get_profile("orin-nano-8gb")
PI = get_profile("rpi5")  # hard limit 78 °C
CONF = """# modes of this module
< PM_CONFIG DEFAULT=2 >
< POWER_MODEL ID=0 NAME=15W >
< POWER_MODEL ID=1 NAME=25W >
< POWER_MODEL ID=2 NAME=MAXN_SUPER >
< POWER_MODEL ID=3 NAME=7W >
"""


def jetson_root(tmp_path, status: str | None = "pmode:0002 fmode:quiet\n"):
    """A board's file-system root: a cpu-thermal zone, nvpmodel's status file and its configuration."""
    make_zone(tmp_path / "sys" / "class" / "thermal", 0, "cpu-thermal", "52000\n")
    (tmp_path / "etc").mkdir(exist_ok=True)
    (tmp_path / "etc" / "nvpmodel.conf").write_text(CONF)
    if status is not None:
        (tmp_path / "var" / "lib" / "nvpmodel").mkdir(parents=True, exist_ok=True)
        (tmp_path / "var" / "lib" / "nvpmodel" / "status").write_text(status)
    return tmp_path / "sys" / "class" / "thermal"


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    return open_runtime(tiny_bundle.path)


# 1. the Jetson power mode


def test_nvpmodel_is_read_without_jetson_stats_and_named_from_its_configuration(tmp_path):
    root = jetson_root(tmp_path)
    sensor, _, _ = detect_sensors(ORIN.thermal.zones, root, use_jtop=False)
    assert sensor.read().nvpmodel == "MAXN_SUPER"  # before: None, jtop alone read it
    (tmp_path / "etc" / "nvpmodel.conf").write_text("")  # no configuration names the mode
    sensor, _, _ = detect_sensors(ORIN.thermal.zones, root, use_jtop=False)
    assert sensor.read().nvpmodel == "mode 2"


def test_no_status_file_no_mode(tmp_path):
    sensor, _, _ = detect_sensors(ORIN.thermal.zones, jetson_root(tmp_path, status=None), use_jtop=False)
    assert sensor.read().nvpmodel is None
    assert "nvpmodel" not in sensor.source


def test_nvpmodel_goes_to_the_meta_record_a_changed_step_record_and_the_status_text(tmp_path):
    root = jetson_root(tmp_path)
    session = open_session(ORIN, guard=False, telemetry_path=str(tmp_path / "run.jsonl"), status=False,
                           sysfs_root=str(root))
    try:
        assert session.hook.telemetry.meta["nvpmodel"] == "MAXN_SUPER"  # the mode the run started in
    finally:
        session.close()
    sensor, _, _ = detect_sensors(ORIN.thermal.zones, root, use_jtop=False)
    telemetry = Telemetry(tmp_path / "steps.jsonl", {"nvpmodel": "MAXN_SUPER"})
    hook = ThermalHook(RealClock(), sensor.read, telemetry=telemetry)
    hook.begin(1, 4)
    hook.after_step("prefill", 1, 0.01)
    assert "nvpmodel MAXN_SUPER" in hook.status_text()
    (tmp_path / "var" / "lib" / "nvpmodel" / "status").write_text("pmode:0003 fmode:quiet\n")  # sudo nvpmodel -m 3
    hook.after_step("decode", 1, 0.01)
    hook.after_step("decode", 1, 0.01)
    telemetry.close()
    meta, steps = load(tmp_path / "steps.jsonl")
    assert meta["nvpmodel"] == "MAXN_SUPER"
    assert [step.get("nvpmodel") for step in steps] == [None, "7W", None]  # written where it changed
    assert "nvpmodel 7W" in hook.status_text()


# 2. env reads the roots the guard reads


def test_env_reads_the_thermal_and_cpufreq_roots_thermal_sensors_reads(tmp_path, monkeypatch):
    thermal = tmp_path / "host" / "sys" / "class" / "thermal"
    make_zone(thermal, 0, "edgesdk-test-zone", "47000\n")
    make_cpufreq_policy(tmp_path / "host", 0, 2400000, 1500000)
    monkeypatch.setenv("EDGESDK_THERMAL_ROOT", str(thermal))
    monkeypatch.setenv("EDGESDK_CPUFREQ_ROOT", str(tmp_path / "host"))
    info = collect_env()
    assert info["thermal_zones"] == {"edgesdk-test-zone": 47.0}  # before: this machine's /sys/class/thermal
    assert [policy["policy"] for policy in info["cpufreq"]["policies"]] == ["policy0"]
    assert info["cpufreq"]["policies"][0]["max_mhz"] == 2400
    listed = CliRunner().invoke(main, ["thermal", "sensors", "--target", "host", "--json"], prog_name="edgesdk")
    assert listed.exit_code == 0, listed.output
    assert set(json.loads(listed.output)["reading"]["zones"]) == set(info["thermal_zones"])


def test_env_of_another_root_reads_that_root_whatever_the_environment(tmp_path, monkeypatch):
    make_zone(tmp_path / "elsewhere", 0, "not-this-one", "47000\n")
    monkeypatch.setenv("EDGESDK_THERMAL_ROOT", str(tmp_path / "elsewhere"))
    make_zone(tmp_path / "board" / "sys" / "class" / "thermal", 0, "cpu-thermal", "51000\n")
    assert collect_env(tmp_path / "board")["thermal_zones"] == {"cpu-thermal": 51.0}


# 3. a pause shows where stdout shares stderr's pipe, or on a terminal without a size


@pytest.fixture
def clock(monkeypatch):
    """The status line's clock, moved by the test alone (its 10 s cadence never depends on how fast the test runs)."""
    now = SimpleNamespace(t=1000.0)
    monkeypatch.setattr("edgesdk.thermal.telemetry.time", SimpleNamespace(monotonic=lambda: now.t))
    return now


def shared_file(tmp_path) -> io.TextIOWrapper:
    """One file for stdout and stderr, as ``2>&1 | tee`` gives one pipe to both (same device and inode)."""
    return open(tmp_path / "log", "w+", encoding="utf-8")  # noqa: SIM115 (closed by the caller)


def test_a_shared_pipe_prints_a_pause_as_it_starts_and_ends(tmp_path, clock):
    log = shared_file(tmp_path)
    try:
        status = StatusLine(stream=log, stdout=log)
        assert status.mode == "between"
        status.update("50.0 °C  normal", level="normal", paused=False)
        status.update("78.5 °C  critical  paused", level="critical", paused=True)
        log.flush()
        assert (tmp_path / "log").read_text() == "edgesdk thermal: 78.5 °C  critical  paused\n"  # before: nothing
        status.update("78.6 °C  critical  paused", level="critical", paused=True)  # the same pause: no new line
        status.update("71.0 °C  hot  limit 3.0 tok/s", level="hot", paused=False, streams=True)  # it ended
        log.write("Hello")  # the answer streams
        status.update("71.5 °C  hot  limit 3.0 tok/s", level="hot", paused=False)  # pacing: no line mid-answer
        status.update("78.1 °C  critical  paused", level="critical", paused=True)  # a pause mid-answer
        log.write(" world\n")
        status.between_answers()
        log.flush()
        assert (tmp_path / "log").read_text().splitlines() == [
            "edgesdk thermal: 78.5 °C  critical  paused", "edgesdk thermal: 71.0 °C  hot  limit 3.0 tok/s",
            "Hello", "edgesdk thermal: 78.1 °C  critical  paused", " world",
            "edgesdk thermal: 78.1 °C  critical  paused"]
    finally:
        log.close()


def test_a_shared_pipe_says_a_level_change_and_a_long_hold_before_the_first_token(tmp_path, clock):
    log = shared_file(tmp_path)
    try:
        status = StatusLine(stream=log, stdout=log)
        status.update("70.0 °C  warm", level="warm")
        status.update("72.0 °C  hot  limit 9.0 tok/s", level="hot")  # the guard holds the first token back
        clock.t += 9.0
        status.update("72.1 °C  hot  limit 9.0 tok/s", level="hot")
        clock.t += 1.0  # 10 s since the last line, and still no token
        status.update("72.2 °C  hot  limit 9.0 tok/s", level="hot", streams=True)
        clock.t += 30.0  # the answer streams: no line mid-answer for the cadence
        status.update("72.3 °C  hot  limit 9.0 tok/s", level="hot")
        log.flush()
        assert (tmp_path / "log").read_text().splitlines() == [
            "edgesdk thermal: 72.0 °C  hot  limit 9.0 tok/s", "edgesdk thermal: 72.2 °C  hot  limit 9.0 tok/s"]
    finally:
        log.close()


def test_a_terminal_without_a_size_prints_a_pause(monkeypatch):
    """A serial console: stdout and stderr on one terminal that reports 0 rows."""
    monkeypatch.setenv("TERM", "vt220")
    monkeypatch.delenv("LINES", raising=False)
    monkeypatch.delenv("COLUMNS", raising=False)
    master, slave = pty.openpty()
    console = open(slave, "w", encoding="utf-8")  # noqa: SIM115 (closed below)
    try:
        status = StatusLine(stream=console, stdout=console)
        assert status.mode == "between"  # a line redrawn in place would wipe the row the answer streams on
        status.update("78.5 °C  critical  paused", level="critical", paused=True)
        assert b"edgesdk thermal: 78.5 \xc2\xb0C  critical  paused" in os.read(master, 4096)
    finally:
        console.close()
        os.close(master)


def test_the_hook_prints_a_pause_before_the_first_token_on_a_shared_pipe(tmp_path):
    """A simulated board past its hard limit as the request begins: the guard pauses before the prompt's step."""
    board = SimulatedBoard.from_profile(PI, 25.0, start_c=80.0, work=WorkModel(decode_tok_s=10.0, prefill_tok_s=100.0))
    sensor = SimulatedSensor(board, PI.thermal.zones[0])
    guard = Guard(Limits.resolve(PI.thermal, sensor.trips(PI, sensor.zone))[0], PI.thermal_model)
    log = shared_file(tmp_path)
    try:
        hook = ThermalHook(board, sensor.read, guard, board, status=StatusLine(stream=log, stdout=log))
        hook.begin(8, 4)
        hook.before_step("prefill")
        log.flush()
        lines = (tmp_path / "log").read_text().splitlines()
        assert any("paused" in line for line in lines), lines  # before: nothing until the answer ended
    finally:
        log.close()


# 4. --stats says a pause apart from pacing


def test_stats_say_a_pause_as_a_pause():
    pause = Pacing(10.0, 0.0, None, None, False, prefill_pause_s=10.0)
    assert _waited(10.0, pause, pause.prefill_pause_s) == "10.00 s of thermal pause"
    both = Pacing(0.0, 12.22, 5.0, None, False, decode_pause_s=10.0)
    assert _waited(12.22, both, both.decode_pause_s) == "12.22 s of thermal waits (2.22 s pacing, 10.00 s pause)"
    assert _waited(2.22, Pacing(0.0, 2.22, 5.0, None, False)) == "2.22 s of thermal pacing"


def test_a_paused_answer_s_stats_say_the_pause(runtime):
    """A simulated Pi 5 at 80 °C, past its 78 °C hard limit: the guard pauses before the prompt's step."""
    board = SimulatedBoard.from_profile(PI, 25.0, start_c=80.0, work=WorkModel(decode_tok_s=10.0, prefill_tok_s=100.0))
    sensor = SimulatedSensor(board, PI.thermal.zones[0])
    guard = Guard(Limits.resolve(PI.thermal, sensor.trips(PI, sensor.zone))[0], PI.thermal_model)
    hook = ThermalHook(board, sensor.read, guard, board, Telemetry())
    _, result = generate(runtime.backend, runtime.tokenizer.encode("Hello"), SamplingConfig(max_new_tokens=4),
                         stop_ids=set(), hook=hook)
    paused = sum(r["wait_s"] for r in hook.telemetry.records if r["kind"] == "wait" and r["paused"]
                 and r["t"] <= next(s["t"] for s in hook.telemetry.records if s["kind"] == "prefill"))
    assert paused > 0
    pacing = _pacing(result, hook)
    assert pacing.prefill_pause_s == pytest.approx(paused, abs=1e-6)
    line = _stats_line("ort-cpu", result.to_json(), False, pacing)
    assert "simulated s of thermal pause" in line or "s pause)" in line, line  # before: "... of thermal pacing"


# 5. a Pi without vcgencmd


def test_a_pi_profile_without_vcgencmd_is_noted_with_the_package(tmp_path):
    make_zone(tmp_path / "thermal", 0, "cpu-thermal", "50000\n")
    _, _, notes = detect_sensors(PI.thermal.zones, tmp_path / "thermal", which=lambda name: None, use_jtop=False,
                                 family="rpi")
    note = next((note for note in notes if note.startswith("vcgencmd is not on PATH")), None)
    assert note is not None, notes
    assert "raspi-utils" in note
    assert "libraspberrypi-bin" in note
    assert "--device /dev/vcio" in note
    _, _, notes = detect_sensors(ORIN.thermal.zones, tmp_path / "thermal", which=lambda name: None, use_jtop=False,
                                 family="jetson")
    assert not any("vcgencmd" in note for note in notes)


def test_thermal_sensors_on_a_pi_without_vcgencmd_says_so(tmp_path):
    make_zone(tmp_path / "thermal", 0, "cpu-thermal", "50000\n")
    (tmp_path / "bin").mkdir()
    result = CliRunner(env={"PATH": str(tmp_path / "bin")}).invoke(
        main, ["thermal", "sensors", "--target", "rpi5", "--root", str(tmp_path / "thermal")], prog_name="edgesdk")
    assert result.exit_code == 0, result.output
    assert "note     vcgencmd is not on PATH" in result.output


# 6. offline zones


def test_offline_zones_are_kept_apart_and_printed_as_offline(tmp_path):
    make_zone(tmp_path / "thermal", 0, "cpu-thermal", "48000\n")
    make_zone(tmp_path / "thermal", 1, "gpu-thermal", "-256000\n")
    reading = SysfsThermal(tmp_path / "thermal", ["cpu-thermal", "gpu-thermal"]).read()
    assert reading.zones == {"cpu-thermal": 48.0, "gpu-thermal": None}
    assert reading.offline == ["gpu-thermal"]
    result = CliRunner().invoke(main, ["thermal", "sensors", "--target", "orin-nano-8gb", "--root",
                                       str(tmp_path / "thermal")], prog_name="edgesdk")
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.strip().startswith("gpu-thermal"))
    assert "offline" in row
    assert "no data" not in row
    listed = CliRunner().invoke(main, ["thermal", "sensors", "--target", "orin-nano-8gb", "--root",
                                       str(tmp_path / "thermal"), "--json"], prog_name="edgesdk")
    assert json.loads(listed.output)["reading"]["offline"] == ["gpu-thermal"]


def test_a_board_of_offline_zones_shows_them_offline_not_a_failed_sensor(tmp_path):
    make_zone(tmp_path / "thermal", 0, "gpu-thermal", "-256000\n")
    sensor, trips, _ = detect_sensors(["gpu-thermal"], tmp_path / "thermal", which=lambda name: None, use_jtop=False)
    guard = Guard(Limits.resolve(ORIN.thermal, trips)[0], ORIN.thermal_model, warn=lambda message: None)
    hook = ThermalHook(RealClock(), sensor.read, guard)
    hook.begin(1, 4)
    assert not guard.sensor_ok
    text = hook.status_text()
    assert "SENSORS OFFLINE (gpu-thermal)" in text
    assert "SENSOR FAILED" not in text


# 7. plan --clock-cap on a board that is no Pi


def plan(*args):
    return CliRunner().invoke(main, ["thermal", "plan", "--decode-tok-s", "35", "--minutes", "2", "--json", *args],
                              prog_name="edgesdk")


def test_plan_clock_cap_on_a_jetson_notes_the_pi_5_points():
    result = plan("--target", "orin-nano-8gb", "--clock-cap")
    assert result.exit_code == 0, result.output
    notes = json.loads(result.output)["notes"]
    assert any("Raspberry Pi 5's clock and voltage points" in note and "GPU" in note for note in notes), notes


def test_plan_clock_cap_on_a_pi_or_without_the_cap_has_no_such_note():
    for args in (("--target", "rpi5", "--clock-cap"), ("--target", "orin-nano-8gb")):
        result = plan(*args)
        assert result.exit_code == 0, result.output
        assert not any("Raspberry Pi 5's clock" in note for note in json.loads(result.output)["notes"])
