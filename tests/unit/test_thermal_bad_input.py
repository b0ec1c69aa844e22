"""``edgesdk thermal plan | report`` on bad, extreme and garbled input: typed errors, no hangs, no tracebacks."""

from __future__ import annotations

import pytest

from edgesdk.profile import get_profile
from edgesdk.thermal.plan import Workload, simulate


def test_levels_cover_the_idle_time_up_to_the_horizon():
    profile = get_profile("rpi5")
    for guarded in (True, False):
        summary = simulate(profile, 1.0, 25.0, guarded, 35.0, workload=Workload(128, 256, think_s=100)).summary
        assert sum(summary.levels_s.values()) == pytest.approx(60.0)
