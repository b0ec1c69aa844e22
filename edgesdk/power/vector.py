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


def smooth(p: torch.Tensor, mask: torch.Tensor, width: int = SMOOTH) -> torch.Tensor:
    """Causal moving average over the valid tokens among the last ``width`` positions (B, T); 0 on padding."""
    valid = (mask > 0).to(p.dtype)
    p = torch.where(valid > 0, p, torch.zeros_like(p))  # p * 0 is NaN for a NaN or inf on padding: the cumsum carries it on
    csum, ccount = p.cumsum(-1), valid.cumsum(-1)
    csum_shift = F.pad(csum, (width, 0))[..., : p.shape[-1]]
    count_shift = F.pad(ccount, (width, 0))[..., : p.shape[-1]]
    return torch.where(valid > 0, (csum - csum_shift) / (ccount - count_shift).clamp_min(1.0), torch.zeros_like(p))


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
    """KL(P_proxy || P_student) per window (B, T/W), >= 0: both are floored, so it is finite.

    For two equal or nearly equal distributions the float sum of P ln(P/Q) can round to just below
    0 (-2e-7 in float32); it is clamped at 0, as :func:`edgesdk.power.losses.token_kl` is.
    """
    valid = window_mask > 0
    ratio = torch.where(valid, p_proxy / torch.where(valid, p_student, torch.ones_like(p_student)),
                        torch.ones_like(p_proxy))
    return (p_proxy * ratio.log()).sum(-1).clamp_min(0.0)
