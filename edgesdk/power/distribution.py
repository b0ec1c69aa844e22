"""The sequence-level power distribution P and its entropy, in numpy (seed 000 §2.2, §3.3, §5.2).

Used on the board (no torch); ``edgesdk.power.vector`` is the same computation in torch for
training, and a unit test holds the two equal.

Per token t the power is ``p_t = alpha*a_t + beta*f_t + gamma*c_t`` (attention peak, FFN output
norm, KV-cache access cost, each divided by its calibration mean so the weights compare like
with like). Turning a stretch of p into a distribution:

1. padding masked: p_t = 0 where mask_t = 0, and padded positions take no part below (§5.2);
2. causal moving average over the valid tokens among the last ``smooth`` positions (§3.3
   "remove single-point spikes"; causal so the board, which only has the past, computes the same
   values); a masked position in that span is skipped, not replaced by an earlier valid token
   (the same thing as the last ``smooth`` valid tokens where the valid tokens are contiguous, as
   in a rollout or the board's stream);
3. cut into windows of ``window`` tokens; in each, min-max normalisation over its valid tokens,
   plus a floor so no valid token has zero mass (a KL between two distributions stays finite);
4. L1 normalisation over the valid tokens: P sums to 1 per window;
5. entropy H = -sum P ln P in nats.

Window choice. H over W tokens lies in [least_entropy(W, floor), ln W] (0.366 nats over 8 tokens at
the floor 0.01: all the power on one token, the others at the floor; 0 without a floor), and e^H is
the number of tokens that effectively carry the window's power. With W = 8 the targets read
"power on e^1.2 = 3.3 of 8 tokens" (host) and "on e^1.5 = 4.5 of 8 tokens" (boards). Measured on SmolLM2-135M ungated
(WikiText-2, k = 2, floor 0.01), H is 1.75 +- 0.16 nats over 8 tokens: both targets lie below
it, so they ask for gating that differs between tokens, the host's more than the boards'. Over
6 tokens the ungated model already sits at 1.43 (below 1.5: the board target would mean nothing)
and over 16 at about 2.5 (1.2-1.5 would mean "all power on 3-4 of 16 tokens"). Smoothing sets
how low H can go: a moving average over k tokens spreads each token's power over k tokens; on
synthetic gate streams (tokens of random difficulty, 12 layers) the lowest H over 8 tokens is
about 1.3 nats at k = 2 and 1.6 at k = 3 (floor 0.05), so the seed's k = 5 would put 1.5 out of
reach. k = 2 (this token and the previous one) is the lightest average that damps a single-token
spike. The floor (0.01 of the window's range) keeps KL finite while adding little entropy (0.05
adds ~0.5 nats to a window whose power sits on 2 tokens).
"""

from __future__ import annotations

import math

import numpy as np

WINDOW = 8  # tokens per entropy window (see the module docstring)
SMOOTH = 2  # causal moving-average width (this token and the previous one)
FLOOR = 0.01  # mass floor after min-max, in units of the window's range


def least_entropy(window: int = WINDOW, floor: float = FLOOR) -> float:
    """The lowest entropy (nats) :func:`distribution` can give a window of ``window`` tokens with ``floor``.

    Min-max puts every token's smoothed power in [0, 1], the lowest at 0 and the highest at 1 (equal powers give
    the uniform P, ln ``window``), and each token gets ``floor`` on top before the L1 normalisation. P is a
    linear-fractional map of those values, so the set of P is a polytope whose corners are k tokens at 1 and the
    others at 0, and the entropy, concave, is lowest at a corner: the least over k of k tokens holding
    (1 + floor) / Z each and ``window - k`` holding floor / Z. With k = 1 (all the power on one token), 8 tokens
    and the floor 0.01 it is 0.366 nats, not 0: the floor keeps every token's mass at 0.9 % or more.
    """
    ratio = floor / (1.0 + floor)  # a floor token's mass over a top token's, in [0, 1) (no overflow for a big floor)
    least = math.log(window)
    for k in range(1, window):
        z = k + (window - k) * ratio
        top, low = 1.0 / z, ratio / z
        h = -k * top * math.log(top) - ((window - k) * low * math.log(low) if low > 0 else 0.0)
        least = min(least, h)
    return least


def check_entropy_target(target: float, window: int = WINDOW, floor: float = FLOOR) -> None:
    """A target the windowed entropy can reach: finite, above :func:`least_entropy` (all the power on one token,
    the others at the floor: 0.366 nats over 8 tokens at the floor 0.01) and below ln ``window`` (a window of equal
    powers); past either bound the controller would drive tau to a bound and gating quietly stop (below: tau to its
    ceiling, as few FFN blocks run as the quality floor allows, whatever the text)."""
    most, least = math.log(window), least_entropy(window, floor)
    if not (math.isfinite(target) and least < target < most):
        raise ValueError(f"entropy_target must lie in ({least:.3f}, {most:.3f}) nats, the range a window of {window} "
                         f"tokens can hold (the lowest: all the power on one token, the rest at the floor {floor:g} of "
                         f"the window's range), got {target}; set it inside that range (the profiles use 1.5 on "
                         "boards, 1.2 on the host)")


def combine(peak: np.ndarray, ffn_norm: np.ndarray, cost: np.ndarray, weights: tuple[float, float, float],
            scales: tuple[float, float, float]) -> np.ndarray:
    """p_t = alpha*a_t/â + beta*f_t/f̂ + gamma*c_t/ĉ (same shapes in, same shape out)."""
    alpha, beta, gamma = weights
    sa, sf, sc = scales
    return alpha * peak / sa + beta * ffn_norm / sf + gamma * cost / sc


def trailing_sum(x: np.ndarray, width: int) -> np.ndarray:
    """Each position's value plus the ``width - 1`` values before it along the last axis (..., T) -> (..., T).

    Summed position by position, as :func:`edgesdk.power.vector.trailing_sum` is, not as a difference of running
    sums: that difference carries every earlier value, so one large power (or a NaN or inf) read anywhere before
    made every later sum 0 or NaN, not only the next ``width - 1``.
    """
    total = np.zeros_like(x)
    for shift in range(min(width, x.shape[-1])):
        total[..., shift:] += x[..., : x.shape[-1] - shift]
    return total


def smooth(p: np.ndarray, mask: np.ndarray, width: int = SMOOTH) -> np.ndarray:
    """Causal moving average over the valid tokens among the last ``width`` positions (the last
    ``width`` valid tokens where they are contiguous) along the last axis; 0 on padding."""
    valid = mask > 0
    p = np.where(valid, p, 0.0).astype(np.float64)
    total, count = trailing_sum(p, width), trailing_sum(valid.astype(np.float64), width)
    return np.where(valid, total / np.maximum(count, 1.0), 0.0)


def distribution(s: np.ndarray, mask: np.ndarray, floor: float = FLOOR) -> np.ndarray:
    """Min-max + floor + L1 normalisation over the valid entries of the last axis (one window)."""
    valid = mask > 0
    low = np.where(valid, s, np.inf).min(axis=-1, keepdims=True)
    top = np.where(valid, s, -np.inf).max(axis=-1, keepdims=True)
    span = top - low
    # equal powers: every entry 1, so P is uniform (ln W) whatever the floor; 0 gave P all 0 (H 0) at floor 0
    scaled = np.where(span > 1e-12, (s - low) / np.where(span > 1e-12, span, 1.0), 1.0)
    x = np.where(valid, scaled + floor, 0.0)
    total = x.sum(axis=-1, keepdims=True)
    return np.where(total > 0, x / np.where(total > 0, total, 1.0), 0.0)


def entropy(prob: np.ndarray) -> np.ndarray:
    """-sum P ln P over the last axis, in nats (0 ln 0 = 0)."""
    safe = np.where(prob > 0, prob, 1.0)
    return -(prob * np.log(safe)).sum(axis=-1)


def windowed(p: np.ndarray, mask: np.ndarray, window: int = WINDOW, width: int = SMOOTH,
             floor: float = FLOOR) -> tuple[np.ndarray, np.ndarray]:
    """(P, mask) cut into whole windows: p (..., T) -> (..., T // window, window)."""
    s = smooth(p, mask, width)
    n = (p.shape[-1] // window) * window
    shape = p.shape[:-1] + (n // window, window)
    s_w, m_w = s[..., :n].reshape(shape), mask[..., :n].reshape(shape)  # (..., T/W, W)
    return distribution(s_w, m_w, floor), m_w


def window_entropy(p: np.ndarray, window: int = WINDOW, width: int = SMOOTH, floor: float = FLOOR) -> float:
    """Entropy of the last ``window`` tokens of a stream of powers ``p`` (T,): what the runtime holds."""
    p = np.asarray(p, np.float64)
    if p.shape[-1] < window:
        raise ValueError(f"need at least {window} tokens of power history, got {p.shape[-1]}")
    s = smooth(p, np.ones_like(p), width)[-window:]
    return float(entropy(distribution(s, np.ones_like(s), floor)))
