"""``edgesdk run --watch-thermal / --simulate-thermal / --telemetry`` and ``edgesdk thermal ...``."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.thermal.telemetry import StatusLine, load
from tests._utils.signals import default_signals as _default_signals
from tests._utils.sysfs import make_cpufreq_policy, make_zone
from tests.unit.test_lean_import import RUN_CLI

# The board runtime must not import the host stack, nor matplotlib (only 'thermal report' may).
RUN_LEAN = RUN_CLI.replace("BLOCKED = ", "BLOCKED = ('matplotlib',) + ")


def invoke(*args, env=None):
    return CliRunner(env=env).invoke(main, [str(a) for a in args], prog_name="edgesdk")


def assert_ok(result):
    assert result.exit_code == 0, f"exit {result.exit_code}\n{result.output}\n{result.exception!r}"


@pytest.fixture
def bundle(tiny_bundle, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_bundle.path, tmp_path / "bundle"))


@pytest.fixture
def plain_text(bundle):
    result = invoke("run", bundle, "--prompt", "hello", "-n", 12, "--raw")
    assert_ok(result)
    return result.stdout


def sysfs_tree(root: Path, kind: str, millidegree: int) -> Path:
    make_zone(root, 0, kind, f"{millidegree}\n", trips=[("critical", 105000, None)])
    return root


def test_watch_thermal_on_a_machine_without_thermal_zones(bundle, plain_text, tmp_path):
    """No zone, no vcgencmd, no jetson-stats: it says so, paces at a fixed rate, and the text is intact.

    Runs in a fresh interpreter that cannot import torch, transformers or matplotlib."""
    env = {**os.environ, "EDGESDK_THERMAL_ROOT": str(tmp_path / "no-thermal")}
    proc = subprocess.run([sys.executable, "-c", RUN_LEAN, "run", str(bundle), "--prompt", "hello", "-n", "12",
                           "--raw", "--watch-thermal"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == plain_text  # the status goes to stderr only; not one byte more on stdout
    assert "no thermal zones under" in proc.stderr
    assert "no thermal sensor found" in proc.stderr
    assert "conservative fixed rate" in proc.stderr
    # Said once, as the plan: not a sensor failure "until it recovers", and no budget that moves nothing.
    assert "thermal sensor failed" not in proc.stderr
    assert "SENSOR FAILED" not in proc.stderr
    assert "no sensor" in proc.stderr  # the status line (log mode: stderr is not a terminal)
    assert "budget" not in proc.stderr.split("not adjustable")[-1]


def test_watch_thermal_reads_sysfs_zones(bundle, plain_text, tmp_path):
    root = sysfs_tree(tmp_path / "thermal", "x86_pkg_temp", 45500)  # a host profile zone type
    result = invoke("run", bundle, "--prompt", "hello", "-n", 12, "--raw", "--watch-thermal",
                    "--telemetry", tmp_path / "t.jsonl", env={"EDGESDK_THERMAL_ROOT": str(root)})
    assert_ok(result)
    assert result.stdout == plain_text
    assert "thermal sensors: sysfs x86_pkg_temp" in result.stderr
    assert "45.5 °C  normal" in result.stderr
    meta, steps = load(tmp_path / "t.jsonl")
    assert meta["profile"] == "host"
    assert meta["guarded"]
    assert meta["mode"] == "board"
    assert meta["limits"]["shutdown_c"] == 105  # the board's critical trip is below the profile's 115 °C
    assert sum(s["tokens"] for s in steps) == 12
    assert {s["temp_c"] for s in steps} == {45.5}
    assert {s["level"] for s in steps} == {"normal"}


def test_simulate_thermal_with_telemetry(bundle, plain_text, tmp_path):
    path = tmp_path / "sim.jsonl"
    result = invoke("run", bundle, "--prompt", "hello", "-n", 12, "--raw", "--simulate-thermal",
                    "--thermal-target", "rpi5", "--ambient", 35, "--sim-speed", 50, "--telemetry", path)
    assert_ok(result)
    assert result.stdout == plain_text
    assert "simulated rpi5 board: ambient 35 °C" in result.stderr
    meta, steps = load(path)
    assert meta["mode"] == "simulated"
    assert meta["ambient_c"] == 35
    assert meta["limits"]["soft_c"] == 75
    assert steps[0]["kind"] == "prefill"
    assert steps[0]["temp_c"] == pytest.approx(35 + 9.5 * 2.8, abs=0.5)
    assert all(s["clock"] == 1.0 for s in steps)
    assert sum(s["tokens"] for s in steps) == 12
    assert {"t", "zones", "level", "tok_s", "budget", "wait_s", "power_w", "sensor_ok"} <= set(steps[-1])


def test_telemetry_without_guard_never_waits(bundle, tmp_path):
    path = tmp_path / "u.jsonl"
    result = invoke("run", bundle, "--prompt", "hello", "-n", 8, "--raw", "--simulate-thermal", "--no-guard",
                    "--thermal-target", "rpi5", "--ambient", 60, "--telemetry", path)
    assert_ok(result)
    meta, steps = load(path)
    assert not meta["guarded"]
    assert {s["level"] for s in steps} == {"unguarded"}
    assert all(s["wait_s"] == 0 for s in steps)


PI5_KHZ = [1_500_000 + 100_000 * i for i in range(10)]


def board_env(tmp_path: Path, millidegree: int, cpufreq: bool = True) -> tuple[dict, Path | None]:
    """A Pi 5 zone at ``millidegree`` and (optionally) its cpufreq policy, in temporary trees."""
    root = sysfs_tree(tmp_path / "thermal", "cpu-thermal", millidegree)
    policy = make_cpufreq_policy(tmp_path / "fs", 0, 2_400_000, 1_500_000, PI5_KHZ) if cpufreq else None
    env = {"EDGESDK_THERMAL_ROOT": str(root), "EDGESDK_CPUFREQ_ROOT": str(tmp_path / "fs"),
           "EDGESDK_CACHE": str(tmp_path / "cache")}
    return env, policy


def test_watch_thermal_with_clock_cap_caps_while_hot_and_gives_the_clock_back(bundle, plain_text, tmp_path):
    """A Pi 5 at 74 °C (past the pacing threshold): the guard caps cpufreq at 1.5 GHz while it
    generates, and the 2.4 GHz ceiling is back when the run ends."""
    env, policy = board_env(tmp_path, 74000)
    result = invoke("run", bundle, "--prompt", "hello", "-n", 12, "--raw", "--watch-thermal", "--clock-cap",
                    "--thermal-target", "rpi5", "--telemetry", tmp_path / "t.jsonl", env=env)
    assert_ok(result)
    assert result.stdout == plain_text
    assert "CPU clock cap via cpufreq scaling_max_freq (policy0 2.4 GHz)" in result.stderr
    assert "capped at 62.5% of each policy's scaling_max_freq as the cap begins" in result.stderr
    _, steps = load(tmp_path / "t.jsonl")
    assert {s["level"] for s in steps} == {"hot"}
    assert {s["clock_cap"] for s in steps} == {0.625}
    assert (policy / "scaling_max_freq").read_text().strip() == "2400000"
    assert not (tmp_path / "cache" / "clock-cap.json").exists()
    sensors = invoke("thermal", "sensors", "--target", "rpi5", "--root", env["EDGESDK_THERMAL_ROOT"], env=env)
    assert "clock    CPU clock cap via cpufreq" in sensors.stdout


def test_clock_cap_without_cpufreq_says_so_and_only_paces(bundle, plain_text, tmp_path):
    env, _ = board_env(tmp_path, 74000, cpufreq=False)
    result = invoke("run", bundle, "--prompt", "hello", "-n", 12, "--raw", "--watch-thermal", "--clock-cap",
                    "--thermal-target", "rpi5", "--telemetry", tmp_path / "t.jsonl", env=env)
    assert_ok(result)
    assert result.stdout == plain_text
    assert "CPU clock cap unavailable: no cpufreq policies under" in result.stderr
    assert "capped at" not in result.stderr
    _, steps = load(tmp_path / "t.jsonl")
    assert {s["level"] for s in steps} == {"hot"}
    assert {s["clock_cap"] for s in steps} == {None}  # the guard asks for no cap it cannot get



@pytest.mark.parametrize("stop", ["SIGTERM", "SIGHUP"])
def test_a_stopped_run_gives_the_clock_back(bundle, tmp_path, stop):
    """Past the hard limit the guard pauses (clock capped) until the board cools, which this zone
    never does; a service stop (SIGTERM) or a closed terminal (SIGHUP) then still restores the
    ceiling and clears the state."""
    import signal
    import time

    board, policy = board_env(tmp_path, 79000)
    env = {**os.environ, **board}
    proc = subprocess.Popen([sys.executable, "-m", "edgesdk", "run", str(bundle), "--prompt", "hello", "-n", "8",
                             "--raw", "--watch-thermal", "--clock-cap", "--thermal-target", "rpi5"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_signals)
    ceiling = policy / "scaling_max_freq"
    deadline = time.monotonic() + 120
    while ceiling.read_text().strip() != "1500000" and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert ceiling.read_text().strip() == "1500000", proc.communicate(timeout=5)
    assert (tmp_path / "cache" / "clock-cap.json").exists()
    signum = getattr(signal, stop)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, stderr
    assert ceiling.read_text().strip() == "2400000"
    assert not (tmp_path / "cache" / "clock-cap.json").exists()


def test_a_stopped_run_without_clock_cap_still_closes_its_session(bundle, tmp_path):
    """SIGTERM while paused (no --clock-cap): the run exits through its cleanup (status line reset,
    telemetry closed) with 128 + SIGTERM, instead of being killed where it stood."""
    import signal
    import time

    board, _ = board_env(tmp_path, 79000, cpufreq=False)
    telemetry = tmp_path / "t.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "edgesdk", "run", str(bundle), "--prompt", "hello", "-n", "8",
                             "--raw", "--watch-thermal", "--thermal-target", "rpi5", "--telemetry", str(telemetry)],
                            env={**os.environ, **board}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and \
            '"critical"' not in (telemetry.read_text() if telemetry.exists() else ""):
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate(timeout=5)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, stderr


def test_ctrl_c_in_an_interactive_session_stops_the_answer_not_the_session(bundle, tmp_path):
    """On a terminal, Ctrl-C while an answer is held (here paused past the hard limit) ends that
    answer; the session then reads the next prompt, and Ctrl-D ends it cleanly."""
    import signal

    from tests._utils.terminal import TerminalSession

    board, _ = board_env(tmp_path, 79000, cpufreq=False)
    telemetry = tmp_path / "t.jsonl"
    argv = [sys.executable, "-m", "edgesdk", "run", str(bundle), "-n", "8", "--raw", "--watch-thermal",
            "--thermal-target", "rpi5", "--telemetry", str(telemetry)]
    with TerminalSession(argv, {**os.environ, **board}, preexec_fn=_default_signals) as terminal:
        proc = terminal.process
        terminal.read_until(lambda: b"> " in terminal.seen)
        terminal.type(b"hello\n")
        terminal.read_until(lambda: '"critical"' in (telemetry.read_text() if telemetry.exists() else ""))
        assert proc.poll() is None, terminal.text
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal sends for Ctrl-C
        terminal.read_until(lambda: b"answer stopped" in terminal.seen)
        assert b"answer stopped" in terminal.seen, terminal.text
        assert proc.poll() is None  # the session goes on
        terminal.type(b"\x04")  # Ctrl-D at the prompt
        proc.wait(timeout=60)
        assert proc.returncode == 0, terminal.text


def test_a_telemetry_path_under_a_file_is_a_clear_error_and_leaks_no_thread(tmp_path):
    """open_session fails at its last step: the sensor poller it started is stopped, and the error
    names --telemetry and the path instead of a FileExistsError traceback."""
    import threading

    from edgesdk.errors import EdgeSDKError
    from edgesdk.profile import get_profile
    from edgesdk.thermal.watch import open_session

    root = sysfs_tree(tmp_path / "thermal", "cpu-thermal", 50000)
    (tmp_path / "afile").write_text("")
    path = tmp_path / "afile" / "run.jsonl"
    with pytest.raises(EdgeSDKError) as error:
        open_session(get_profile("rpi5"), telemetry_path=str(path), sysfs_root=str(root), status=False)
    assert f"--telemetry {path}" in str(error.value)
    assert error.value.fix
    assert "edgesdk-thermal-poll" not in [thread.name for thread in threading.enumerate()]


def leave_a_cap(tmp_path: Path) -> tuple[dict, Path]:
    """A run capped the clock at 1.5 GHz and was killed (SIGKILL, SIGHUP): cap and state file stay."""
    from edgesdk.thermal.cpufreq import CpuFreqCap

    env, policy = board_env(tmp_path, 50000)
    CpuFreqCap(tmp_path / "fs", tmp_path / "cache" / "clock-cap.json").set_ratio(0.625)
    assert (policy / "scaling_max_freq").read_text().strip() == "1500000"
    return env, policy


@pytest.mark.parametrize("flags", [[], ["--simulate-thermal", "--thermal-target", "rpi5"]])
def test_every_run_gives_back_a_clock_cap_a_killed_run_left(bundle, tmp_path, flags):
    env, policy = leave_a_cap(tmp_path)
    result = invoke("run", bundle, "--prompt", "hello", "-n", 4, "--raw", *flags, env=env)
    assert_ok(result)
    assert (policy / "scaling_max_freq").read_text().strip() == "2400000"
    assert not (tmp_path / "cache" / "clock-cap.json").exists()
    assert "a previous run was stopped while it capped the clock" in result.stderr


def test_thermal_sensors_gives_back_a_clock_cap_a_killed_run_left(tmp_path):
    env, policy = leave_a_cap(tmp_path)
    result = invoke("thermal", "sensors", "--target", "rpi5", "--root", env["EDGESDK_THERMAL_ROOT"], env=env)
    assert_ok(result)
    assert (policy / "scaling_max_freq").read_text().strip() == "2400000"
    assert "(policy0 2.4 GHz)" in result.stdout  # the real ceiling, not the leftover cap
    assert "a previous run was stopped while it capped the clock" in result.stdout


def test_thermal_sensors_command(tmp_path):
    root = sysfs_tree(tmp_path / "thermal", "cpu-thermal", 51000)
    result = invoke("thermal", "sensors", "--target", "rpi5", "--root", root, "--json")
    assert_ok(result)
    info = json.loads(result.stdout)
    assert info["reading"]["zones"]["cpu-thermal"] == 51.0
    assert info["trips"][0]["kind"] == "critical"
    assert info["limits"]["shutdown_c"] == 105
    text = invoke("thermal", "sensors", "--target", "rpi5", "--root", tmp_path / "none")
    assert_ok(text)
    assert "sensor   none" in text.stdout
    assert "no thermal zones" in text.stdout


def test_thermal_plan_predicts_sustained_speed(bundle, tmp_path):
    result = invoke("thermal", "plan", bundle, "--target", "rpi5", "--minutes", 10, "--ambient", 35,
                    "--decode-tok-s", 35, "--json")
    assert_ok(result)
    plan = json.loads(result.stdout)
    guarded, unguarded = plan["guarded"], plan["unguarded"]
    assert guarded["max_temp_c"] <= 75
    assert guarded["throttle_s"] == 0
    assert unguarded["max_temp_c"] > 80
    assert unguarded["throttle_s"] > 0
    assert 0 < guarded["sustained_tok_s"] < unguarded["sustained_tok_s"] < 35
    table = invoke("thermal", "plan", bundle, "--target", "rpi5", "--minutes", 0.05)  # tiny model: fast
    assert_ok(table)
    assert "0.3 x 17 GB/s" in table.stdout
    assert "sustained tok/s" in table.stdout


def test_thermal_plan_needs_a_rate_or_a_bundle():
    result = invoke("thermal", "plan", "--target", "rpi5")
    assert result.exit_code != 0
    assert "--decode-tok-s" in result.output


def edgesdk_cli(*args, env=None, timeout=60) -> subprocess.CompletedProcess:
    """``edgesdk ARGS`` in a fresh interpreter, killed after ``timeout`` s (a run that never ends fails)."""
    return subprocess.run([sys.executable, "-m", "edgesdk", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_thermal_plan_ends_when_the_guard_pauses_for_good():
    """At 52 °C ambient a bare Pi 5 idles at 78.6 °C, above the 70 °C resume point: the guarded run
    pauses for good, and the plan still ends at its horizon and says why."""
    proc = edgesdk_cli("thermal", "plan", "--target", "rpi5", "--minutes", 1, "--ambient", 52,
                       "--decode-tok-s", 8, "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["guarded_paused_at_end"] is True
    assert plan["guarded"]["seconds"] == 60
    assert "never cooled below resume" in plan["notes"][0]
    assert "idles at 78.6 °C" in plan["notes"][0]
    assert "nor below 77 °C, where a pause ends after one time constant" in plan["notes"][0]
    assert plan["unguarded"]["tokens"] > 0


@pytest.mark.parametrize(("option", "value"), [("--decode-tok-s", 0), ("--decode-tok-s", -5), ("--minutes", 0),
                                               ("--prefill-tok-s", 0), ("--new-tokens", 0), ("--prompt-tokens", -1)])
def test_thermal_plan_refuses_rates_and_sizes_that_never_end(option, value):
    args = {"--decode-tok-s": 8, "--minutes": 1, option: value}
    result = invoke("thermal", "plan", "--target", "rpi5", *(x for item in args.items() for x in item))
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output


def test_simulated_run_stops_when_the_board_never_cools(bundle, tmp_path):
    """A simulated Pi 5 at 55 °C ambient idles at 81.6 °C, past the 78 °C hard limit: the guard pauses and
    the board never cools below 70 °C. The run ends (it used to spin, writing telemetry) and says so."""
    path = tmp_path / "sim.jsonl"
    proc = edgesdk_cli("run", bundle, "--prompt", "hello", "-n", 4, "--raw", "--simulate-thermal",
                       "--thermal-target", "rpi5", "--ambient", 55, "--telemetry", path)
    assert proc.returncode == 1, proc.stderr
    assert "never cooled below the guard's resume point 70 °C" in proc.stderr
    assert "55 °C ambient" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert path.stat().st_size < 2_000_000


def test_thermal_report_renders_a_png(tmp_path):
    out_dir = tmp_path / "tel"
    assert_ok(invoke("thermal", "plan", "--target", "rpi5", "--minutes", 4, "--ambient", 35, "--decode-tok-s", 35,
                     "--telemetry-dir", out_dir))
    files = sorted(out_dir.glob("*.jsonl"))
    assert [f.name for f in files] == ["rpi5-35C-guarded.jsonl", "rpi5-35C-unguarded.jsonl"]
    result = invoke("thermal", "report", *files, "-o", tmp_path / "plot.png")
    assert_ok(result)
    png = (tmp_path / "plot.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(png) > 20_000


def test_report_of_an_empty_file_is_a_clear_error(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"type": "meta"}\nnot json\n')
    result = invoke("thermal", "report", empty)
    assert result.exit_code != 0
    assert "no step records" in result.stderr
    assert "fix:" in result.stderr


def wide_terminal(monkeypatch) -> None:
    """A FakeTTY has no size: the status line's width came from $COLUMNS or the terminal pytest runs in (the live
    line is cut to width - 1), so a narrow one cut what these tests read. An 80-column terminal, as the tests that
    cut on purpose set one. TERM too: with TERM=dumb (a CI log) the status prints plain lines, not in place."""
    monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback=None: os.terminal_size((80, 24)))
    monkeypatch.setenv("TERM", "xterm-256color")


class FakeTTY(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self._tty = tty

    def isatty(self):
        return self._tty


def test_status_line_in_a_log_prints_level_changes_only():
    err, out = FakeTTY(False), FakeTTY(False)
    status = StatusLine(err, out)
    assert status.mode == "log"
    status.update("70.0 °C warm", level="warm")
    status.update("70.1 °C warm", level="warm")
    status.update("72.0 °C hot", level="hot")
    assert err.getvalue().splitlines() == ["edgesdk thermal: 70.0 °C warm", "edgesdk thermal: 72.0 °C hot"]
    assert out.getvalue() == ""


def test_status_line_redraws_in_place_when_stdout_is_elsewhere(monkeypatch):
    wide_terminal(monkeypatch)
    err, out = FakeTTY(True), FakeTTY(False)
    status = StatusLine(err, out, min_interval_s=0.0)
    assert status.mode == "inplace"
    status.update("61.0 °C normal", level="normal")
    status.close()
    assert err.getvalue().startswith("\r\x1b[2K61.0 °C normal")
    assert out.getvalue() == ""


def test_status_line_keeps_the_bottom_row_when_sharing_a_terminal(monkeypatch):
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback=None: os.terminal_size((80, 24)))
    err, out = FakeTTY(True), FakeTTY(True)  # no fileno: treated as the same terminal
    status = StatusLine(err, out, min_interval_s=0.0)
    assert status.mode == "bar"
    status.update("73.0 °C hot", level="hot")
    status.close()
    text = err.getvalue()
    assert "\x1b[1;23r" in text  # scroll region: every row but the last
    assert "\x1b7\x1b[24;1H\x1b[2K73.0 °C hot\x1b8" in text  # drawn on row 24, cursor restored
    assert "\x1b[r" in text  # region reset on close
    assert out.getvalue() == ""
    monkeypatch.setenv("TERM", "dumb")
    plain = StatusLine(FakeTTY(True), FakeTTY(True))
    assert plain.mode == "between"


def test_warnings_never_land_inside_the_streamed_text(monkeypatch):
    wide_terminal(monkeypatch)
    err, out = FakeTTY(True), FakeTTY(False)
    status = StatusLine(err, out, min_interval_s=0.0)
    status.warn("thermal sensor failed")
    assert "\nedgesdk thermal: warning" not in err.getvalue()  # only in the live line for now
    assert "warning: thermal sensor failed" in err.getvalue()
    status.between_answers()  # after the answer's newline
    assert err.getvalue().endswith("edgesdk thermal: warning: thermal sensor failed\n")
    log = FakeTTY(False)
    StatusLine(log, FakeTTY(False)).warn("x")
    assert log.getvalue() == "edgesdk thermal: warning: x\n"


LONG_STATUS = ("61.0 °C  normal  12.3 tok/s  no pacing  budget 1.00  [sysfs cpu-thermal, gpu-thermal, cv0-thermal, "
               "cv1-thermal, cv2-thermal, soc0-thermal, soc1-thermal, soc2-thermal, tj-thermal]")


def test_a_status_wider_than_the_terminal_is_cut_to_its_width(monkeypatch):
    """A wrapped live line leaves a copy of its first row at every redraw: it is cut to width - 1."""
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback=None: os.terminal_size((40, 24)))
    for out in (FakeTTY(False), FakeTTY(True)):  # in place, and in the bottom row of a shared terminal
        err = FakeTTY(True)
        status = StatusLine(err, out, min_interval_s=0.0)
        status.update(LONG_STATUS, force=True)
        drawn = err.getvalue().split("\x1b[2K")[-1].removesuffix("\x1b8")
        assert drawn == LONG_STATUS[:39], status.mode


def test_in_place_status_is_cleared_before_what_prints_between_answers(monkeypatch):
    wide_terminal(monkeypatch)
    err, out = FakeTTY(True), FakeTTY(False)
    status = StatusLine(err, out, min_interval_s=0.0)
    status.update("71.2 °C  hot  limit 4.2 tok/s", force=True)
    status.between_answers()
    assert err.getvalue().endswith("71.2 °C  hot  limit 4.2 tok/s\r\x1b[2K")  # a --stats line or "> " starts clean
    status.warn("thermal sensor failed")
    status.between_answers()
    assert err.getvalue().endswith("\r\x1b[2Kedgesdk thermal: warning: thermal sensor failed\n")


@pytest.mark.parametrize(("stdout_tty", "term"), [(False, "xterm-256color"), (True, "xterm-256color"), (True, "dumb")])
def test_warnings_pending_when_a_run_stops_mid_answer_are_printed_on_close(monkeypatch, stdout_tty, term):
    """Ctrl-C, SIGTERM or an error mid-answer never reaches between_answers: close prints what is
    pending, on a line of its own when the streamed text shares the terminal."""
    monkeypatch.setenv("TERM", term)
    monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback=None: os.terminal_size((80, 24)))
    err, out = FakeTTY(True), FakeTTY(stdout_tty)
    status = StatusLine(err, out, min_interval_s=0.0)
    status.update("79.0 °C  critical  paused", level="critical")
    status.warn("policy0: scaling_max_freq changed to 1800000 kHz by someone else; the clock cap leaves it alone")
    status.close()
    shared = status.mode != "inplace"
    assert err.getvalue().endswith(("\n" if shared else "\r\x1b[2K") + "edgesdk thermal: warning: policy0: "
                                   "scaling_max_freq changed to 1800000 kHz by someone else; the clock cap leaves it alone\n")
    assert out.getvalue() == ""


def test_a_warning_after_the_answer_prints_on_close_without_an_empty_line(monkeypatch):
    monkeypatch.setenv("TERM", "dumb")
    err, out = FakeTTY(True), FakeTTY(True)
    status = StatusLine(err, out, min_interval_s=0.0)
    assert status.mode == "between"
    status.update("61.0 °C normal", level="normal")
    status.between_answers()
    status.warn("policy0: cannot write scaling_max_freq")
    status.close()
    assert err.getvalue().endswith("edgesdk thermal: 61.0 °C normal\nedgesdk thermal: warning: policy0: "
                                   "cannot write scaling_max_freq\n")
