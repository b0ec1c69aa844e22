"""The tau controller's three loops hand tau over to one another without wind-up: a loop that does
not hold tau must not drift to its bound while the other one does."""

from __future__ import annotations

import re

import numpy as np
import pytest

from edgesdk.power.controller import ControllerConfig, TauController
from tests.unit.test_power_controller import SyntheticStream


def _steps(controller: TauController, stream: SyntheticStream, steps: int) -> tuple[np.ndarray, np.ndarray]:
    taus, executed = [], []
    for _ in range(steps):
        power, ran = stream.step(controller.tau)
        controller.observe(power, ran)
        taus.append(controller.tau)
        executed.append(ran.mean())
    return np.asarray(taus), np.asarray(executed)


def test_a_lowered_budget_takes_effect_at_once_not_after_the_floor_climbs_from_tau_min():
    """The entropy loop holds tau ~0.5 with ~22 % of the blocks running; the floor had relaxed to 0.
    The guard then lowers the budget to 12 %: the floor used to climb from 0 at 0.05 * 0.1 per step
    and the budget was exceeded (~21-26 % ran) for the next hundred tokens."""
    controller = TauController(ControllerConfig(entropy_target=1.5, tau_init=0.0, min_compute=0.0))
    stream = SyntheticStream(0)
    _steps(controller, stream, 1000)
    controller.set_compute_budget(0.12)
    _, executed = _steps(controller, stream, 100)
    assert executed.mean() <= 0.12 + 0.04


def test_the_entropy_loop_does_not_wind_down_while_the_budget_holds_tau():
    """After the thermal guard restores the budget, tau comes back near where it held the target;
    it used to fall to ~0.2 (entropy 1.71 against 1.5) because the entropy loop had kept lowering
    its value all the while the floor held tau."""
    controller = TauController(ControllerConfig(entropy_target=1.5, tau_init=0.0, min_compute=0.0))
    stream = SyntheticStream(0)
    taus, _ = _steps(controller, stream, 1000)
    before = taus[-200:].mean()
    controller.set_compute_budget(0.2)
    _steps(controller, stream, 1000)
    controller.set_compute_budget(1.0)
    taus, _ = _steps(controller, stream, 50)
    assert taus.mean() >= 0.85 * before


def test_the_quality_floor_holds_from_the_first_tokens():
    """An unreachable entropy target drives tau up; the ceiling used to fall from tau_max, so ~18 %
    of the blocks ran for some 25 tokens against a floor of 60 %."""
    controller = TauController(ControllerConfig(entropy_target=0.5, tau_init=0.0, min_compute=0.6))
    _, executed = _steps(controller, SyntheticStream(3), 400)
    assert min(executed[k: k + 25].mean() for k in range(0, 400, 25)) >= 0.6 - 0.1


def test_reconfiguring_keeps_the_thermal_limit_but_not_the_old_configured_budget():
    """``configure`` kept ``controller.budget``, the smaller of the guard's limit and the *old*
    configured budget: after a budget of 0.5, asking for 0.9 still ran at 0.5."""
    from edgesdk.runtime.ort_gated_backend import OrtGatedBackend

    backend = object.__new__(OrtGatedBackend)  # configure needs only the controller, not a session
    backend.controller = TauController(ControllerConfig(compute_budget=0.5))
    backend.configure(ControllerConfig(compute_budget=0.9))
    assert backend.controller.budget == 0.9
    backend.set_compute_budget(0.4)  # the thermal guard warms up ...
    backend.configure(ControllerConfig(compute_budget=0.8))
    assert backend.controller.budget == 0.4  # ... and its limit survives a new configuration
    backend.set_compute_budget(1.0)  # ... until it restores it
    assert backend.controller.budget == 0.8


@pytest.mark.parametrize(("field", "value", "message"), [
    ("window", 0, "window (tokens per entropy window) must be an integer >= 2"),  # was "math domain error"
    ("window", 1, "window=1"),
    ("smooth", 0, "smooth (moving-average width) an integer >= 1"),  # was accepted: every window read ln W
    ("floor", -0.5, "floor must be a finite number >= 0, got -0.5"),
    ("gain_entropy", -0.02, "gain_entropy must be a finite number >= 0"),  # tau ran away from the target
    ("gain_budget", float("nan"), "gain_budget must be a finite number >= 0"),
])
def test_bundle_settings_the_controller_cannot_use_are_refused_by_name(field, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ControllerConfig(**{field: value})
