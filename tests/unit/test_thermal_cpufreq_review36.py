"""The cpufreq clock cap on a temporary sysfs tree: a root that cannot be searched, two capping runs
starting together, and a ceiling the kernel's thermal cooling lowers while capped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgesdk.thermal import cpufreq
from edgesdk.thermal.cpufreq import CpuFreqCap, recover
from edgesdk.thermal.guard import CLOCK_CAP_RATIO
from tests._utils.sysfs import make_cpufreq_policy

ROOT = Path(__file__).resolve().parents[2]
PI5_KHZ = [1_500_000 + 100_000 * i for i in range(10)]  # the Pi 5's table: 1.5 to 2.4 GHz
ORIN_KHZ = [729_600, 1_113_600, 1_497_600, 1_728_000, 1_984_000]  # a Jetson-like table


def ceiling(policy: Path) -> int:
    return int((policy / "scaling_max_freq").read_text())


def cooling_device(root: Path, index: int, kind: str, state: int) -> Path:
    """sys/class/thermal/cooling_deviceN as the kernel lays it out (type, cur_state, max_state)."""
    device = root / "sys" / "class" / "thermal" / f"cooling_device{index}"
    device.mkdir(parents=True, exist_ok=True)
    (device / "type").write_text(kind + "\n")
    (device / "cur_state").write_text(f"{state}\n")
    (device / "max_state").write_text("4\n")
    return device


# Runs as an ordinary user (root searches any directory, so it drops to nobody after the imports).
AS_USER = """
import json, os, sys
from edgesdk.thermal.cpufreq import CpuFreqCap
if os.geteuid() == 0:
    os.setgid(65534)
    os.setuid(65534)
try:
    result = {"cap": CpuFreqCap(sys.argv[1]).describe()}
except Exception as error:
    result = {"error": repr(error)}
print(json.dumps(result))
"""


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permissions")
def test_a_cpufreq_root_this_user_cannot_search_is_no_data(tmp_path):
    """CpuFreqCap asked Path.is_dir, which raises PermissionError (not False) where a directory above
    cpufreq may not be searched ($EDGESDK_CPUFREQ_ROOT on a tree of another user): 'thermal sensors'
    and a run with --clock-cap ended in that traceback. It is no cap, with the reason."""
    make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, PI5_KHZ)
    cpu = tmp_path / "sys" / "devices" / "system" / "cpu"
    cpu.chmod(0)
    try:
        done = subprocess.run([sys.executable, "-c", AS_USER, str(tmp_path)], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)
    finally:
        cpu.chmod(0o755)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert "error" not in result, result
    assert result["cap"] == (f"CPU clock cap unavailable: cannot read {cpu / 'cpufreq'} (Permission denied)")


OTHER_RUN = """
import sys
from edgesdk.thermal.cpufreq import CpuFreqCap
sys.stdin.readline()  # started, waits for its cue
cap = CpuFreqCap(sys.argv[1], sys.argv[2])
cap.set_ratio(0.625)
print(cap.available, flush=True)
sys.stdin.readline()
cap.close()
print("closed", flush=True)
"""


def test_two_capping_runs_starting_together_leave_the_clock_to_one(tmp_path, monkeypatch):
    """Two runs starting at the same instant both found the lock free, then one took it and the other went
    on without it: it read the first run's cap as the board's ceiling and overwrote the state file with
    that cap as "the original", so a kill of the first run left the clock capped for good. The second
    run is here made to lose that race for real: a second process takes the lock and caps right after
    this one found the lock free. Taking the lock is now the check: the loser leaves the clock alone."""
    policy = make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, PI5_KHZ)
    state = tmp_path / "cache" / "clock-cap.json"
    other = subprocess.Popen([sys.executable, "-c", OTHER_RUN, str(tmp_path), str(state)], cwd=ROOT,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    free_check = cpufreq._held_elsewhere

    def check_then_lose_the_race(path):
        free = free_check(path)
        other.stdin.write("go\n")
        other.stdin.flush()
        assert other.stdout.readline().strip() == "True"  # it holds the lock and has capped
        return free

    monkeypatch.setattr(cpufreq, "_held_elsewhere", check_then_lose_the_race)
    try:
        mine = CpuFreqCap(tmp_path, state)
        assert ceiling(policy) == 1_500_000
        assert not mine.available
        assert "another edgesdk run that caps the clock is still going" in mine.describe()
        mine.set_ratio(CLOCK_CAP_RATIO)
        mine.close()
        assert json.loads(state.read_text()) == {
            str(policy / "scaling_max_freq"): {"original": 2_400_000, "written": 1_500_000}}
        other.stdin.write("stop\n")
        other.stdin.flush()
        assert other.stdout.readline().strip() == "closed"
    finally:
        other.kill()
        other.wait(timeout=30)
    assert ceiling(policy) == 2_400_000
    assert not state.exists()


def test_a_ceiling_the_kernel_lowers_while_capped_is_still_given_back(tmp_path):
    """Under freq QoS scaling_max_freq reads the lowest limit on the policy: a thermal zone's passive trip
    (Jetson's cpu-thermal) lowers it below the cap through its cooling device. The cap read that as
    someone else's write, stopped and never gave the ceiling back: the value it had written stayed the
    policy's limit after the run. Now a lower value while a cooling device limits the policy keeps the
    cap, and closing writes the ceiling back."""
    policy = make_cpufreq_policy(tmp_path, 0, 1_984_000, 729_600, ORIN_KHZ)
    (policy / "related_cpus").write_text("0 1 2 3\n")
    device = cooling_device(tmp_path, 0, "cpufreq-cpu0", 0)
    warnings: list[str] = []
    cap = CpuFreqCap(tmp_path, warn=warnings.append)
    cap.set_ratio(CLOCK_CAP_RATIO)
    assert ceiling(policy) == 1_497_600
    (device / "cur_state").write_text("3\n")  # the kernel: cpu-thermal's passive trip
    (policy / "scaling_max_freq").write_text("729600\n")
    cap.set_ratio(None)
    assert warnings == []
    assert ceiling(policy) == 1_984_000  # written back (the kernel's own limit still reads on a board)


def test_a_kernel_limited_ceiling_at_a_killed_run_is_restored_by_the_next(tmp_path):
    """recover() skipped a cap whose file read below what the killed run wrote: with the kernel's cooling
    limit in force that left the killed run's cap in place for good."""
    policy = make_cpufreq_policy(tmp_path, 4, 1_984_000, 729_600, ORIN_KHZ)
    state = tmp_path / "clock-cap.json"
    state.write_text(json.dumps({str(policy / "scaling_max_freq"): {"original": 1_984_000, "written": 1_497_600}}))
    (policy / "scaling_max_freq").write_text("1113600\n")
    cooling_device(tmp_path, 1, "cpufreq-cpu4", 2)
    notes = recover(state)
    assert "restored policy4 scaling_max_freq to 1984000 kHz" in notes[0]
    assert ceiling(policy) == 1_984_000
    assert not state.exists()


def test_a_lower_ceiling_without_a_kernel_limit_is_still_someone_elses(tmp_path):
    """The other side of the rule: a cooling device of another policy, or one at state 0, is no kernel
    limit on this one; a lower value is a write (nvpmodel), and it wins."""
    policy = make_cpufreq_policy(tmp_path, 0, 1_984_000, 729_600, ORIN_KHZ)
    (policy / "related_cpus").write_text("0 1 2 3\n")
    cooling_device(tmp_path, 0, "cpufreq-cpu4", 3)
    cooling_device(tmp_path, 1, "cpufreq-cpu0", 0)
    warnings: list[str] = []
    cap = CpuFreqCap(tmp_path, warn=warnings.append)
    cap.set_ratio(CLOCK_CAP_RATIO)
    (policy / "scaling_max_freq").write_text("1113600\n")
    cap.close()
    assert ceiling(policy) == 1_113_600
    assert "changed to 1113600 kHz by someone else" in warnings[0]


def test_no_cap_begins_on_a_policy_the_kernel_limits(tmp_path):
    """At a cap's start scaling_max_freq is its ceiling; read while the kernel's cooling limit is in force it
    was that limit, and giving the "ceiling" back wrote the limit as the policy's own for good."""
    policy = make_cpufreq_policy(tmp_path, 0, 1_984_000, 729_600, ORIN_KHZ)
    device = cooling_device(tmp_path, 0, "thermal-cpufreq-0", 1)  # before Linux 5.12: numbered, any policy
    (policy / "scaling_max_freq").write_text("1728000\n")  # the kernel's limit
    cap = CpuFreqCap(tmp_path)
    cap.set_ratio(CLOCK_CAP_RATIO)
    assert ceiling(policy) == 1_728_000  # left to the kernel
    cap.set_ratio(None)
    (device / "cur_state").write_text("0\n")
    (policy / "scaling_max_freq").write_text("1984000\n")  # the kernel's limit is gone
    cap.set_ratio(CLOCK_CAP_RATIO)
    assert ceiling(policy) == 1_497_600
    cap.close()
    assert ceiling(policy) == 1_984_000
