"""thermal I/O review 45: cpufreq caps and sysfs readings against the kernel ABI, on temporary sysfs trees."""

from __future__ import annotations

from edgesdk.thermal.cpufreq import CpuFreqCap, recover
from edgesdk.thermal.guard import CLOCK_CAP_RATIO
from tests._utils.sysfs import make_cpufreq_policy

BOOT_ID = "proc/sys/kernel/random/boot_id"  # under the root (the kernel's per-boot UUID)
ORIN_KHZ = [729_600, 1_190_400, 1_497_600, 1_984_000]


def ceiling(policy) -> int:
    return int((policy / "scaling_max_freq").read_text())


def boot(root, boot_id: str) -> None:
    """The kernel's ``/proc/sys/kernel/random/boot_id`` under ``root``: a new UUID every boot."""
    path = root / BOOT_ID
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(boot_id + "\n")


def test_a_cap_left_before_a_restart_is_not_given_back_over_the_ceiling_set_at_boot(tmp_path):
    """A run capped the clock and the board went down (a brown-out, a hang) with it capped. At boot
    nvpmodel set its mode's ceiling, here the very value the cap had written. The cap's record is of
    the boot before: giving back its 'original' would raise the clock past the mode the board booted in."""
    boot(tmp_path, "6a6e1b8c-0000-4000-8000-000000000001")
    policy = make_cpufreq_policy(tmp_path, 0, 1_984_000, 729_600, ORIN_KHZ)
    state = tmp_path / "cache" / "clock-cap.json"
    cap = CpuFreqCap(tmp_path, state)
    cap.set_ratio(CLOCK_CAP_RATIO)
    assert ceiling(policy) == 1_497_600
    cap._lock.close()  # the process is gone: the kernel dropped its lock
    boot(tmp_path, "6a6e1b8c-0000-4000-8000-000000000002")  # restarted
    (policy / "scaling_max_freq").write_text("1497600\n")  # nvpmodel's boot mode ceiling
    assert recover(state) == []
    assert ceiling(policy) == 1_497_600
    assert not state.exists()


def test_a_cap_left_in_this_boot_is_still_given_back(tmp_path):
    boot(tmp_path, "6a6e1b8c-0000-4000-8000-000000000001")
    policy = make_cpufreq_policy(tmp_path, 0, 1_984_000, 729_600, ORIN_KHZ)
    state = tmp_path / "cache" / "clock-cap.json"
    cap = CpuFreqCap(tmp_path, state)
    cap.set_ratio(CLOCK_CAP_RATIO)
    cap._lock.close()  # killed
    notes = recover(state)
    assert "a previous run was stopped while it capped the clock" in notes[0]
    assert ceiling(policy) == 1_984_000
    assert not state.exists()


def test_a_policy_whose_cpus_are_all_offline_is_not_capped(tmp_path):
    """An nvpmodel mode with fewer cores: a whole cluster is offline, its policy inactive (affected_cpus
    empty). Kernels before 5.19 (L4T R35's 5.10) still show its scaling_max_freq but refuse a write with
    EINVAL: capping it would only warn that the cap stopped."""
    table = [115_200, 1_190_400, 1_497_600, 1_907_200]
    online = make_cpufreq_policy(tmp_path, 0, 1_907_200, 115_200, table)
    (online / "affected_cpus").write_text("0 1\n")
    (online / "related_cpus").write_text("0 1\n")
    offline = make_cpufreq_policy(tmp_path, 2, 1_907_200, 115_200, table)
    (offline / "affected_cpus").write_text("\n")  # cpufreq_show_cpus() of an empty mask
    (offline / "related_cpus").write_text("2 3\n")
    warnings = []
    cap = CpuFreqCap(tmp_path, warn=warnings.append)
    assert [p.path.name for p in cap.policies] == ["policy0", "policy2"]  # policy2 capped once its CPUs are back
    cap.set_ratio(CLOCK_CAP_RATIO)
    assert ceiling(online) == 1_497_600  # 0.625 x 1.9072 GHz = 1.192 GHz: the next step up
    assert ceiling(offline) == 1_907_200  # never written
    cap.close()
    assert ceiling(online) == 1_907_200
    assert warnings == []


def test_every_policy_offline_says_so(tmp_path):
    offline = make_cpufreq_policy(tmp_path, 4, 1_907_200, 115_200, [115_200, 1_907_200])
    (offline / "affected_cpus").write_text("\n")
    cap = CpuFreqCap(tmp_path)
    assert not cap.available
    assert "policy4: none of its CPUs is online (affected_cpus is empty)" in cap.describe()


def test_a_minimum_pinned_by_jetson_clocks_is_left_alone_and_said(tmp_path):
    """jetson_clocks pins scaling_min_freq to scaling_max_freq: the cap cannot lower the clock. It must not
    fight it, nor stay silent while the guard's telemetry reports the clock capped."""
    policy = make_cpufreq_policy(tmp_path, 0, 1_984_000, 1_984_000, ORIN_KHZ)
    before = (policy / "scaling_max_freq").stat().st_mtime_ns
    warnings = []
    cap = CpuFreqCap(tmp_path, warn=warnings.append)
    assert "policy0 1.984 GHz pinned by scaling_min_freq" in cap.describe()  # what 'thermal sensors' shows
    cap.set_ratio(CLOCK_CAP_RATIO)
    assert ceiling(policy) == 1_984_000
    assert (policy / "scaling_max_freq").stat().st_mtime_ns == before
    assert len(warnings) == 1
    assert "policy0: scaling_min_freq is pinned at 1984000 kHz" in warnings[0]
    assert "jetson_clocks --restore" in warnings[0]
    assert "nvpmodel -m" in warnings[0]
    cap.set_ratio(None)
    cap.set_ratio(CLOCK_CAP_RATIO)  # the next cap: not said again
    cap.close()
    assert len(warnings) == 1
    assert ceiling(policy) == 1_984_000
