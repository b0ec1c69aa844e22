"""The pipeline's early stage-size check (build/pipeline.py check_stage_sizes), run before any stage, names
build_bundle()'s overrides to a Python caller as the stages' own checks do; it named --set."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.build.pipeline import check_stage_sizes  # noqa: E402
from edgesdk.build.registry import make_config  # noqa: E402
from edgesdk.errors import BuildError  # noqa: E402
from edgesdk.profile import get_profile  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402
from tests.unit.test_compress52 import SIZE_REFUSALS  # noqa: E402


@pytest.mark.parametrize(("stage", "values", "setting"), SIZE_REFUSALS)
def test_the_early_stage_size_check_speaks_the_callers_terms(stage, values, setting):
    model, profile = tiny_llama(hidden=64, intermediate=128), get_profile("host")
    with pytest.raises(BuildError) as refused:
        check_stage_sizes([(stage, make_config(stage, values, "python"))], model, profile, "python")
    assert "--set" not in refused.value.fix
    assert f"overrides=['{setting}" in refused.value.fix
    with pytest.raises(BuildError) as refused:
        check_stage_sizes([(stage, make_config(stage, values))], model, profile)
    assert f"--set {setting}" in refused.value.fix
