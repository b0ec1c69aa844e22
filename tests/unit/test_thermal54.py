"""Thermal review 54: the clock cap and the thermal guard on plausible board states.

Each test builds what it needs: a temporary sysfs tree for cpufreq (``<root>/sys/devices/system/cpu/cpufreq/policyN``
and ``<root>/sys/class/thermal/cooling_deviceN``), or a guard and a simulated board from a shipped profile.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

from edgesdk.thermal.cpufreq import CPUFREQ_DIR, RETRY_INTERVAL_S, CpuFreqCap

PI5_KHZ = list(range(1_500_000, 2_400_001, 100_000))  # Raspberry Pi 5 operating points


def make_policy(root: Path, number: int = 0, ceiling: int = 2_400_000, floor: int = 1_500_000,
                offered: list[int] | None = None, cpus: str = "0 1 2 3") -> Path:
    """One cpufreq policy as the kernel lays it out (kHz values, one per file)."""
    offered = PI5_KHZ if offered is None else offered
    policy = root / CPUFREQ_DIR / f"policy{number}"
    policy.mkdir(parents=True)
    files = {"scaling_max_freq": ceiling, "scaling_min_freq": floor, "cpuinfo_min_freq": min(offered),
             "cpuinfo_max_freq": max(offered), "scaling_available_frequencies": " ".join(map(str, offered)),
             "affected_cpus": cpus, "related_cpus": cpus}
    for name, value in files.items():
        (policy / name).write_text(f"{value}\n")
    return policy


def make_cooling_device(root: Path, kind: str, state: int) -> Path:
    """A thermal cooling device (``drivers/thermal/cpufreq_cooling.c`` names it ``cpufreq-cpuN``)."""
    device = root / "sys/class/thermal/cooling_device0"
    device.mkdir(parents=True, exist_ok=True)
    (device / "type").write_text(f"{kind}\n")
    (device / "cur_state").write_text(f"{state}\n")
    return device


def a_second_apart() -> Callable[[], float]:
    """A monotonic clock whose every reading is RETRY_INTERVAL_S after the last: each retry of a cap put off is due."""
    return itertools.count(0.0, RETRY_INTERVAL_S).__next__


def max_khz(policy: Path) -> int:
    return int((policy / "scaling_max_freq").read_text())


def test_a_cap_deferred_while_the_kernel_limits_the_policy_begins_once_the_limit_lifts(tmp_path):
    """A passive trip's cpufreq cooling holds the policy at 1.8 GHz when the guard first asks for its cap (a board
    that starts hot, or one coming out of a pause): the cap cannot begin then (its ceiling cannot be read). The guard
    asks again at every reading with the same ratio; before the fix that call returned at once (the ratio was
    taken as applied), so once the kernel's limit lifted the board ran at its full 2.4 GHz for the rest of the
    pacing, uncapped."""
    policy = make_policy(tmp_path, ceiling=1_800_000)  # the kernel's limit, read through scaling_max_freq
    device = make_cooling_device(tmp_path, "cpufreq-cpu0", 3)
    cap = CpuFreqCap(tmp_path, tmp_path / "cache" / "clock-cap.json", clock=a_second_apart())
    cap.set_ratio(0.625)
    assert max_khz(policy) == 1_800_000  # nothing written while the kernel limits it

    (device / "cur_state").write_text("0\n")  # the board cooled below the passive trip: the limit lifts
    (policy / "scaling_max_freq").write_text("2400000\n")
    cap.set_ratio(0.625)  # the guard's next reading, still pacing
    assert max_khz(policy) == 1_500_000

    cap.close()
    assert max_khz(policy) == 2_400_000


def test_a_cluster_taken_offline_mid_run_is_capped_once_it_is_back_not_written_while_offline(tmp_path):
    """An nvpmodel mode with fewer cores takes the second cluster down after the run began (its policy was online
    when the cap looked for policies). Before Linux 5.19 (JetPack 5's 5.10, JetPack 6's 5.15) such a policy's
    scaling_max_freq still reads, but a write fails with EINVAL: the old code wrote its cap there, took the failure
    as a cap that cannot be written, warned so and let the policy go for the rest of the run. Now nothing is
    written while no CPU of it is online, nothing is warned, and the cap begins once the cluster is back."""
    first = make_policy(tmp_path, 0)
    second = make_policy(tmp_path, 4, cpus="4 5 6 7")
    warnings: list[str] = []
    cap = CpuFreqCap(tmp_path, tmp_path / "cache" / "clock-cap.json", warn=warnings.append, clock=a_second_apart())
    assert len(cap.policies) == 2

    (second / "affected_cpus").write_text("\n")  # the mode switch: CPUs 4-7 offline
    cap.set_ratio(0.625)
    assert (max_khz(first), max_khz(second)) == (1_500_000, 2_400_000)
    assert warnings == []
    state = tmp_path / "cache" / "clock-cap.json"
    marked = state.read_text() + "\n\n"  # the same records, laid out as the cap never writes them
    state.write_text(marked)
    cap.set_ratio(0.625)  # the guard's next reading, the cluster still down: the file is not rewritten each time
    assert state.read_text() == marked

    (second / "affected_cpus").write_text("4 5 6 7\n")  # back to the mode with every core
    cap.set_ratio(0.625)
    assert (max_khz(first), max_khz(second)) == (1_500_000, 1_500_000)

    cap.close()
    assert (max_khz(first), max_khz(second)) == (2_400_000, 2_400_000)


def test_a_policy_unreadable_when_the_cap_begins_is_capped_once_it_reads_again(tmp_path):
    """Since Linux 5.19 (JetPack 7's 6.8) every read of an inactive policy's files fails (EBUSY) while an nvpmodel
    mode with fewer cores holds its cluster down. A cap that began then wrote nothing there, rightly, but took the
    policy as done: once the cluster was back it ran uncapped for the rest of the pacing. (A directory in place of
    scaling_max_freq fails every read as EBUSY does.)"""
    first = make_policy(tmp_path, 0)
    second = make_policy(tmp_path, 4, cpus="4 5 6 7")
    cap = CpuFreqCap(tmp_path, tmp_path / "cache" / "clock-cap.json", clock=a_second_apart())
    assert len(cap.policies) == 2

    (second / "scaling_max_freq").unlink()
    (second / "scaling_max_freq").mkdir()  # the cluster goes down: its files no longer read
    cap.set_ratio(0.625)
    assert max_khz(first) == 1_500_000

    (second / "scaling_max_freq").rmdir()
    (second / "scaling_max_freq").write_text("2400000\n")  # back, at its ceiling
    cap.set_ratio(0.625)
    assert (max_khz(first), max_khz(second)) == (1_500_000, 1_500_000)

    cap.close()
    assert (max_khz(first), max_khz(second)) == (2_400_000, 2_400_000)
