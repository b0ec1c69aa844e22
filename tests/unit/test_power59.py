"""Refusals of the gate controller's and the power stage's settings: each names the setting, the value, what was
expected and the fix (a value to set), not only the range."""

from __future__ import annotations

import pytest

from edgesdk.power.controller import ControllerConfig, TauController


@pytest.mark.parametrize(("field", "value", "fix"), [
    ("compute_budget", 0.0, "set it to e.g. 0.5 (half the blocks), or 1 for no limit"),
    ("compute_budget", 1.5, "set it to e.g. 0.5 (half the blocks), or 1 for no limit"),
    ("min_compute", 2.0, "set it to e.g. 0.5 (the default), or 0 for no quality floor"),
    ("floor", -0.5, "set it to e.g. 0.01 (the default)"),
    ("gain_entropy", -0.02, "set it to e.g. 0.02 (the default)"),
    ("window", 1, "set them to the power stage's window=8, smooth=2"),
    ("tau_init", 2.0, "set tau_init to the threshold the gates were trained against"),
])
def test_a_controller_setting_it_refuses_is_told_with_its_value_and_a_fix(field, value, fix):
    """``--compute-budget 0`` was told "compute_budget must be in (0, 1], got 0.0" and no more: neither what the
    number means nor what to pass. The message still starts with the field (the CLI names the option by it)."""
    with pytest.raises(ValueError, match=f"^{field}") as refused:
        ControllerConfig(**{field: value})
    message = str(refused.value)
    assert repr(value) in message or str(value) in message
    assert fix in message


@pytest.mark.parametrize("budget", [0.0, -0.25, 1.5, float("nan")])
def test_a_compute_budget_the_controller_refuses_at_run_time_says_what_to_pass(budget):
    controller = TauController()
    with pytest.raises(ValueError, match=r"compute budget must be in \(0, 1\], got .*pass e\.g\. 0\.5"):
        controller.set_compute_budget(budget)
    assert controller.budget == 1.0  # the refused value is not taken


@pytest.mark.parametrize(("override", "fix"), [
    ("power.lr=-0.001", "set power.lr to e.g. 0.003 (the default)"),
    ("power.weight_budget=-10", "set power.weight_budget to 0 or more (default 10.0)"),
    ("power.low_power_scale=3", "set power.low_power_scale to e.g. 0.3 (the default)"),
    ("power.weights=[1.0, -1.0, 0.5]", "set power.weights and each power.sweep point to such a triple"),
    ("power.sweep=[]", "set power.sweep to a list of them"),
    ("power.bucket_size=0", "set power.bucket_size to 1 or more (default 64)"),
    ("power.prompt_tokens=0", "set power.prompt_tokens to 1 or more (default 32)"),
])
def test_a_power_setting_the_stage_refuses_names_the_value_to_set(override, fix):
    """These refusals named the setting and its range but no value to set, unlike the stage's other refusals
    (``set power.rank to 1 or more``)."""
    pytest.importorskip("torch")
    from edgesdk.build.recipes import load_recipe
    from edgesdk.errors import BuildError

    with pytest.raises(BuildError) as refused:
        load_recipe("power").with_overrides([override]).validated()
    assert fix in str(refused.value)
