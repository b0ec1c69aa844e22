"""Clock cap, review 56: a cluster inactive at the start on Linux >= 5.19, a run killed after a rounded cap."""

from __future__ import annotations

import json

from edgesdk.thermal.cpufreq import CpuFreqCap
from tests._utils.sysfs import make_cpufreq_policy

TABLE = [115_200, 1_190_400, 1_497_600, 1_907_200]
# the files of an inactive policy; since Linux 5.19 every read of them fails (EBUSY)
INACTIVE_FILES = ("scaling_max_freq", "scaling_min_freq", "cpuinfo_min_freq", "scaling_available_frequencies",
                  "affected_cpus")


def ceiling(policy) -> int:
    return int((policy / "scaling_max_freq").read_text())


def go_inactive(policy) -> dict[str, str]:
    """Each file of the policy replaced by a directory, whose reads fail (EISDIR) as an inactive policy's do (EBUSY);
    returns what the files held."""
    held = {}
    for name in INACTIVE_FILES:
        file = policy / name
        held[name] = file.read_text() if file.exists() else ""
        file.unlink(missing_ok=True)
        file.mkdir()
    return held


def come_back(policy, held: dict[str, str]) -> None:
    for name, text in held.items():
        (policy / name).rmdir()
        (policy / name).write_text(text)


def test_a_cluster_inactive_at_the_start_on_linux_5_19_is_capped_once_it_is_back(tmp_path):
    """An nvpmodel mode with fewer cores at the start, on a kernel where the inactive policy's files fail every read:
    the policy was skipped at discovery as "scaling_max_freq unreadable" and never capped for the whole run, though the
    same cluster was capped once back where only affected_cpus read empty (before Linux 5.19)."""
    make_cpufreq_policy(tmp_path, 0, 1_907_200, 115_200, TABLE)
    second = make_cpufreq_policy(tmp_path, 4, 1_907_200, 115_200, TABLE)
    (second / "affected_cpus").write_text("4 5 6 7\n")
    held = go_inactive(second)
    now = [0.0]
    warnings = []
    cap = CpuFreqCap(tmp_path, tmp_path / "cache" / "clock-cap.json", warn=warnings.append, clock=lambda: now[0])
    assert [p.path.name for p in cap.policies] == ["policy0", "policy4"]
    assert "policy4 offline (scaling_max_freq cannot be read now): capped once it is back" in cap.describe()
    cap.set_ratio(0.625)

    come_back(second, held)  # the mode with every core
    now[0] += 2.0
    cap.set_ratio(0.625)
    assert ceiling(second) == 1_497_600  # 0.625 x 1.9072 GHz = 1.192 GHz: the table's next step up, read now
    cap.close()
    assert ceiling(second) == 1_907_200
    assert warnings == []


def test_every_policy_inactive_at_the_start_says_so(tmp_path):
    go_inactive(make_cpufreq_policy(tmp_path, 4, 1_907_200, 115_200, TABLE))
    cap = CpuFreqCap(tmp_path)
    assert not cap.available
    assert "policy4: scaling_max_freq cannot be read now" in cap.describe()


class RoundingKernel(CpuFreqCap):
    """A fake sysfs tree whose scaling_max_freq keeps each written value rounded down to a 200 MHz step, as a table
    driver resolves a value between two of its frequencies; a stop (SIGTERM's exit, Ctrl-C) lands after the first
    policy's cap, before the pass ends."""

    def _write(self, policy, value, held_khz=None):
        written = super()._write(policy, value, held_khz)
        if written:
            policy.max_file.write_text(f"{value // 200_000 * 200_000}\n")
        return written

    def _apply(self, policy, ratio):
        done = super()._apply(policy, ratio)
        if ratio is not None and policy.path.name == "policy0":
            raise KeyboardInterrupt
        return done


def test_a_run_killed_just_after_a_rounded_cap_is_undone_by_the_next(tmp_path):
    """The state file was saved before the write, with the value asked for (1_800_001 kHz), and again only at the end
    of the pass: a run killed in between left a record the next run's recovery compared with the value the kernel kept
    (1_800_000), read as a setting made since, and left the cap until a reboot."""
    policy = make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000)
    make_cpufreq_policy(tmp_path, 1, 2_400_000, 1_500_000)
    state = tmp_path / "cache" / "clock-cap.json"
    cap = RoundingKernel(tmp_path, state)
    try:
        cap.set_ratio(1_800_001 / 2_400_000)
    except KeyboardInterrupt:
        pass
    assert ceiling(policy) == 1_800_000
    assert json.loads(state.read_text())[str(policy / "scaling_max_freq")]["written"] == 1_800_000
    cap._lock.close()  # the process is killed: its lock goes, its cap and state file stay
    notes = CpuFreqCap(tmp_path, state).notes
    assert ceiling(policy) == 2_400_000
    assert "restored policy0 scaling_max_freq" in notes[0]
