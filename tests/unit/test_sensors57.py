"""Board sensors and the clock cap, review 57: a get_throttled cut short, a stopped run's cap on a read-only /sys."""

from __future__ import annotations

import errno
import json
import os

import pytest

from edgesdk.thermal import cpufreq
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


@pytest.mark.parametrize(("code", "read_only", "said", "not_said"), [
    (errno.EROFS, True, ["mounted read-only", "--privileged"], ["run edgesdk as root", "sudo tee"]),
    (errno.EACCES, False, ["run edgesdk as root", "echo 2400000 | sudo tee"], ["mounted read-only", "dmesg"]),
    (errno.EINVAL, False, ["dmesg", "echo 2400000 | sudo tee"], ["mounted read-only", "run edgesdk as root"]),
])
def test_a_stopped_runs_cap_that_cannot_be_written_back_says_what_to_do_for_each_cause(
        tmp_path, monkeypatch, code, read_only, said, not_said):
    """Each cause of a failed write back gets its own fix, with no tmpfs to mount (a read-only /sys needs root allowed to
    mount one): the write to a real policy file fails with ``code``, and the file system holding it
    reads as mounted read-only where ``read_only``."""
    policy = make_cpufreq_policy(tmp_path, 0, 1_500_000, 1_500_000, [1_500_000, 2_400_000])
    max_file = policy / "scaling_max_freq"
    write_text = cpufreq.Path.write_text

    def failing(self, data, *args, **kwargs):
        if self == max_file:
            raise OSError(code, os.strerror(code), str(self))
        return write_text(self, data, *args, **kwargs)

    monkeypatch.setattr(cpufreq.Path, "write_text", failing)
    asked: list = []
    monkeypatch.setattr(cpufreq, "_read_only", lambda path: asked.append(path) or read_only)
    state = tmp_path / "cache" / "clock-cap.json"
    state.parent.mkdir()
    records = {str(max_file): {"original": 2_400_000, "written": 1_500_000}}
    state.write_text(json.dumps(records))
    notes = recover(state)
    assert len(notes) == 1
    assert f"could not restore {max_file} to 2400000 kHz" in notes[0]
    for text in said:
        assert text in notes[0]
    for text in not_said:
        assert text not in notes[0]
    assert asked == [policy]  # the file system asked about is the policy's
    assert max_file.read_text() == "1500000\n"
    assert json.loads(state.read_text()) == records  # kept for a run that can write it
