"""Clock-cap state file, recovery of caps on policies unreadable now, the status line on a dumb or resized
terminal, and trip points in numeric order (review 51, thermal 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from edgesdk.thermal.cpufreq import CpuFreqCap, recover
from tests._utils.sysfs import make_cpufreq_policy

PI5_KHZ = (1_500_000, 1_800_000, 2_400_000)


def run_killed(script: str, *args: str) -> None:
    """Run ``script`` in a child python that ends with os._exit(9), as a run killed while capping."""
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 9, done.stderr


def test_a_state_file_write_that_fails_part_way_keeps_the_caps_recorded_before(tmp_path):
    """Every set_ratio rewrote clock-cap.json in place: truncated, then written. A disk that filled (here: the
    file-size limit, EFBIG, as ENOSPC does) or a kill between the two left a file that is not JSON, which the next
    run read as "no caps": the board stayed capped until a reboot. Written atomically, the last whole record
    stays."""
    policies = [make_cpufreq_policy(tmp_path, n, 2_400_000, 1_500_000, PI5_KHZ) for n in (0, 4)]
    state = tmp_path / "cache" / "clock-cap.json"
    script = ("from edgesdk.thermal.cpufreq import CpuFreqCap; import os, resource, sys\n"
              "cap = CpuFreqCap(sys.argv[1], sys.argv[2], warn=lambda m: None)\n"
              "cap.set_ratio(0.625)\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (40, resource.RLIM_INFINITY))\n"  # the disk fills up
              "cap.set_ratio(0.6)\n"  # the same 1.5 GHz: nothing written to sysfs, the state file rewritten
              "os._exit(9)\n")
    run_killed(script, str(tmp_path), str(state))
    assert [(p / "scaling_max_freq").read_text() for p in policies] == ["1500000\n"] * 2
    notes = recover(state)
    assert [(p / "scaling_max_freq").read_text() for p in policies] == ["2400000\n"] * 2, notes
    assert not state.exists()
    assert not [p.name for p in state.parent.iterdir() if p.name.endswith(".tmp")]


def test_a_broken_state_file_gives_back_the_whole_records_in_it_and_warns(tmp_path):
    """A state file cut short (written in place by an older edgesdk that was killed mid-write) was read as "no
    caps", silently: the caps it still named whole were never given back, and nobody was told to check."""
    capped = make_cpufreq_policy(tmp_path, 0, 1_500_000, 1_500_000, PI5_KHZ)
    state = tmp_path / "clock-cap.json"
    whole = json.dumps({str(capped / "scaling_max_freq"): {"original": 2_400_000, "written": 1_500_000},
                        str(tmp_path / "policy4" / "scaling_max_freq"): {"original": 2_400_000, "written": 1_500_000}},
                       indent=1)
    state.write_text(whole[:whole.rindex('"written"')])  # the second record cut off mid-way
    notes = recover(state)
    assert (capped / "scaling_max_freq").read_text() == "2400000\n", notes
    warning = [note for note in notes if note.startswith("warning:")]
    assert len(warning) == 1, notes
    assert "is broken" in warning[0]
    assert "1 whole record" in warning[0]
    assert "cpuinfo_max_freq" in warning[0]
    assert not state.exists()
    assert (tmp_path / "clock-cap.json.broken").read_text() == whole[:whole.rindex('"written"')]


def test_a_cap_on_a_policy_unreadable_now_is_kept_and_given_back_once_it_reads_again(tmp_path):
    """Since Linux 5.19 every read of an inactive policy fails (EBUSY): an nvpmodel mode with fewer cores takes a
    cluster down, and a run killed while capping it left a record that recover() dropped as "changed since". The
    kernel keeps the cluster's limit, so the cap came back with it, for good. An unreadable file here is a
    directory where the file is (EISDIR): an error other than "no such file", as EBUSY is."""
    online = make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, PI5_KHZ)
    cluster = make_cpufreq_policy(tmp_path, 4, 2_400_000, 1_500_000, PI5_KHZ)
    state = tmp_path / "cache" / "clock-cap.json"
    run_killed("from edgesdk.thermal.cpufreq import CpuFreqCap; import os, sys\n"
               "cap = CpuFreqCap(sys.argv[1], sys.argv[2]); cap.set_ratio(0.625); os._exit(9)\n",
               str(tmp_path), str(state))
    max_file = cluster / "scaling_max_freq"
    max_file.unlink()
    max_file.mkdir()  # the cluster goes offline: its files cannot be read
    notes = recover(state)
    assert (online / "scaling_max_freq").read_text() == "2400000\n"
    assert any("cannot be read now" in note and "policy4" in note for note in notes), notes
    assert list(json.loads(state.read_text())) == [str(max_file)]

    # a run in between caps the cluster that is online, and keeps the other record in its own state file
    warnings = []
    cap = CpuFreqCap(tmp_path, state, warn=warnings.append)
    assert [p.path.name for p in cap.policies] == ["policy0"]
    cap.set_ratio(0.625)
    assert set(json.loads(state.read_text())) == {str(online / "scaling_max_freq"), str(max_file)}
    cap.close()
    assert list(json.loads(state.read_text())) == [str(max_file)]

    max_file.rmdir()
    max_file.write_text("1500000\n")  # back online, still capped by the kernel's kept limit
    recover(state)
    assert max_file.read_text() == "2400000\n"
    assert not state.exists()


def test_a_record_for_a_policy_that_no_longer_exists_is_dropped_and_said(tmp_path):
    state = tmp_path / "clock-cap.json"
    gone = tmp_path / "sys" / "devices" / "system" / "cpu" / "cpufreq" / "policy9" / "scaling_max_freq"
    state.write_text(json.dumps({str(gone): {"original": 2_400_000, "written": 1_500_000}}))
    notes = recover(state)
    assert any("no longer exists" in note for note in notes), notes
    assert not state.exists()


class FakeTTY:
    """A stream that says it is a terminal (or not) and keeps what is written; no file descriptor."""

    def __init__(self, tty: bool):
        self._tty, self.text = tty, ""

    def isatty(self):
        return self._tty

    def write(self, text):
        self.text += text

    def flush(self):
        pass


def test_a_dumb_terminal_gets_plain_lines_not_cursor_control(monkeypatch):
    """TERM=dumb (Emacs' shell, CI logs), stderr a terminal, stdout a file: the live line was drawn with \\r\\x1b[2K,
    which such a terminal shows as junk; Rich and pip print plain lines there."""
    from edgesdk.thermal.telemetry import StatusLine

    monkeypatch.setenv("TERM", "dumb")
    monkeypatch.setenv("COLUMNS", "80")
    err, out = FakeTTY(True), FakeTTY(False)
    status = StatusLine(err, out, min_interval_s=0.0)
    status.update("61.0 °C normal", level="normal")
    status.update("72.0 °C hot", level="hot")
    status.between_answers()
    status.close()
    assert "\x1b" not in err.text
    assert "\r" not in err.text
    assert err.text.splitlines() == ["edgesdk thermal: 61.0 °C normal", "edgesdk thermal: 72.0 °C hot"]
    monkeypatch.setenv("TERM", "xterm-256color")
    assert StatusLine(FakeTTY(True), FakeTTY(False)).mode == "inplace"


def test_the_status_row_follows_a_resized_terminal(monkeypatch):
    """Both streams on one terminal: the scroll region and the status row were fixed at the height the terminal had
    at start. Grown from 24 to 40 rows, the status stayed on row 24, in the middle of the streamed text, with rows
    25-40 never used; shrunk, it was drawn below the screen. A real pseudo-terminal, resized as a window is."""
    import fcntl
    import pty
    import struct
    import termios

    from edgesdk.thermal.telemetry import StatusLine

    def resize(fd, rows):
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, 80, 0, 0))

    def drain(fd):
        chunks = []
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return b"".join(chunks).decode()
            if not chunk:
                return b"".join(chunks).decode()
            chunks.append(chunk)

    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("LINES", raising=False)
    monkeypatch.delenv("COLUMNS", raising=False)
    leader, follower = pty.openpty()
    os.set_blocking(leader, False)
    try:
        resize(follower, 24)
        with open(follower, "w", closefd=False) as terminal:
            status = StatusLine(terminal, terminal, min_interval_s=0.0)
            assert status.mode == "bar"
            status.update("61.0 °C normal", level="normal")
            first = drain(leader)
            assert "\x1b[1;23r" in first
            assert "\x1b[24;1H\x1b[2K61.0 °C normal" in first
            resize(follower, 40)
            status.update("72.0 °C hot", level="hot")
            grown = drain(leader)
            assert "\x1b[1;39r" in grown, grown
            assert "\x1b[40;1H\x1b[2K72.0 °C hot" in grown
            assert "\x1b[24;1H\x1b[2K" in grown  # the old status row, now among the text rows, is cleared
            resize(follower, 12)
            status.close()
            assert "\x1b[12;1H\x1b[2K\x1b[r" in drain(leader)
    finally:
        os.close(leader)
        os.close(follower)


def test_trip_points_come_in_the_order_of_their_numbers(tmp_path):
    """Sorted as text, trip_point_10 came before trip_point_2: a zone with 11 trips (Jetson's cpu-thermal has
    several, x86_pkg_temp and acpitz their own) listed them out of order in `thermal sensors`."""
    from edgesdk.thermal.sensors import SysfsThermal
    from tests._utils.sysfs import make_zone

    trips = [("active", 40_000 + 1000 * n, 2000) for n in range(10)] + [("critical", 105_000, 0)]
    make_zone(tmp_path, 0, "cpu-thermal", "51000\n", trips)
    found = SysfsThermal(tmp_path, ["cpu-thermal"]).trips()
    assert [t.index for t in found] == list(range(11))
    assert found[-1].kind == "critical"


def test_thermal_sensors_says_the_limits_are_the_profiles_when_the_zones_have_no_trip_points(tmp_path):
    """--json shows "trips": []; the text said nothing about trips, so a board whose zones have none (a
    container's bind mount, a kernel without them) did not tell where its limits came from."""
    from click.testing import CliRunner

    from edgesdk.cli import main
    from tests._utils.sysfs import make_zone

    make_zone(tmp_path / "thermal", 0, "cpu-thermal", "51000\n")
    env = {"EDGESDK_CACHE": str(tmp_path / "cache"), "EDGESDK_CPUFREQ_ROOT": str(tmp_path / "cpu")}
    result = CliRunner(env=env).invoke(main, ["thermal", "sensors", "--target", "rpi5",
                                              "--root", str(tmp_path / "thermal")])
    assert result.exit_code == 0, result.output
    assert "  no trip points in these zones: the limits below are the profile's (rpi5)\n" in result.stdout
    make_zone(tmp_path / "thermal", 0, "cpu-thermal", "51000\n", [("critical", 105_000, 0)])
    result = CliRunner(env=env).invoke(main, ["thermal", "sensors", "--target", "rpi5",
                                              "--root", str(tmp_path / "thermal")])
    assert "no trip points" not in result.stdout
    assert "trip cpu-thermal[0] critical" in result.stdout
