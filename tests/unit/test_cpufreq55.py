"""Clock cap, sensors and simulator: defects found in review (round 55)."""

from __future__ import annotations

import json
import os

import pytest

from edgesdk.thermal.cpufreq import CpuFreqCap
from tests._utils.sysfs import make_cpufreq_policy

# A kernel file that reads as a number and that no one, root included, may write (mode 0444 sysctl):
# a scaling_max_freq linked to it stands for a ceiling this process can read but not write.
READ_ONLY_NUMBER = "/proc/sys/kernel/ngroups_max"
needs_read_only_number = pytest.mark.skipif(not os.path.exists(READ_ONLY_NUMBER), reason="needs Linux /proc/sys")


def ceiling(policy) -> int:
    return int((policy / "scaling_max_freq").read_text())


@needs_read_only_number
def test_a_cap_whose_change_cannot_be_written_stays_recorded(tmp_path):
    """Capped at one clock, the write of a lower cap fails: the first cap is still in the file. It was dropped from the
    state file and never given back (close() and the next run left it); it stays recorded, and the warning says so."""
    held = int(open(READ_ONLY_NUMBER).read())
    top = 4 * held
    policy = make_cpufreq_policy(tmp_path, 0, top, held // 2, [held // 2, held, top])
    state = tmp_path / "cache" / "clock-cap.json"
    warnings = []
    cap = CpuFreqCap(tmp_path, state, warn=warnings.append)
    cap.set_ratio(0.25)
    assert ceiling(policy) == held
    (policy / "scaling_max_freq").unlink()
    (policy / "scaling_max_freq").symlink_to(READ_ONLY_NUMBER)  # still reads the cap; no write takes now

    cap.set_ratio(0.125)
    assert f"still at {held} kHz: the next edgesdk run gives {top} kHz back" in warnings[-1]
    cap.close()
    record = {str(policy / "scaling_max_freq"): {"original": top, "written": held}}
    assert json.loads(state.read_text()) == record

    (policy / "scaling_max_freq").unlink()
    (policy / "scaling_max_freq").write_text(f"{held}\n")  # writable again: the next run gives the ceiling back
    notes = CpuFreqCap(tmp_path, state).notes
    assert ceiling(policy) == top
    assert "restored policy0 scaling_max_freq" in notes[0]
    assert not state.exists()


def test_a_cap_that_cannot_be_read_at_close_is_said_to_stay(tmp_path):
    """The policy's scaling_max_freq cannot be read when the run gives the ceilings back (since Linux 5.19 an offline
    cluster's files fail so): the cap stays and is recorded for the next run. The run ended capped in silence; it says
    which policy stays capped, at what, and who gives which ceiling back."""
    policy = make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, [1_500_000 + 100_000 * i for i in range(10)])
    state = tmp_path / "cache" / "clock-cap.json"
    warnings = []
    cap = CpuFreqCap(tmp_path, state, warn=warnings.append)
    cap.set_ratio(0.625)
    assert ceiling(policy) == 1_500_000
    (policy / "scaling_max_freq").unlink()
    (policy / "scaling_max_freq").mkdir()  # reads fail (EISDIR), as an offline policy's fail with EBUSY

    cap.close()
    assert len(warnings) == 1
    assert warnings[0].startswith("policy0: scaling_max_freq cannot be read now")
    assert "its cap at 1500000 kHz cannot be given back yet" in warnings[0]
    assert "gives 2400000 kHz back" in warnings[0]
    assert json.loads(state.read_text()) == {str(policy / "scaling_max_freq"): {"original": 2_400_000,
                                                                               "written": 1_500_000}}


def test_a_cap_unreadable_again_after_it_was_read_is_said_again(tmp_path):
    """The warning that a cap cannot be given back is given once per spell of unreadable files, not once per run:
    a policy read again, capped again, then unreadable again at a later give-back was left capped in silence."""
    policy = make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, [1_500_000 + 100_000 * i for i in range(10)])
    warnings = []
    cap = CpuFreqCap(tmp_path, tmp_path / "cache" / "clock-cap.json", warn=warnings.append)
    cap.set_ratio(0.625)
    max_file = policy / "scaling_max_freq"
    max_file.unlink()
    max_file.mkdir()  # unreadable: the give-back is put off, and said
    cap.set_ratio(None)
    assert len(warnings) == 1
    max_file.rmdir()
    max_file.write_text("1500000\n")  # readable again, still at the cap
    cap.set_ratio(0.625)  # capped again (read), then unreadable again at the close
    assert ceiling(policy) == 1_500_000
    max_file.unlink()
    max_file.mkdir()
    cap.close()
    unread = [warning for warning in warnings if "scaling_max_freq cannot be read now" in warning]
    assert len(unread) == 2, warnings
