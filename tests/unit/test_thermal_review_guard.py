"""Guard behaviour found in review: profiles at the edge of what validation accepts."""

from __future__ import annotations

from edgesdk.profile import get_profile
from edgesdk.thermal.guard import Guard, Level, Limits
from edgesdk.thermal.sensors import Reading

PROFILE = get_profile("rpi5")


def test_a_profile_whose_work_adds_no_power_still_enters_hot():
    """``active_w == idle_w`` passes profile validation (only ``active_w < idle_w`` is refused); entering
    hot divided by ``active_w - idle_w`` and raised ZeroDivisionError in the middle of a run."""
    model = PROFILE.thermal_model.model_copy(update={"active_w": PROFILE.thermal_model.idle_w})
    type(model).model_validate(model.model_dump())  # a profile YAML may say exactly this
    limits, _ = Limits.resolve(PROFILE.thermal)
    guard = Guard(limits, model)
    guard.observe(0.0, Reading(0.0, {"cpu-thermal": 60.0}))
    assert guard.observe(1.0, Reading(1.0, {"cpu-thermal": 72.0})) is Level.HOT
    assert 0.0 < guard.fraction <= 1.0
