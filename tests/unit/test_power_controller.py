"""The tau controller: holds the windowed entropy at its target and the compute within the budget."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from edgesdk.power.controller import ControllerConfig, TauController

LAYERS = 12


class SyntheticStream:
    """Tokens of random difficulty, most of them easy (Beta(0.5, 1.5)); a harder token's gates are
    higher in every layer. A token's power is the share of its layers that ran (plus a constant),
    so raising tau takes compute from the easy tokens first and concentrates power on the hard
    ones: the windowed entropy falls from ln 8 = 2.08 (tau = 0) to about 1.3 nats (tau = 0.7)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def step(self, tau: float) -> tuple[float, np.ndarray]:
        difficulty = self.rng.beta(0.5, 1.5)
        gates = np.clip(difficulty + self.rng.normal(0, 0.15, LAYERS), 0, 1)
        executed = gates >= tau
        return 0.05 + executed.mean(), executed


def _run(controller: TauController, steps: int, seed: int = 0) -> tuple[list[float], list[float]]:
    stream = SyntheticStream(seed)
    entropies, executed = [], []
    for _ in range(steps):
        power, ran = stream.step(controller.tau)
        controller.observe(power, ran)
        if controller.entropy is not None:
            entropies.append(controller.entropy)
        executed.append(ran.mean())
    return entropies, executed


@pytest.mark.parametrize("target", [1.4, 1.5, 1.7])
def test_controller_converges_to_the_entropy_target(target):
    controller = TauController(ControllerConfig(entropy_target=target, tau_init=0.0, min_compute=0.0))
    entropies, _ = _run(controller, 3000)
    assert abs(np.mean(entropies[:20]) - target) > 0.15  # it starts away from the target ...
    assert abs(np.mean(entropies[-1000:]) - target) < 0.1  # ... and holds it


def test_budget_caps_compute_and_the_thermal_api_lowers_it():
    controller = TauController(ControllerConfig(entropy_target=1.9, compute_budget=0.7, tau_init=0.0))
    _, executed = _run(controller, 2000, seed=1)
    assert np.mean(executed[-1000:]) <= 0.7 + 0.03
    controller.set_compute_budget(0.4)  # what the thermal guard calls when the board warms up
    _, executed = _run(controller, 2000, seed=2)
    assert np.mean(executed[-1000:]) <= 0.4 + 0.03
    assert controller.summary()["blocks_skipped"] > 0
    controller.set_compute_budget(1.0)  # restoring never exceeds the configured budget
    assert controller.budget == 0.7
    with pytest.raises(ValueError, match="compute budget"):
        controller.set_compute_budget(0.0)


def test_an_unreachable_target_stops_at_the_compute_floor():
    controller = TauController(ControllerConfig(entropy_target=0.5, tau_init=0.0, min_compute=0.6))
    _, executed = _run(controller, 3000, seed=3)
    assert np.mean(executed[-1000:]) >= 0.6 - 0.03  # the entropy loop alone would skip everything
    assert controller.tau < 0.9


def test_tau_stays_within_bounds_and_reset_forgets_history():
    # unreachable on this stream (its lowest windowed entropy is about 1.3 nats), though a window could hold it
    config = ControllerConfig(entropy_target=0.4, tau_init=0.5, tau_max=0.9, min_compute=0.0)
    controller = TauController(config)
    _run(controller, 500)
    assert controller.tau == pytest.approx(0.9)
    controller.reset()
    assert controller.tau == 0.5
    assert controller.entropy is None
    assert controller.summary()["blocks_total"] == 0


@pytest.mark.parametrize("target", [0, 0.2, 0.366, 2.1, 5.0, float("nan"), float("inf")])
def test_an_entropy_target_no_window_can_hold_is_refused(target):
    """ln(8) = 2.079 nats is the most an 8-token window holds, and 0.366 the least (all the power on one
    token, the other seven at the floor 0.01); outside (or NaN) the controller would drive tau to a bound and
    gating would quietly stop."""
    with pytest.raises(ValueError, match=r"entropy_target must lie in \(0.366, 2.079\) nats"):
        ControllerConfig(entropy_target=target)


def test_measuring_only_leaves_tau_alone_and_uncounted_rows_out_of_the_block_counts():
    controller = TauController(ControllerConfig(tau_init=0.5))
    rng = np.random.default_rng(0)
    for _ in range(32):  # gating off: every block runs, tau must not wind up toward the budget floor
        controller.observe(rng.random(), np.ones(4), steer=False)
    assert controller.tau == 0.5
    assert controller.entropy is not None  # still measured
    assert controller.summary()["blocks_total"] == 32 * 4
    controller.observe(rng.random(16), np.zeros((16, 4)), count=False)  # a prompt: its FFNs ran anyway
    assert controller.summary()["blocks_total"] == 32 * 4


def test_a_prompts_window_steers_but_is_not_part_of_the_answers_realised_entropy():
    """The realised entropy --stats prints averaged in the window a prompt ended with, whose FFNs ran whatever the
    gates said: with -n 3 it was a third of the figure."""
    controller = TauController(ControllerConfig())
    controller.observe(np.r_[np.full(9, 0.1), 5.0], np.ones((10, 12)), count=False)  # the prefill
    prompt_window = controller.entropy
    assert prompt_window is not None
    assert controller.summary()["mean_entropy"] is None
    decode_windows = []
    for _ in range(2):
        controller.observe(np.array([1.0]), np.ones((1, 12)))
        decode_windows.append(controller.entropy)
    assert controller.summary()["mean_entropy"] == pytest.approx(np.mean(decode_windows), abs=1e-4)
    assert prompt_window not in decode_windows


def test_statistics_kept_over_a_reset_that_does_not_start_an_answer():
    controller = TauController(ControllerConfig())
    for value in np.linspace(0.1, 2.0, 12):
        controller.observe(np.array([value]), np.ones((1, 4)))
    before = controller.summary()
    kept = controller.statistics()
    controller.reset()  # a context shift starts the sequence over
    assert controller.summary()["blocks_total"] == 0
    controller.restore_statistics(kept)
    after = controller.summary()
    assert after.pop("tau") == 0.5  # the control state starts over, tau at tau_init
    assert after == {key: value for key, value in before.items() if key != "tau"}


def test_config_is_validated():
    with pytest.raises(ValueError, match="compute_budget"):
        ControllerConfig(compute_budget=1.5)
    with pytest.raises(ValueError, match="min_compute"):
        ControllerConfig(min_compute=-0.1)
    with pytest.raises(ValueError, match="tau_init"):
        ControllerConfig(tau_init=2.0)


def test_the_thermal_guard_lowers_the_controllers_budget(tmp_path):
    from edgesdk.thermal.guard import Guard, GuardConfig, Limits
    from tests.unit.test_thermal_guard import PROFILE, Tree

    tree = Tree(tmp_path)
    controller = TauController(ControllerConfig(compute_budget=0.9))
    limits, _ = Limits.resolve(PROFILE.thermal)
    guard = Guard(limits, PROFILE.thermal_model, GuardConfig(min_dwell_s=0.0), budget_target=controller)
    budgets = []
    for temp in (60, 70.5, 72, 60):  # normal, warm, hot, normal again
        tree.feed(guard, temp)
        budgets.append(controller.budget)
    assert budgets == [0.9, 0.75, 0.5, 0.9]  # never above the configured budget


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_power_reading_leaves_the_entropy_and_tau_alone(bad):
    rng = np.random.default_rng(3)
    powers = rng.uniform(0.2, 1.0, 30)
    clean, poisoned = TauController(), TauController()
    executed = np.ones(LAYERS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy "invalid value" warnings on the board either
        for i, p in enumerate(powers):
            if i != 12:
                clean.observe(p, executed)
            poisoned.observe(bad if i == 12 else p, executed)
    assert np.isfinite(poisoned.entropies).all()
    assert poisoned.entropies == clean.entropies  # the bad step measured nothing and moved nothing
    assert poisoned.tau == pytest.approx(clean.tau)
