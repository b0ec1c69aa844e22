"""The power vector and its distribution in torch, for training (seed 000 §2.2, §3.3, §5.2).

The same steps as ``edgesdk.power.distribution`` (the board's numpy version): causal smoothing
over the valid tokens among the last ``width`` positions, whole windows, min-max plus a floor, L1; padding masked.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgesdk.power.distribution import FLOOR, SMOOTH, WINDOW


def combine(peak: torch.Tensor, ffn_norm: torch.Tensor, cost: torch.Tensor, weights, scales) -> torch.Tensor:
    alpha, beta, gamma = weights
    sa, sf, sc = scales
    return alpha * peak / sa + beta * ffn_norm / sf + gamma * cost / sc


def trailing_sum(x: torch.Tensor, width: int) -> torch.Tensor:
    """Each position's value plus the ``width - 1`` values before it along the last axis (..., T) -> (..., T).

    Summed position by position, not as a difference of running sums: in float32 that difference carries the
    rounding of the whole prefix (1e-6 at position 100), and min-max then stretches it over a window whose powers
    are (nearly) equal: a constant power of 0.1 read 0.84-1.95 nats per window of 8 instead of ln 8.
    """
    return sum((F.pad(x, (shift, 0))[..., : x.shape[-1]] for shift in range(width)), torch.zeros_like(x))


def smooth(p: torch.Tensor, mask: torch.Tensor, width: int = SMOOTH) -> torch.Tensor:
    """Causal moving average over the valid tokens among the last ``width`` positions (B, T); 0 on padding.

    Computed in float64, as the board's numpy version is, and returned in ``p``'s dtype."""
    valid = mask > 0
    # p * 0 is NaN for a NaN or inf on padding: the sums would carry it on
    p64 = torch.where(valid, p, torch.zeros_like(p)).double()
    total, count = trailing_sum(p64, width), trailing_sum(valid.double(), width)
    return torch.where(valid, total / count.clamp_min(1.0), torch.zeros_like(p64)).to(p.dtype)


def distribution(s: torch.Tensor, mask: torch.Tensor, floor: float = FLOOR) -> torch.Tensor:
    """Min-max + floor + L1 over the valid entries of the last axis."""
    valid = mask > 0
    low = torch.where(valid, s, torch.full_like(s, float("inf"))).amin(-1, keepdim=True)
    high = torch.where(valid, s, torch.full_like(s, float("-inf"))).amax(-1, keepdim=True)
    span = high - low
    ok = span > 1e-12
    # equal powers: every entry 1, so P is uniform (ln W) whatever the floor, as in distribution.py
    scaled = torch.where(ok, (s - low) / torch.where(ok, span, torch.ones_like(span)), torch.ones_like(s))
    x = torch.where(valid, scaled + floor, torch.zeros_like(s))
    total = x.sum(-1, keepdim=True)
    return torch.where(total > 0, x / torch.where(total > 0, total, torch.ones_like(total)), torch.zeros_like(x))


def entropy(prob: torch.Tensor) -> torch.Tensor:
    """-sum P ln P over the last axis (nats)."""
    return -(prob * torch.where(prob > 0, prob, torch.ones_like(prob)).log()).sum(-1)


def windowed(p: torch.Tensor, mask: torch.Tensor, window: int = WINDOW, width: int = SMOOTH,
             floor: float = FLOOR) -> tuple[torch.Tensor, torch.Tensor]:
    """p (B, T) -> P (B, T // window, window) and the window mask."""
    s = smooth(p, mask, width)
    n = (p.shape[-1] // window) * window
    s_w = s[..., :n].reshape(*p.shape[:-1], n // window, window)  # (B, T/W, W)
    m_w = mask[..., :n].reshape(*p.shape[:-1], n // window, window)
    return distribution(s_w, m_w, floor), m_w


def power_kl(p_proxy: torch.Tensor, p_student: torch.Tensor, window_mask: torch.Tensor) -> torch.Tensor:
    """KL(P_proxy || P_student) per window (B, T/W), >= 0: finite where both are floored (floor > 0); at floor 0 a
    token the proxy gives mass and the student none makes it inf, the true KL.

    A token where P_proxy is 0 (a floor of 0: min-max puts each window's lowest token there) adds 0 (0 ln 0 = 0, as
    in :func:`entropy`), not 0 * ln 0 = NaN, which made the loss and every adapter gradient NaN.
    For two equal or nearly equal distributions the float sum of P ln(P/Q) can round to just below
    0 (-2e-7 in float32); it is clamped at 0, as :func:`edgesdk.power.losses.token_kl` is.
    """
    counted = (window_mask > 0) & (p_proxy > 0)
    # ratio 1 where not counted, in both branches: a NaN in the unused one would still reach the gradient
    ratio = torch.where(counted, p_proxy / torch.where(counted, p_student, torch.ones_like(p_student)),
                        torch.ones_like(p_proxy))
    return (p_proxy * ratio.log()).sum(-1).clamp_min(0.0)
