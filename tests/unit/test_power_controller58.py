"""The tau controller (edgesdk/power/controller.py): edge inputs and the paths where its loops meet."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.power.controller import ControllerConfig, TauController


def _decode_taus(prompt_flags: float | None, steps: int = 40) -> list[float]:
    """A prompt of 16 tokens whose per-layer flags (gates >= tau) are all ``prompt_flags`` (None: no prompt), then
    ``steps`` decode steps running exactly the budget's share of the blocks, over one stream of powers."""
    rng = np.random.default_rng(0)
    controller = TauController(ControllerConfig(compute_budget=0.5, min_compute=0.5, tau_init=0.5))
    prompt = rng.random(16)
    if prompt_flags is not None:
        controller.observe(prompt, np.full((16, 4), prompt_flags), count=False)
    else:
        controller.observe(prompt, np.ones((0, 4)), count=False)  # the same powers, no flags
    at_budget = np.array([1.0, 1.0, 0.0, 0.0])  # (L,): half the blocks run, the budget and the quality floor
    return [controller.observe(rng.random(), at_budget) for _ in range(steps)]


@pytest.mark.parametrize("prompt_flags", [1.0, 0.0])
def test_a_prompts_gate_flags_do_not_move_the_budget_floor_or_the_quality_ceiling(prompt_flags):
    """A prompt's FFNs all ran whatever its gates said; its flags in the 8-step executed window read as blocks run
    (all gates passing: the floor rose to 0.613 and held tau there for good, the decode at the budget never
    relaxing it) or skipped (the ceiling fell to 0.388 and held tau below the entropy loop's 0.50)."""
    assert _decode_taus(prompt_flags) == pytest.approx(_decode_taus(None))


def test_prompt_chunks_after_an_answer_leave_the_bounds_where_the_answer_left_them():
    """A prompt (count=False) adds no rows to the executed window; steering the bounds on the window the previous
    answer left integrated its fraction once per prompt chunk (the floor rose 0.338 -> 0.413 over six chunks)."""
    controller = TauController(ControllerConfig(compute_budget=0.5, tau_init=0.3))
    over_budget = np.array([[1.0, 1.0, 1.0, 0.0]])  # 75 % of the blocks run against a budget of 50 %
    for _ in range(3):
        controller.observe(1.0, over_budget)
    floor, ceiling = controller._floor, controller._ceiling
    assert floor == pytest.approx(0.3375)
    for _ in range(6):
        controller.observe(1.0, np.repeat(over_budget, 4, axis=0), count=False)
    assert (controller._floor, controller._ceiling) == (floor, ceiling)
