"""Clock-cap behaviour found in review."""

from __future__ import annotations

from edgesdk.thermal.cpufreq import CpuFreqCap
from tests._utils.sysfs import make_cpufreq_policy


def test_an_unwritable_state_file_warns_once_and_the_cap_still_works(tmp_path):
    """The state file lives in the user cache ($EDGESDK_CACHE, e.g. a read-only volume of models in a
    container). Writing it raised OSError out of set_ratio, i.e. out of the guard's step hook: the
    first hot level crashed `edgesdk run --clock-cap` mid-answer."""
    policy = make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, (1_500_000, 1_800_000, 2_400_000))
    (tmp_path / "cache").write_text("a file where the cache directory should be\n")
    warnings = []
    cap = CpuFreqCap(tmp_path, tmp_path / "cache" / "clock-cap.json", warn=warnings.append)
    assert cap.available
    cap.set_ratio(0.625)
    assert (policy / "scaling_max_freq").read_text() == "1500000\n"
    cap.set_ratio(None)
    cap.set_ratio(0.625)
    assert len(warnings) == 1
    assert str(tmp_path / "cache" / "clock-cap.json") in warnings[0]
    assert "EDGESDK_CACHE" in warnings[0]
    cap.close()
    assert (policy / "scaling_max_freq").read_text() == "2400000\n"
