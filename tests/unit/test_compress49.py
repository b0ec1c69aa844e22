"""Compression review 49: the global block-sparsity allocation delivers the density asked (the min_density floors
come out of the budget, as ModelOpt's and SparseGPT-style global allocation do, instead of being added on top)."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress import sparsify  # noqa: E402
from edgesdk.errors import BuildError  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


def _kept(masks: dict[str, torch.Tensor]) -> int:
    return sum(int(m.sum()) for m in masks.values())


def test_global_allocation_keeps_the_asked_density_with_floors_from_the_budget():
    """Two weights of 64 blocks, one outranking the other everywhere: density 0.5 asks 64 blocks. The floors (16
    each) are taken first and the remaining 32 go to the strong weight; the old plan gave "strong" all 64 and
    "weak" its 16 floor on top, 80 blocks (0.625)."""
    generator = torch.Generator().manual_seed(0)
    scores = {"strong": torch.rand(8, 8, generator=generator) + 1.0,
              "weak": torch.rand(8, 8, generator=generator) * 0.01}
    masks = sparsify.plan_masks(scores, sparsify.SparsifyConfig(density=0.5, min_density=0.25, allocation="global"))
    assert _kept(masks) == 64
    assert sparsify.density_summary(masks)["density"] == 0.5
    assert int(masks["weak"].sum()) == 16
    assert int(masks["strong"].sum()) == 48
    for name, mask in masks.items():  # each weight keeps its best blocks
        assert mask.view(-1)[scores[name].flatten().topk(int(mask.sum())).indices].all(), name


@pytest.mark.parametrize("importance", ["fisher", "wanda"])
def test_global_allocation_on_a_model_gives_the_asked_density(importance):
    """The stage's path (block importance, then the global plan) on a tiny model: the realised density is the one
    asked, and every weight keeps its floor."""
    model = tiny_llama(seed=3, hidden=64, heads=4, kv_heads=2)
    batches = [torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(i))
               for i in range(2)]
    config = sparsify.SparsifyConfig(density=0.7, min_density=0.5, importance=importance, allocation="global",
                                     block_size=16)
    scores = sparsify.block_importance(model, batches, config, 16)
    masks = sparsify.plan(model, scores, batches, 16, config)
    total = sum(m.numel() for m in masks.values())
    assert _kept(masks) == round(0.7 * total)
    for name, mask in masks.items():
        assert int(mask.sum()) >= sparsify.floor_blocks(0.5, mask.numel()), name


def test_global_allocation_refuses_a_density_the_floors_alone_exceed():
    """Three weights of 3 blocks at min_density 0.5 need ceil(1.5) = 2 blocks each, 6 of 9 (0.667): density 0.55
    (5 blocks) passes the config's density >= min_density check but cannot hold the floors."""
    scores = {name: torch.rand(1, 3, generator=torch.Generator().manual_seed(i)) for i, name in enumerate("abc")}
    with pytest.raises(BuildError) as raised:
        sparsify.plan_masks(scores, sparsify.SparsifyConfig(density=0.55, min_density=0.5, allocation="global"))
    message = str(raised.value)
    assert "sparsify.density 0.55 keeps 5 of the model's 9 blocks" in message
    assert "floors alone need 6" in message
    assert "raise sparsify.density to at least 0.6667" in message
    masks = sparsify.plan_masks(scores, sparsify.SparsifyConfig(density=0.6667, min_density=0.5,
                                                                allocation="global"))
    assert all(int(m.sum()) == 2 for m in masks.values())


def test_the_floor_budget_is_checked_from_the_shapes_before_any_calibration():
    """The stage refuses such a density from the weights' shapes, before the minutes of Fisher / Wanda
    calibration: a tiny model's blocks of 16 (264 in all) at min_density 0.3 need 86 blocks for their floors
    (ceil per weight), more than density 0.31 keeps (82)."""
    model = tiny_llama(seed=3, hidden=64, heads=4, kv_heads=2)
    counts = sparsify.block_counts(model, 16)
    assert counts["model.layers.0.mlp.down_proj"] == 4 * 7  # 64 x 112: the last block column padded
    assert sum(counts.values()) == 264
    config = sparsify.SparsifyConfig(density=0.31, min_density=0.3, allocation="global", block_size=16)
    with pytest.raises(BuildError, match="keeps 82 of the model's 264 blocks, but the min_density floors alone "
                                         "need 86"):
        sparsify.check_floor_budget(counts, config)
    assert sparsify.check_floor_budget(counts, sparsify.SparsifyConfig(density=0.33, min_density=0.3)) == 87


def test_the_stage_refuses_the_density_before_it_needs_any_training_text(tmp_path):
    """No training text in the context: the refusal must come from the shapes, before the calibration batches."""
    from types import SimpleNamespace

    from edgesdk.build.registry import BuildContext

    model = tiny_llama(seed=3, hidden=64, heads=4, kv_heads=2)
    config = sparsify.SparsifyConfig(density=0.31, min_density=0.3, allocation="global", block_size=16,
                                     calibration_batches=1, sequence_length=16)
    ctx = BuildContext(profile=SimpleNamespace(name="myboard", sparsity_block=16), work_dir=tmp_path, teacher=None,
                       progress=False)
    with pytest.raises(BuildError) as refused:
        sparsify.sparsify_stage(model, config, ctx)
    assert "sparsify.density 0.31 keeps 82 of the model's 264 blocks" in refused.value.problem
    assert "raise sparsify.density to at least 0.3258" in refused.value.fix


def test_the_build_refuses_the_density_before_any_stage_runs():
    """check_stage_sizes runs before the first stage: a global density the floors exceed was refused only when the
    sparsify stage started, after QAT's training."""
    from types import SimpleNamespace

    from edgesdk.build.pipeline import check_stage_sizes

    model = tiny_llama(seed=3, hidden=64, heads=4, kv_heads=2)
    config = sparsify.SparsifyConfig(density=0.31, min_density=0.3, allocation="global", block_size=16)
    profile = SimpleNamespace(name="myboard", sparsity_block=16)
    with pytest.raises(BuildError) as refused:
        check_stage_sizes([("qat", None), ("sparsify", config)], model, profile)
    assert "min_density floors alone need" in refused.value.problem
    # the sensitivity allocation keeps every weight's floor too: refused before any stage as well
    with pytest.raises(BuildError, match="min_density floors alone need"):
        check_stage_sizes([("qat", None), ("sparsify", dataclasses.replace(config, allocation="sensitivity"))],
                          model, profile)
    check_stage_sizes([("qat", None), ("sparsify", dataclasses.replace(config, density=0.4))], model, profile)
