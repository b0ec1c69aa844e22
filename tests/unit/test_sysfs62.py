"""Clock cap, review 62: a change from one cap to another that a run recorded but had not yet written when it was
stopped (Ctrl-C, SIGKILL) is its own cap, given back, never read as someone else's setting and left on the board."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgesdk.thermal import cpufreq
from edgesdk.thermal.cpufreq import CpuFreqCap, recover
from tests._utils.sysfs import make_cpufreq_policy

TABLE = [1_500_000, 1_800_000, 2_100_000, 2_400_000]


def max_khz(policy: Path) -> int:
    return int((policy / "scaling_max_freq").read_text())


class Killed(BaseException):
    """A stop that lands in the middle of a pass: SIGINT's KeyboardInterrupt, or the end of a killed process."""


@pytest.fixture
def stop_after_recording(monkeypatch):
    """The next state file written is written whole, and the run is stopped right after (before the cap's write)."""
    write_state = cpufreq._write_state

    def stop(path, records):
        write_state(path, records)
        monkeypatch.setattr(cpufreq, "_write_state", write_state)
        raise Killed

    return lambda: monkeypatch.setattr(cpufreq, "_write_state", stop)


def test_a_change_of_cap_cut_short_before_its_write_is_given_back_at_close(tmp_path, stop_after_recording):
    """The file still held the old cap (2.1 GHz): close() took it for someone else's setting, warned so, let the
    policy go and deleted the record, leaving the board capped at 2.1 GHz after the run."""
    policy = make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, TABLE)
    warnings: list[str] = []
    state = tmp_path / "cache" / "clock-cap.json"
    cap = CpuFreqCap(tmp_path, state, warn=warnings.append)
    cap.set_ratio(0.875)
    assert max_khz(policy) == 2_100_000
    stop_after_recording()
    with pytest.raises(Killed):
        cap.set_ratio(0.625)
    assert max_khz(policy) == 2_100_000  # the new cap was recorded, never written
    cap.close()
    assert max_khz(policy) == 2_400_000
    assert warnings == []
    assert not state.exists()


def test_a_change_of_cap_cut_short_then_done_again_caps_at_the_new_value(tmp_path, stop_after_recording):
    """A caller that goes on after the stop (the pass is done again): the cap changes, it is not let go."""
    policy = make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, TABLE)
    warnings: list[str] = []
    cap = CpuFreqCap(tmp_path, tmp_path / "cache" / "clock-cap.json", warn=warnings.append)
    cap.set_ratio(0.875)
    stop_after_recording()
    with pytest.raises(Killed):
        cap.set_ratio(0.625)
    cap.set_ratio(0.625)
    assert max_khz(policy) == 1_500_000
    assert cap.applied_ratio == pytest.approx(0.625)
    cap.close()
    assert max_khz(policy) == 2_400_000
    assert warnings == []


def test_a_run_killed_between_recording_a_change_of_cap_and_writing_it_is_undone_by_the_next(
        tmp_path, stop_after_recording):
    """The record named the new cap (1.5 GHz) while the file held the old one (2.1 GHz): recover() read that as a
    setting made since, dropped the record, and the cap stayed until a reboot."""
    policy = make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, TABLE)
    state = tmp_path / "cache" / "clock-cap.json"
    cap = CpuFreqCap(tmp_path, state)
    cap.set_ratio(0.875)
    stop_after_recording()
    with pytest.raises(Killed):
        cap.set_ratio(0.625)
    cap._lock.close()  # the kernel drops the lock of a process that was killed
    record = json.loads(state.read_text())[str(policy / "scaling_max_freq")]
    assert (record["written"], record["held"]) == (1_500_000, 2_100_000)

    notes = recover(state)
    assert max_khz(policy) == 2_400_000
    assert any("restored policy0 scaling_max_freq to 2400000 kHz" in note for note in notes), notes
    assert not state.exists()


def test_a_cut_short_state_file_gives_back_a_record_that_holds_an_unwritten_change(tmp_path):
    """A state file that is not JSON is read record by record by its layout: a record with the old cap beside the new
    one did not match that layout, and its cap was left on the board."""
    first = make_cpufreq_policy(tmp_path, 0, 2_100_000, 1_500_000, TABLE)
    second = make_cpufreq_policy(tmp_path, 4, 2_400_000, 1_500_000, TABLE)
    records = {str(first / "scaling_max_freq"): {"original": 2_400_000, "written": 1_500_000, "held": 2_100_000},
               str(second / "scaling_max_freq"): {"original": 2_400_000, "written": 1_800_000}}
    text = json.dumps(records, indent=1)
    state = tmp_path / "cache" / "clock-cap.json"
    state.parent.mkdir()
    state.write_text(text[:-40])  # the second record cut short
    notes = recover(state)
    assert max_khz(first) == 2_400_000
    assert max_khz(second) == 2_400_000  # not named by a whole record: left, and the warning says to check it
    assert any("1 whole record read from it" in note for note in notes), notes


def test_a_first_cap_cut_short_before_its_write_is_not_taken_for_someone_elses_setting(tmp_path, stop_after_recording):
    """A Ctrl-C that stops an answer lands between recording the first cap and writing it, and the chat goes on: the
    file still read the ceiling, the next pass said 'changed to 2400000 kHz by someone else' and never capped again."""
    policy = make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, TABLE)
    warnings: list[str] = []
    state = tmp_path / "cache" / "clock-cap.json"
    cap = CpuFreqCap(tmp_path, state, warn=warnings.append)
    stop_after_recording()
    with pytest.raises(Killed):
        cap.set_ratio(0.625)
    assert max_khz(policy) == 2_400_000
    assert "held" not in json.loads(state.read_text())[str(policy / "scaling_max_freq")]  # nothing to give back
    cap.set_ratio(0.625)
    assert max_khz(policy) == 1_500_000
    cap.close()
    assert max_khz(policy) == 2_400_000
    assert warnings == []
    assert not state.exists()
