"""Review 52 of the compress stages: each test named for a defect fails on the code before its fix."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from edgesdk.build.registry import BuildContext, make_config, stage_spec  # noqa: E402
from edgesdk.compress import distill, sparsify  # noqa: E402,F401  (registers the stages)
from edgesdk.compress.data import DataConfig  # noqa: E402
from edgesdk.errors import BuildError  # noqa: E402
from edgesdk.profile import get_profile  # noqa: E402
from tests._utils.tiny import CORPUS, tiny_llama, tiny_tokenizer  # noqa: E402


def _context(tmp_path, model, terms: str) -> BuildContext:
    text = tmp_path / "train.txt"
    text.write_text("\n".join(CORPUS * 3), encoding="utf-8")
    return BuildContext(profile=get_profile("host"), work_dir=tmp_path, tokenizer=tiny_tokenizer(),
                        teacher=copy.deepcopy(model), progress=False, terms=terms,
                        data_config=DataConfig(files=(str(text),), generated_sequences=0))


# ------------------------------------------------------------------ refusals in the caller's terms
# (stage, its config, the start of the override a refusal's fix names): each refused on a tiny 64-wide Llama
SIZE_REFUSALS = [
    ("sparsify", {"block_size": 4096}, "sparsify.block_size=32"),  # its smallest weight is 64 x 64
    ("sparsify", {"allocation": "global", "density": 0.3, "min_density": 0.29, "block_size": 16},
     "sparsify.density="),
    ("distill", {"soft_prompt_tokens": 400, "sequence_length": 256}, "distill.soft_prompt_tokens=256"),
]


@pytest.mark.parametrize(("stage", "values", "setting"), SIZE_REFUSALS)
def test_stage_refusals_name_build_bundles_overrides_to_a_python_caller(tmp_path, stage, values, setting):
    """The sparsify stage's block-edge and floor-budget refusals and the distill stage's soft-prompt refusal told a
    build_bundle() caller to "--set sparsify.block_size=..." (a CLI flag build_bundle() has no way to take), where
    prune's and qat's refusals name ``overrides=[...]``; the stage checks them itself after a prune stage (the
    pipeline's early check sees the unpruned widths)."""
    model = tiny_llama(hidden=64, intermediate=128)
    ctx = _context(tmp_path, model, "python")
    with pytest.raises(BuildError) as refused:
        stage_spec(stage).run(model, make_config(stage, values, "python"), ctx)
    assert "--set" not in refused.value.fix
    assert f"overrides=['{setting}" in refused.value.fix
    cli = _context(tmp_path, model, "cli")  # the CLI's words are kept for the CLI
    with pytest.raises(BuildError) as refused:
        stage_spec(stage).run(model, make_config(stage, values), cli)
    assert f"--set {setting}" in refused.value.fix
