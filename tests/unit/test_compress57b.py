"""Review 57 of the shared training loop (edgesdk/compress/train.py): each test fails on the code before its fix."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress.train import LoopSettings, run_training  # noqa: E402
from edgesdk.errors import BuildError  # noqa: E402


def _linear():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1)


def test_a_loss_that_turns_infinite_stops_the_stage_before_the_weights_turn_nan():
    """Batch 3 of 4 holds an infinite value: the loop stepped AdamW on its NaN gradient, every weight became NaN,
    and the stage finished (and was checkpointed, so --resume kept the NaN model); only the export said a stage
    had diverged. It now stops at that batch, naming the stage, the batch and the lr, with the weights finite."""
    model = _linear()
    batches = [torch.ones(2, 4), torch.ones(2, 4), torch.full((2, 4), float("inf")), torch.ones(2, 4)]
    with pytest.raises(BuildError) as refused:
        run_training(model, lambda batch, _: (model(batch).square().mean(), {}), batches, LoopSettings(lr=1e-2),
                     desc="distill", progress=False)
    problem = refused.value.problem
    assert problem.startswith("stage 'distill': the training loss is ")  # inf or nan, as the weights' signs make it
    assert "at batch 3 of 4, after 2 update(s) at lr 0.01: the training diverged" in problem
    assert "lower distill.lr, e.g. to 0.001" in refused.value.fix
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_loss_that_is_nan_before_any_update_blames_the_model_not_the_learning_rate():
    model = _linear()
    with torch.no_grad():
        model.bias.fill_(float("nan"))  # the model the stage was given already computes NaN
    with pytest.raises(BuildError) as refused:
        run_training(model, lambda batch, _: (model(batch).square().mean(), {}), [torch.ones(2, 4)] * 2,
                     LoopSettings(lr=1e-3), desc="qat", progress=False)
    assert "the training loss is nan at batch 1 of 2, before any update" in refused.value.problem
    assert "lr" not in refused.value.fix


def test_a_gradient_that_is_not_finite_under_a_finite_loss_is_refused_too():
    """sqrt at 0: a finite loss of 0 whose gradient is infinite; clipping made it NaN and AdamW wrote it in."""
    model = _linear()
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()
    with pytest.raises(BuildError, match="the training gradient norm is (inf|nan) at batch 1 of 1"):
        run_training(model, lambda batch, _: (model(batch).sqrt().sum(), {}), [torch.ones(2, 4)],
                     LoopSettings(lr=1e-3), desc="qat", progress=False)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_finite_run_still_trains():
    model = _linear()
    result = run_training(model, lambda batch, _: (model(batch).square().mean(), {}), [torch.ones(2, 4)] * 4,
                          LoopSettings(lr=1e-2, grad_accumulation=2), desc="qat", progress=False)
    assert result["updates"] == 2
    assert result["loss_last"] < result["loss_first"]
