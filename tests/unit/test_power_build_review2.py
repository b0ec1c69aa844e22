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
