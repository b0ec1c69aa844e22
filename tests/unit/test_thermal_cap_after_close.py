"""A clock cap that was closed stays given back: a guard step that comes after the close (an answer
still ending while ``edgesdk serve`` stops) must not cap the board's clock again."""

from __future__ import annotations

from edgesdk.thermal.cpufreq import CpuFreqCap
from edgesdk.thermal.guard import CLOCK_CAP_RATIO
from tests._utils.sysfs import make_cpufreq_policy

PI5_KHZ = [1_500_000 + 100_000 * i for i in range(10)]


def test_set_ratio_after_close_writes_nothing(tmp_path):
    policy = make_cpufreq_policy(tmp_path / "sys", 0, 2_400_000, 1_500_000, PI5_KHZ)
    cap = CpuFreqCap(tmp_path / "sys", state_path=tmp_path / "state.json")
    cap.set_ratio(CLOCK_CAP_RATIO)
    assert (policy / "scaling_max_freq").read_text().strip() == "1500000"
    cap.close()
    assert (policy / "scaling_max_freq").read_text().strip() == "2400000"
    cap.set_ratio(CLOCK_CAP_RATIO)
    assert (policy / "scaling_max_freq").read_text().strip() == "2400000"
    assert not (tmp_path / "state.json").exists()
    other = CpuFreqCap(tmp_path / "sys", state_path=tmp_path / "state.json")  # the lock is free for another run
    assert other.available
    other.close()
