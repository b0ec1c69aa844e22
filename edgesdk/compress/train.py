"""The training loop the QAT and distillation stages share: AdamW, gradient accumulation,
clipping, a cosine learning-rate decay, an optional gradient-scaling schedule and a progress
bar with ETA."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from edgesdk.errors import BuildError

MIN_RAMP_UPDATES = 2  # the shortest warmup that ramps: its first update at half the rate
LossFn = Callable[[torch.Tensor, float], tuple[torch.Tensor, dict[str, float]]]


@dataclass(frozen=True)
class LoopSettings:
    lr: float
    grad_accumulation: int = 1
    grad_scaling: bool = False  # seed 004 §2.3: gradients x 1 / (1 + 0.001 * step)
    clip_norm: float = 1.0
    warmup_fraction: float = 0.05


def trains_with_the_backbone(name: str, train_embedding: bool) -> bool:
    """Whether QAT or distillation trains the parameter ``name``: every backbone weight but the
    embedding unless ``train_embedding``; never a power adapter (``.power_adapter.``), which the power
    stage trained on its own losses and calibrated the runtime's threshold for."""
    return (train_embedding or "embed_tokens" not in name) and ".power_adapter." not in name


def check_optimiser_settings(lr: float, temperature: float, grad_accumulation: int = 1) -> None:
    """A learning rate and a distillation temperature that train at all (positive and finite), and at
    least one batch per optimizer step."""
    for name, value in (("lr", lr), ("temperature", temperature)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive finite number, got {value}")
    if grad_accumulation < 1:
        raise ValueError(f"grad_accumulation must be >= 1, got {grad_accumulation}")


def gradient_scale(step: int) -> float:
    """The seed's schedule (§2.3). Under Adam a common gradient factor cancels in m / sqrt(v)
    (up to epsilon and clipping), so it acts only through those: its effect is measured, not assumed."""
    return 1.0 / (1.0 + 0.001 * step)


def warmup_updates(updates: int, fraction: float) -> int:
    """The updates over which the learning rate ramps up to its full value: ``fraction`` of them (5 of the default
    recipe's 112 at 0.05), but at least ``MIN_RAMP_UPDATES`` in a run of four times as many or more. Rounded down
    alone, the fraction gave one update to every run under 40 updates (QAT's default 16, distillation's 32), and a
    ramp of one update is none: its one update runs at the full rate, on an optimizer with no moment estimates
    yet. That floor never takes more than a quarter of the run."""
    return max(1, int(fraction * updates), min(MIN_RAMP_UPDATES, updates // 4))


def check_finite(what: str, value: torch.Tensor, desc: str, index: int, count: int, updates_done: int,
                 lr: float) -> None:
    """Refuse a non-finite loss or gradient norm before the optimizer step: AdamW would write NaN into every
    trained weight, the stage would finish and be checkpointed (so ``--resume`` kept the NaN model), and only the
    export, stages later, said that "a stage" diverged. ``desc`` is the stage's name; a loss that is not finite
    before any update is the doing of the model the stage was given (or of its teacher), not of the training; so is
    a gradient that is not finite before any update (a finite loss the given weights differentiate to inf or NaN):
    no step has run at the learning rate yet, so a lower one changes nothing."""
    if torch.isfinite(value).all():
        return
    where = f"stage '{desc}': the training {what} is {value.item()} at batch {index + 1} of {count}"
    if not updates_done:
        culprit = ("the model the stage was given, or its teacher, already computes non-finite values" if what == "loss"
                   else "the model the stage was given already computes a non-finite gradient of a finite loss")
        raise BuildError(f"{where}, before any update: {culprit}", "check the stages before it and the source model (run "
                         "the build without them to find the one that diverged)")
    raise BuildError(f"{where}, after {updates_done} update(s) at lr {lr:g}: the training diverged, and no "
                     "checkpoint of the stage was written",
                     f"lower {desc}.lr, e.g. to {lr / 10:g}, and rebuild")


def run_training(model, loss_fn: LossFn, batches: list[torch.Tensor], settings: LoopSettings, *, desc: str,
                 progress: bool) -> dict:
    """Train the parameters of ``model`` that require grad; ``loss_fn(batch, fraction_done)``. A non-finite loss
    or gradient norm stops the training with a BuildError naming the stage (``desc``) and the batch."""
    from tqdm import tqdm

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=0.0)
    accumulate = settings.grad_accumulation
    # a last, partial group of batches (len % grad_accumulation) is an update of its own, on the schedule
    updates = max(1, -(-len(batches) // accumulate))
    warmup = warmup_updates(updates, settings.warmup_fraction)

    def lr_at(update: int) -> float:
        if update < warmup:
            return settings.lr * (update + 1) / warmup
        return settings.lr * 0.5 * (1 + math.cos(math.pi * (update - warmup) / max(1, updates - warmup)))

    history: list[dict[str, float]] = []
    update = 0
    bar = tqdm(batches, desc=desc, disable=not progress, unit="batch")
    for index, batch in enumerate(bar):
        loss, parts = loss_fn(batch, index / max(1, len(batches)))
        check_finite("loss", loss.detach(), desc, index, len(batches), update, settings.lr)
        group_start = index - index % accumulate
        (loss / min(accumulate, len(batches) - group_start)).backward()  # the mean over this update's batches
        history.append({"loss": loss.item(), **parts})
        if (index + 1) % accumulate == 0 or index + 1 == len(batches):
            if settings.grad_scaling:
                factor = gradient_scale(update)
                for p in params:
                    if p.grad is not None:
                        p.grad.mul_(factor)
            norm = torch.nn.utils.clip_grad_norm_(params, settings.clip_norm)
            check_finite("gradient norm", norm.detach(), desc, index, len(batches), update, settings.lr)
            for group in optimizer.param_groups:
                group["lr"] = lr_at(update)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            update += 1
        bar.set_postfix(loss=f"{history[-1]['loss']:.4f}")
    head, tail = history[: max(1, len(history) // 10)], history[-max(1, len(history) // 10):]
    tokens = sum(int(b.numel()) for b in batches)
    return {
        "batches": len(batches), "updates": update, "tokens": tokens,
        "loss_first": round(sum(h["loss"] for h in head) / len(head), 5),
        "loss_last": round(sum(h["loss"] for h in tail) / len(tail), 5),
    }
