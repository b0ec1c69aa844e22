"""Perplexity of a bundle through its runtime, and of the PyTorch source model for reference.

Non-overlapping windows (context 512, stride 512, as DESIGN.md fixes): each window is scored
from an empty cache, and every token but the window's first is predicted. The same windows and
the same token ids go through both paths, so the two numbers compare like for like.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PerplexityConfig:
    context: int = 512  # tokens per window
    stride: int = 512  # window step; equal to context means non-overlapping windows
    max_chars: int | None = 200_000  # evaluate the first N characters of the text (DESIGN.md measure)

    def __post_init__(self):
        if self.context < 2 or self.stride < 1 or self.stride > self.context:
            raise ValueError(f"need context >= 2 and 1 <= stride <= context, got {self.context}/{self.stride}")


@dataclass(frozen=True)
class PerplexityResult:
    perplexity: float
    tokens_scored: int
    windows: int

    def to_json(self) -> dict:
        return {"perplexity": round(self.perplexity, 6), "tokens_scored": self.tokens_scored, "windows": self.windows}


def windows(ids: list[int], config: PerplexityConfig) -> list[tuple[int, int, int]]:
    """(start, end, first scored position within the window) for each window.

    With stride < context, the overlap is context already scored by the previous window.
    """
    spans, start, scored_until = [], 0, 1
    while start < len(ids) - 1:
        end = min(start + config.context, len(ids))
        spans.append((start, end, max(scored_until - start, 1)))
        scored_until = end
        if end == len(ids):
            break
        start += config.stride
    return spans


def _log_softmax_nll(logits: np.ndarray, targets: np.ndarray) -> float:
    logits = logits.astype(np.float64)
    peak = logits.max(axis=-1, keepdims=True)
    log_z = peak[:, 0] + np.log(np.exp(logits - peak).sum(axis=-1))
    return float((log_z - logits[np.arange(len(targets)), targets]).sum())


def perplexity(score_window, ids: list[int], config: PerplexityConfig, progress: bool = False) -> PerplexityResult:
    """Generic loop: ``score_window(window_ids) -> logits (len, vocab)`` for each window."""
    from tqdm import tqdm

    spans = windows(ids, config)
    nll, count = 0.0, 0
    for start, end, first in tqdm(spans, desc="perplexity", disable=not progress, unit="window"):
        window = np.asarray(ids[start:end], np.int64)
        logits = score_window(window)  # (T, V); row t predicts token t+1
        targets = window[first:]
        nll += _log_softmax_nll(logits[first - 1:-1], targets)
        count += len(targets)
    return PerplexityResult(math.exp(nll / count), count, len(spans))


def bundle_perplexity(runtime, text: str, config: PerplexityConfig = PerplexityConfig(),
                      progress: bool = False) -> PerplexityResult:
    """Perplexity through the bundle's own runtime backend."""
    ids = runtime.tokenizer.encode(text[: config.max_chars] if config.max_chars else text, add_special_tokens=False)
    backend = runtime.backend

    def score(window: np.ndarray) -> np.ndarray:
        backend.reset()
        return backend.prefill(window, keep_logits=len(window))

    return perplexity(score, ids, config, progress)


def reference_perplexity(model, tokenizer_encode, text: str, config: PerplexityConfig = PerplexityConfig(),
                         progress: bool = False) -> PerplexityResult:
    """The same measure with the PyTorch model (host only)."""
    import torch

    ids = tokenizer_encode(text[: config.max_chars] if config.max_chars else text)

    def score(window: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model(torch.from_numpy(window)[None], use_cache=False).logits[0].numpy()

    return perplexity(score, ids, config, progress)
