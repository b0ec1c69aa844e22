"""The pipeline's early stage-size check (build/pipeline.py check_stage_sizes), run before any stage, names
build_bundle()'s overrides to a Python caller as the stages' own checks do; it named --set."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.build.pipeline import check_stage_sizes  # noqa: E402
from edgesdk.build.registry import make_config  # noqa: E402
from edgesdk.compress import distill, sparsify  # noqa: E402,F401  (registers the stages)
from edgesdk.errors import BuildError  # noqa: E402
from edgesdk.profile import get_profile  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


@pytest.mark.parametrize(("stage", "values", "setting"), [
    ("sparsify", {"block_size": 4096}, "sparsify.block_size=32"),
    ("sparsify", {"allocation": "global", "density": 0.3, "min_density": 0.29, "block_size": 16},
     "sparsify.density="),
    ("distill", {"soft_prompt_tokens": 400, "sequence_length": 256}, "distill.soft_prompt_tokens=256"),
])
def test_the_early_stage_size_check_speaks_the_callers_terms(stage, values, setting):
    model, profile = tiny_llama(hidden=64, intermediate=128), get_profile("host")
    with pytest.raises(BuildError) as refused:
        check_stage_sizes([(stage, make_config(stage, values, "python"))], model, profile, "python")
    assert "--set" not in refused.value.fix
    assert f"overrides=['{setting}" in refused.value.fix
    with pytest.raises(BuildError) as refused:
        check_stage_sizes([(stage, make_config(stage, values))], model, profile)
    assert f"--set {setting}" in refused.value.fix
