"""thermal2_51: ``thermal report`` on a one-record file, a level it does not know, files joined with ``cat``
and long runs (memory); the clock cap's messages on a board."""

from __future__ import annotations

import json
import math
import tracemalloc

import pytest

pytest.importorskip("matplotlib")

from edgesdk.thermal import report  # noqa: E402  (needs matplotlib)
from edgesdk.thermal.report import _level_steps, render  # noqa: E402

META = {"type": "meta", "version": 2, "profile": "rpi5", "mode": "board", "guarded": True}


def write(path, *runs):
    """A telemetry file of ``runs``, each (meta, step records), one JSON object a line."""
    with open(path, "w", encoding="utf-8") as handle:
        for meta, steps in runs:
            handle.write(json.dumps(meta) + "\n")
            for step in steps:
                handle.write(json.dumps({"type": "step", "kind": "decode", "tokens": 1, "level": "normal", **step})
                             + "\n")
    return path


def decode_steps(count, rate=10.0, temp=60.0):
    return [{"t": (i + 1) / rate, "temp_c": temp + i / count} for i in range(count)]


@pytest.fixture
def figure(monkeypatch):
    """The figure render saves (it closes it after): the real save still runs."""
    saved = {}
    real = report._save_atomically

    def keep(fig, out):
        saved["fig"] = fig
        real(fig, out)

    monkeypatch.setattr(report, "_save_atomically", keep)
    return saved


def test_a_run_of_one_record_draws_its_one_temperature(tmp_path, figure):
    """A first 'edgesdk run -n 1' writes one step record: a line of one point draws nothing, so its 50 °C
    was in the legend but nowhere on the plot. The lone reading is marked."""
    render([write(tmp_path / "one.jsonl", (META, [{"t": 1.0, "temp_c": 50.0}]))], tmp_path / "one.png")
    (line,) = [line for line in figure["fig"].axes[0].get_lines() if line.get_label() == "one"]
    assert line.get_marker() == "o"
    assert list(line.get_markevery()) == [0]


def test_a_lone_reading_between_failed_reads_is_marked_and_the_rest_are_not(tmp_path, figure):
    nan = float("nan")
    temps = [60.0, 61.0, nan, 62.0, nan, 63.0, 64.0]
    steps = [{"t": float(i + 1), "temp_c": None if math.isnan(v) else v} for i, v in enumerate(temps)]
    render([write(tmp_path / "gaps.jsonl", (META, steps))], tmp_path / "gaps.png")
    line = figure["fig"].axes[0].get_lines()[0]
    assert list(line.get_markevery()) == [3]


def test_a_level_the_report_does_not_know_is_a_gap_not_unguarded():
    """A guarded run's records with a level this edgesdk does not know (a newer one's, a garbled field) were
    drawn at "unguarded", as if the guard had been off for that time."""
    steps = [{"t": 1.0, "level": "hot"}, {"t": 2.0, "level": "paused"}, {"t": 3.0, "level": None},
             {"t": 4.0, "level": "warm"}]
    _, level = _level_steps(steps)
    assert level[1] == report.LEVELS.index("hot")
    assert math.isnan(level[2])
    assert math.isnan(level[3])
    assert level[4] == report.LEVELS.index("warm")


def test_runs_joined_with_cat_are_drawn_as_two_runs_not_one_at_twice_the_rate(tmp_path, figure):
    """``cat a.jsonl b.jsonl > board.jsonl``: the second run's time starts at 0 again. Read as one run, both
    runs' tokens were summed into the same rate bins (20 tok/s for two runs at 10) and the temperature line
    went back in time. Each meta record after step records begins a run of its own."""
    first = (dict(META, label="monday"), decode_steps(600, temp=60.0))
    second = (dict(META, label="tuesday"), decode_steps(600, temp=70.0))
    path = write(tmp_path / "board.jsonl", first, second)
    render([path], tmp_path / "board.png")
    ax_t, _, ax_r = figure["fig"].axes
    assert [line.get_label() for line in ax_r.get_lines()] == ["monday", "tuesday"]
    for line in ax_r.get_lines():
        assert max(line.get_ydata()) == pytest.approx(10.0, abs=1.0)
    for line in ax_t.get_lines()[:2]:
        assert all(b >= a for a, b in zip(line.get_xdata()[:-1], line.get_xdata()[1:], strict=True))


def test_two_runs_of_one_file_without_labels_are_told_apart(tmp_path, figure):
    path = write(tmp_path / "board.jsonl", (META, decode_steps(20)), (META, decode_steps(20)))
    render([path], tmp_path / "board.png")
    labels = [line.get_label() for line in figure["fig"].axes[2].get_lines()]
    assert labels == ["board run 1", "board run 2"]


def test_report_of_a_long_run_holds_far_less_than_the_whole_file_in_memory(tmp_path):
    """A day of decode steps at 30 tok/s is 2.6 million records, about a GB of JSONL: the whole text and every
    whole record (zones, guard state) in memory took about 11 times the file's size (920 MB for an 84 MB file),
    more than a Pi or a small laptop has. Only the plotted fields of each record are kept now."""
    step = {"type": "step", "kind": "decode", "tokens": 1, "duration_s": 0.031234, "wait_s": 0.0, "tok_s": 32.016,
            "zones": {"cpu-thermal": 71.234, "gpu-thermal": 70.1}, "level": "warm", "budget": 1.0,
            "rate_limit_tok_s": None, "sensor_ok": True, "firmware_limited": False, "paused": False,
            "throttled": False}
    path = tmp_path / "long.jsonl"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(META) + "\n")
        for i in range(30_000):
            handle.write(json.dumps({**step, "t": round(i * 0.0312, 6), "temp_c": 70 + i % 7},
                                    separators=(",", ":")) + "\n")
    size = path.stat().st_size
    tracemalloc.start()
    try:
        render([path], tmp_path / "long.png")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 6 * size, f"peak {peak / 1e6:.0f} MB for a {size / 1e6:.0f} MB file"


def test_a_file_that_cannot_be_read_is_named(tmp_path):
    from edgesdk.errors import EdgeSDKError

    with pytest.raises(EdgeSDKError, match="cannot be read"):
        render([tmp_path / "gone.jsonl"], tmp_path / "x.png")


# --- the clock cap (edgesdk/thermal/cpufreq.py) ---

PI5_KHZ = [1_500_000 + 100_000 * i for i in range(10)]


def test_a_cap_left_by_a_killed_run_on_a_relative_root_is_given_back_from_another_directory(tmp_path, monkeypatch):
    """$EDGESDK_CPUFREQ_ROOT=host (a container's bind mount of the host's /sys, given relative): the state file named
    each capped file by its relative path, so the next run, started from another directory (a service's
    WorkingDirectory), read nothing there, dropped the record and left the board capped until a reboot."""
    import os
    import subprocess
    import sys

    from edgesdk.thermal.cpufreq import recover
    from tests._utils.sysfs import make_cpufreq_policy

    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    elsewhere.mkdir()
    policy = make_cpufreq_policy(work / "host", 0, 2_400_000, 1_500_000, PI5_KHZ)
    state = tmp_path / "cache" / "clock-cap.json"
    killed = ("from edgesdk.thermal.cpufreq import CpuFreqCap; import os, sys; "
              "cap = CpuFreqCap('host', sys.argv[1]); cap.set_ratio(0.625); os._exit(9)")  # killed while capped
    done = subprocess.run([sys.executable, "-c", killed, str(state)], cwd=work, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, timeout=120)
    assert done.returncode == 9, done.stderr
    assert (policy / "scaling_max_freq").read_text().strip() == "1500000"
    monkeypatch.chdir(elsewhere)
    notes = recover(state)
    assert (policy / "scaling_max_freq").read_text().strip() == "2400000", notes
    assert not state.exists()


@pytest.fixture
def read_only_sysfs(tmp_path):
    """A cpufreq tree on a file system mounted read-only, as /sys is in a container that is not privileged;
    skipped where this test may not mount one."""
    import os
    import shutil
    import subprocess

    from tests._utils.sysfs import make_cpufreq_policy

    mount = tmp_path / "ro"
    mount.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount") or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "none", str(mount)], capture_output=True).returncode:
        pytest.skip("needs root allowed to mount a tmpfs")
    try:
        make_cpufreq_policy(mount, 0, 2_400_000, 1_500_000, PI5_KHZ)
        if subprocess.run(["mount", "-o", "remount,ro", str(mount)], capture_output=True).returncode:
            pytest.skip("cannot remount the tmpfs read-only")
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)


def test_root_in_a_container_with_a_read_only_sys_is_not_told_to_run_as_root(read_only_sysfs):
    from edgesdk.thermal.cpufreq import CpuFreqCap

    cap = CpuFreqCap(read_only_sysfs)
    assert not cap.available
    described = cap.describe()
    assert "mounted read-only" in described
    assert "--privileged" in described
    assert "run as root" not in described


# --- the session's cleanup (edgesdk/thermal/watch.py) ---


def test_a_clock_cap_whose_warning_fails_at_close_still_lets_the_rest_of_the_session_close(tmp_path):
    """'edgesdk run --clock-cap ... 2>&1 | head': stderr is gone when the run ends, and nvpmodel changed the ceiling
    while it was capped, so giving the clock back warns, and the warning raises. ThermalSession.close stopped there:
    the poller ran on, the telemetry file was left open and unsynced. Each part closes now; the error still rises."""
    from edgesdk.thermal.cpufreq import CpuFreqCap
    from edgesdk.thermal.sensors import Poller, Reading
    from edgesdk.thermal.simulator import RealClock
    from edgesdk.thermal.telemetry import Telemetry
    from edgesdk.thermal.watch import ThermalHook, ThermalSession
    from tests._utils.sysfs import make_cpufreq_policy

    def gone(message):
        raise BrokenPipeError(32, "Broken pipe")

    policy = make_cpufreq_policy(tmp_path / "board", 0, 2_400_000, 1_500_000, PI5_KHZ)
    cap = CpuFreqCap(tmp_path / "board", tmp_path / "cache" / "clock-cap.json", warn=gone)
    cap.set_ratio(0.625)
    (policy / "scaling_max_freq").write_text("2000000\n")  # nvpmodel's new mode, while capped

    class Sensor:
        def read(self):
            return Reading(time=RealClock.now(), zones={"cpu-thermal": 50.0})

    poller = Poller(Sensor(), 0.05).start()
    telemetry = Telemetry(tmp_path / "run.jsonl", {"profile": "rpi5"}, keep=False)
    session = ThermalSession(ThermalHook(RealClock(), lambda: poller.latest, telemetry=telemetry), [], poller, cap)
    with pytest.raises(BrokenPipeError):
        session.close()
    assert not poller._thread.is_alive()
    assert telemetry._file is None
    assert (policy / "scaling_max_freq").read_text().strip() == "2000000"  # theirs: left alone
