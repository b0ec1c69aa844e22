"""Review 58 of the distillation losses and the shared training loop (edgesdk/compress/losses.py, train.py): each
test fails on the code before its fix."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from edgesdk.compress.losses import global_attention_cosine  # noqa: E402
from edgesdk.compress.train import LoopSettings, run_training  # noqa: E402
from edgesdk.errors import BuildError  # noqa: E402


def _causal_maps(seed: int, layers: int = 3, heads: int = 4, length: int = 16) -> list[torch.Tensor]:
    """Random causal attention maps (B, H, S, S) per layer, rows summing to 1."""
    generator = torch.Generator().manual_seed(seed)
    future = torch.triu(torch.full((length, length), float("-inf")), 1)  # (S, S): -inf above the diagonal
    return [torch.softmax(torch.randn(2, heads, length, length, generator=generator) + future, dim=-1)
            for _ in range(layers)]


@pytest.mark.parametrize("seed", range(12))
def test_the_global_term_is_exactly_zero_for_a_student_that_attends_as_its_teacher(seed):
    """1 - F.cosine_similarity rounded the cosine of two equal float32 vectors to 1 +- 1e-7: for 8 of these 12
    random map sets the global term of a student identical to its teacher was 6e-8 to 2e-7, not 0 (losses.py:
    each term is exactly 0 when student and teacher agree)."""
    maps = _causal_maps(seed)
    assert float(global_attention_cosine(maps, [m.clone() for m in maps])) == 0.0


def test_the_global_term_is_still_one_minus_the_cosine_of_the_head_mean_maps():
    student, teacher = _causal_maps(1), _causal_maps(2)
    s = torch.cat([m.mean(1).flatten(1) for m in student], dim=1).double()  # (B, L*S*S)
    t = torch.cat([m.mean(1).flatten(1) for m in teacher], dim=1).double()
    expected = float((1 - F.cosine_similarity(s, t, dim=1)).mean())
    assert expected > 1e-3
    assert float(global_attention_cosine(student, teacher)) == pytest.approx(expected, rel=1e-5)


def test_the_global_term_gives_the_student_the_gradient_of_one_minus_the_cosine():
    student, teacher = _causal_maps(3), _causal_maps(4)
    student = [m.clone().requires_grad_(True) for m in student]
    global_attention_cosine(student, teacher).backward()
    ours = [m.grad.clone() for m in student]
    for m in student:
        m.grad = None
    s = torch.cat([m.mean(1).flatten(1) for m in student], dim=1)  # (B, L*S*S)
    t = torch.cat([m.mean(1).flatten(1) for m in teacher], dim=1)
    (1 - F.cosine_similarity(s, t, dim=1)).mean().backward()
    for mine, reference in zip(ours, (m.grad for m in student), strict=True):
        torch.testing.assert_close(mine, reference, rtol=1e-4, atol=1e-9)


def test_a_gradient_that_is_not_finite_before_any_update_blames_the_model_not_the_learning_rate():
    """sqrt at 0: the first batch's loss is finite, its gradient is not. No update had run, yet the refusal said
    "after 0 update(s) at lr 0.0001: the training diverged" and told the user to lower distill.lr, which changes
    nothing: the gradient of the given weights is computed before any step at that rate."""
    model = torch.nn.Linear(4, 1)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()
    with pytest.raises(BuildError) as refused:
        run_training(model, lambda batch, _: (model(batch).sqrt().sum() + 1.0, {}), [torch.ones(2, 4)] * 2,
                     LoopSettings(lr=1e-4), desc="distill", progress=False)
    problem, fix = refused.value.problem, refused.value.fix
    assert "the training gradient norm is" in problem
    assert "at batch 1 of 2, before any update" in problem
    assert "the model the stage was given already computes a non-finite gradient of a finite loss" in problem
    assert "diverged, and no checkpoint" not in problem
    assert "lr" not in fix
    assert "check the stages before it and the source model" in fix
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_gradient_that_turns_non_finite_after_updates_still_names_the_learning_rate():
    """After an update the learning rate is a cause again: the refusal still says how far the training got."""
    model = torch.nn.Linear(4, 1)

    def loss(batch, _):  # the third batch's loss is finite (1) and its gradient is not (sqrt at 0)
        if batch.sum() == 0:
            return (model.weight - model.weight.detach()).abs().sqrt().sum() + 1.0, {}
        return model(batch).square().mean(), {}

    batches = [torch.ones(2, 4), torch.ones(2, 4), torch.zeros(2, 4), torch.ones(2, 4)]
    with pytest.raises(BuildError) as refused:
        run_training(model, loss, batches, LoopSettings(lr=1e-2), desc="qat", progress=False)
    assert "the training gradient norm is" in refused.value.problem
    assert "at batch 3 of 4, after 2 update(s) at lr 0.01: the training diverged" in refused.value.problem
    assert "lower qat.lr, e.g. to 0.001" in refused.value.fix
