"""The power stage's settings, its profiler and training log, and the build's checkpoint, report and recipe
files, on tiny models: values a recipe or --set accepts that broke later, and records that did not match."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.build.recipes import load_recipe  # noqa: E402
from edgesdk.errors import BuildError  # noqa: E402


def _refused(*overrides: str) -> BuildError:
    with pytest.raises(BuildError) as info:
        load_recipe("power").with_overrides(list(overrides)).validated()
    return info.value


@pytest.mark.parametrize("tokens", [0, -3, 7])
def test_a_sweep_shorter_than_one_entropy_window_is_refused_before_the_build(tokens):
    """sweep_tokens 0 (or below) decoded no token, so every point's executed fraction was None and choosing
    among them was a TypeError after the whole training; under 8 the controller never steered."""
    error = _refused(f"power.sweep_tokens={tokens}")
    assert f"sweep_tokens={tokens}" in str(error)
    assert "set power.sweep_tokens to 8 or more" in str(error)


@pytest.mark.parametrize(("override", "message"), [
    ("power.lr=-0.001", "lr must be a positive finite number (the adapters' learning rate), got -0.001"),
    ("power.lr=0", "lr must be a positive finite number"),
    ("power.weight_budget=-10", "weight_budget=-10.0: loss weights must be >= 0"),
    ("power.weight_power_kl=-0.1", "weight_power_kl=-0.1: loss weights must be >= 0"),
    ("power.entropy_end=-0.08", "entropy_end=-0.08: loss weights must be >= 0"),
    ("power.low_power_scale=-0.3", "low_power_scale must be in [0, 1]"),
    ("power.low_power_scale=3", "low_power_scale must be in [0, 1]"),
])
def test_a_learning_rate_or_loss_weight_that_trains_backwards_is_refused_before_the_build(override, message):
    """A negative lr was AdamW's ValueError (a traceback) after the c_t profile; 0 trained nothing; a negative
    loss weight ascended its term: the gates trained away from the entropy target or over the budget."""
    assert message in str(_refused(override))
