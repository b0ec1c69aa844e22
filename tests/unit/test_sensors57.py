"""Board sensors and the clock cap, review 57: a get_throttled cut short, a stopped run's cap on a read-only /sys."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from edgesdk.thermal.cpufreq import recover
from edgesdk.thermal.sensors import parse_throttled
from tests._utils.sysfs import make_cpufreq_policy


@pytest.mark.parametrize("text", ["throttled=0x", "throttled=0x5000g", "throttled=12ab"])
def test_a_get_throttled_line_cut_short_or_garbled_is_no_data(text):
    """``throttled=0x`` (its digits lost) read as the number 0: every flag clear, a board under-volted and throttled
    reported healthy, where every reader turns an unreadable value into no data."""
    assert parse_throttled(text) is None


def test_a_whole_get_throttled_line_still_reads():
    assert parse_throttled("throttled=0x50005\n") == {
        "under_voltage": True, "arm_freq_capped": False, "throttled": True, "soft_temp_limit": False,
        "under_voltage_occurred": True, "arm_freq_capping_occurred": False, "throttling_occurred": True,
        "soft_temp_limit_occurred": False}
    assert parse_throttled("throttled=0")["throttled"] is False


@pytest.fixture
def read_only_cpufreq(tmp_path):
    """A policy capped at 1.5 GHz of 2.4 GHz by a stopped run, on a file system mounted read-only (/sys in a
    container that is not privileged); skipped where this test may not mount one."""
    mount = tmp_path / "ro"
    mount.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount") or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "none", str(mount)], capture_output=True).returncode:
        pytest.skip("needs root allowed to mount a tmpfs")
    try:
        policy = make_cpufreq_policy(mount, 0, 1_500_000, 1_500_000, [1_500_000, 2_400_000])
        if subprocess.run(["mount", "-o", "remount,ro", str(mount)], capture_output=True).returncode:
            pytest.skip("cannot remount the tmpfs read-only")
        yield policy / "scaling_max_freq"
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)


def test_a_stopped_runs_cap_on_a_read_only_sys_is_not_blamed_on_root(tmp_path, read_only_cpufreq):
    """The write back failed with EROFS and the note told root to "run edgesdk as root" or ``sudo tee``, both of
    which fail the same way on a read-only /sys."""
    state = tmp_path / "cache" / "clock-cap.json"
    state.parent.mkdir()
    records = {str(read_only_cpufreq): {"original": 2_400_000, "written": 1_500_000}}
    state.write_text(json.dumps(records))
    notes = recover(state)
    assert len(notes) == 1
    assert f"could not restore {read_only_cpufreq} to 2400000 kHz" in notes[0]
    assert "mounted read-only" in notes[0]
    assert "--privileged" in notes[0]
    assert "run edgesdk as root" not in notes[0]
    assert "sudo tee" not in notes[0]
    assert json.loads(state.read_text()) == records  # kept for a run that can write it
