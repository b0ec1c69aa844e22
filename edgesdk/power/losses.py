"""Loss terms of power distillation (seed 000 §2.2, §3.3) and the seed's stabilisers.

Every term is a non-negative number except the z-scored KL (a normalised deviation by design).

* token KL        KL(ungated || gated) over the vocabulary, per token (>= 0; 0 when the gated model
                  reproduces the ungated one);
* power KL        KL(P_proxy || P_student) per window, P_proxy from the gated (adapter) path and
                  P_student from the ungated path (>= 0), square-rooted above 0.5 (§3.3);
* entropy term    (H(P_proxy) - target)^2 per window (>= 0), toward the profile's target;
* budget term     max(0, executed FFN fraction - budget) (>= 0; 0 inside the budget).

Stabilisers (§3.3): the token KL of tokens whose (ungated) power is below the sequence mean is
weighted 0.3, which multiplies their gradient by 0.3; the per-sample KL is z-scored with running
statistics before gradient accumulation (§3.3 "z-score per sample before accumulation"); the
entropy weight follows :func:`entropy_weight`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

CLIP_AT = 0.5


def token_kl(teacher_logits: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) per position: (B, T, V) x2 -> (B, T), >= 0."""
    t = F.log_softmax(teacher_logits.float(), dim=-1)
    s = F.log_softmax(student_logits.float(), dim=-1)
    return (t.exp() * (t - s)).sum(-1).clamp_min(0.0)


def sqrt_clip(kl: torch.Tensor, at: float = CLIP_AT) -> torch.Tensor:
    """KL up to ``at``, then sqrt(at * KL): continuous at ``at`` and growing like sqrt above it.

    The seed replaces KL by sqrt(KL) above 0.5, which jumps from 0.5 to 0.71; scaling by sqrt(at)
    keeps the value continuous and the gradient bounded, which is the point of the clip.
    """
    return torch.where(kl > at, torch.sqrt(at * kl.clamp_min(at)), kl)


def power_weights(p_student: torch.Tensor, mask: torch.Tensor, low: float = 0.3) -> torch.Tensor:
    """1 where p_t >= mean(P) of the sequence, ``low`` below (B, T); 0 on padding.

    The mean is over the valid tokens whatever the padding holds (``p * mask`` turned a NaN or inf
    there into a NaN mean, and every valid token into a low-power one).
    """
    valid = mask > 0
    mean = torch.where(valid, p_student, torch.zeros_like(p_student)).sum(-1, keepdim=True) \
        / valid.sum(-1, keepdim=True).clamp_min(1)
    return torch.where(p_student >= mean, torch.ones_like(p_student), torch.full_like(p_student, low)) * valid


def entropy_term(h: torch.Tensor, target: float) -> torch.Tensor:
    return (h - target) ** 2


def budget_term(executed: torch.Tensor, budget: float) -> torch.Tensor:
    """``executed``: mean straight-through FFN mask (scalar tensor, forward = executed fraction)."""
    return F.relu(executed - budget)


def budget_share(run: torch.Tensor, blocks: torch.Tensor | float, round_executed: float, round_blocks: float,
                 budget: float) -> torch.Tensor:
    """One micro-batch's share of ``budget_term`` on the executed fraction of the whole round.

    ``run``: the straight-through count of the FFN blocks the micro-batch ran (forward = how many), out of its
    ``blocks``; ``round_executed``: the round's executed fraction over its ``round_blocks``, known before the first
    backward. The shares sum to ``max(0, round_executed - budget)`` and, while the round is over the budget, every
    micro-batch's gates get its gradient (none within it). The hinge taken per micro-batch and averaged depended on
    the split: fractions of 0.125, 1, 0.5 and 0.5 against a budget of 0.5 cost 0.125 in micro-batches of 1 and
    0.031 (the round's 0.531 - 0.5) in one, and a round within its budget was still pushed down.
    """
    over = float(round_executed > budget)
    return over * (run - budget * blocks) / max(round_blocks, 1.0)


def entropy_weight(progress: float, start: float = 0.01, end: float = 0.08, warm: float = 0.2,
                   ramp_end: float = 0.8) -> float:
    """The seed's schedule (0.01 for epochs < 5, linear to 0.08 by epoch 20, then 0.08) on the
    fraction of training done: ``warm`` and ``ramp_end`` play the roles of epochs 5 and 20."""
    if progress < warm:
        return start
    if progress >= ramp_end:
        return end
    return start + (end - start) * (progress - warm) / (ramp_end - warm)


class RunningZ:
    """Running mean and variance of per-sample KL; z-scores with the statistics detached.

    With the statistics detached, ``sum((kl_i - mu) / sigma)`` has the gradient of
    ``sum(kl_i) / sigma``: every micro-batch's gradient is normalised by the spread of the KL seen
    so far, whatever its size (the seed's fix for the variance of KL gradients at batch 8).

    The statistics are those of every sample seen until they number ``1 / (1 - momentum)`` (10 at 0.9), then an
    exponential average in which each sample decays by ``momentum`` (a batch of n takes ``1 - momentum ** n`` of
    the weight, what n batches of 1 take together): the same numbers whether the first samples came in
    micro-batches of 1, 2 or 8. An average started from the first batch and moved by 0.1 per batch, whatever its
    size, read eight KLs (0.2, 0.5, 0.1, ...) fed one at a time as a mean of 0.36 instead of their 0.46.
    """

    def __init__(self, momentum: float = 0.9, min_std: float = 0.02):
        self.momentum = momentum
        self.min_std = min_std  # the first KLs of a fresh adapter are ~0 with ~0 spread: no 1/0 blow-up
        self.mean: float | None = None
        self.var = 1.0  # population variance of the samples the statistics stand for
        self.count = 0.0  # how many samples they stand for (all seen, then n / (1 - momentum ** n) for batches of n)

    def update(self, values: torch.Tensor) -> None:
        """Fold a batch of samples into the mean and (population) variance: the parallel-variance rule for two
        sets weighted ``1 - w`` (the statistics so far) and ``w`` (the batch)."""
        flat = values.detach().double().reshape(-1)  # (n,)
        n = flat.numel()
        batch_mean, batch_var = float(flat.mean()), float(flat.var(unbiased=False))
        w = 1.0 if self.mean is None else max(1 - self.momentum ** n, n / (self.count + n))
        delta = batch_mean - (self.mean or 0.0)
        self.mean = (self.mean or 0.0) + w * delta
        self.var = (1 - w) * self.var + w * batch_var + w * (1 - w) * delta * delta
        self.count = n / w  # count + n while every sample counts alike; n alone at momentum 0

    def std(self) -> float:
        """The sample standard deviation (Bessel-corrected over the samples the statistics stand for), at least
        ``min_std``."""
        if self.count <= 1:
            return self.min_std
        return max(math.sqrt(self.var * self.count / (self.count - 1)), self.min_std)

    def __call__(self, values: torch.Tensor) -> torch.Tensor:
        self.update(values)
        return (values - self.mean) / self.std()
