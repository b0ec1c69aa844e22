"""Review 61 of the smooth, distill and sparsify stages: each test named for a defect fails on the code before its
fix."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from edgesdk.build.pipeline import check_stage_sizes  # noqa: E402
from edgesdk.build.registry import BuildContext, make_config, stage_spec  # noqa: E402
from edgesdk.compress import distill  # noqa: E402
from edgesdk.compress.data import DataConfig  # noqa: E402
from edgesdk.errors import BuildError  # noqa: E402
from edgesdk.profile import get_profile  # noqa: E402
from tests._utils.tiny import CORPUS, tiny_llama, tiny_tokenizer  # noqa: E402

SETTINGS = {"steps": 2, "batch_size": 2, "sequence_length": 48, "grad_accumulation": 1}


def _context(tmp_path, teacher) -> BuildContext:
    text = tmp_path / "train.txt"
    text.write_text("\n".join(CORPUS * 3), encoding="utf-8")
    return BuildContext(profile=get_profile("host"), work_dir=tmp_path, tokenizer=tiny_tokenizer(), teacher=teacher,
                        progress=False, data_config=DataConfig(files=(str(text),), generated_sequences=0))


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
def test_a_distill_sequence_past_the_models_positions_is_refused_without_a_soft_prompt(tmp_path, model_type):
    """distill.sequence_length 48 on a model of 16 positions trained the student on 48-token blocks (no soft prompt,
    so the positions check was skipped): both models computed past their trained context, on positions the bundle,
    whose context stops at 16, never runs."""
    teacher = tiny_llama(seed=1, model_type=model_type, max_positions=16)
    model = copy.deepcopy(teacher)
    config = make_config("distill", SETTINGS)
    with pytest.raises(BuildError) as refused:
        stage_spec("distill").run(model, config, _context(tmp_path, teacher))
    assert "distill.sequence_length is 48" in refused.value.problem
    assert "max_position_embeddings 16" in refused.value.problem
    assert "--set distill.sequence_length=16 or less" in refused.value.fix
    for before, after in zip(teacher.parameters(), model.parameters(), strict=True):
        assert torch.equal(before, after)  # refused before any training
    with pytest.raises(BuildError, match="distill.sequence_length is 48"):  # and by the build, before any stage
        check_stage_sizes([("distill", config)], teacher, get_profile("host"))
    with pytest.raises(BuildError) as python_terms:
        distill.check_soft_prompt(config, teacher.config, "python")
    assert "overrides=['distill.sequence_length=16']" in python_terms.value.fix


def test_a_distill_sequence_that_fits_the_positions_still_trains(tmp_path):
    teacher = tiny_llama(seed=1, max_positions=48)
    model = copy.deepcopy(teacher)
    ctx = _context(tmp_path, teacher)
    stage_spec("distill").run(model, make_config("distill", SETTINGS), ctx)
    assert ctx.metrics["training"]["tokens"] == 2 * 2 * 48
    distill.check_soft_prompt(make_config("distill", {"sequence_length": 48, "soft_prompt_tokens": 0}), teacher.config)
    with pytest.raises(BuildError, match="distill.soft_prompt_tokens is 1"):  # the prefix's own check as before
        distill.check_soft_prompt(make_config("distill", {"sequence_length": 48, "soft_prompt_tokens": 1}),
                                  teacher.config)
