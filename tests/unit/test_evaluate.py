"""Perplexity windows against a brute-force count on a tiny random model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgesdk.evaluate import PerplexityConfig, perplexity, windows

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def model():
    from tests._utils.tiny import tiny_llama

    torch.set_num_threads(1)
    return tiny_llama(layers=1, hidden=32, vocab_size=64)


def score(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(ids, np.int64))[None], use_cache=False).logits[0].double().numpy()


def brute_force(model, ids: list[int], context: int, stride: int) -> tuple[float, int]:
    """Token i is scored once, in the first window (starts 0, stride, 2 stride ...) that reaches it,
    with the left context from that window's start: one forward pass per token."""
    nll, count = 0.0, 0
    for i in range(1, len(ids)):
        start = max(0, (i - context) // stride + 1) * stride
        if start == i:  # a window's first token has no left context: never predicted
            continue
        logits = score(model, ids[start: i + 1])[-2]
        nll += np.logaddexp.reduce(logits) - logits[ids[i]]
        count += 1
    return math.exp(nll / count), count


@pytest.mark.parametrize(("length", "context", "stride"), [
    (37, 8, 8), (37, 8, 3), (37, 8, 5), (37, 8, 1), (37, 2, 1), (37, 2, 2), (33, 8, 8), (32, 8, 8),
    (5, 8, 8), (5, 8, 3), (2, 8, 8),
])
def test_windows_score_each_token_once_with_its_left_context(model, length, context, stride):
    ids = np.random.default_rng(length * 100 + context * 10 + stride).integers(0, 64, length).tolist()
    expected, count = brute_force(model, ids, context, stride)
    result = perplexity(lambda window: score(model, window), ids, PerplexityConfig(context, stride))
    assert result.tokens_scored == count
    assert result.perplexity == pytest.approx(expected, rel=1e-6)
    assert all(end - start <= context for start, end, _ in windows(ids, PerplexityConfig(context, stride)))


def test_a_loss_past_float_range_gives_infinite_perplexity():
    """A broken bundle's logits can put the mean loss past 709.8 nats, where math.exp overflowed."""
    def wild(window: np.ndarray) -> np.ndarray:
        logits = np.zeros((len(window), 8), np.float32)
        logits[:, 7] = 1e4  # every token is scored against a logit 1e4 above its own
        return logits

    result = perplexity(wild, [1, 2, 3, 4, 5], PerplexityConfig(4, 4))
    assert result.perplexity == math.inf
    assert result.tokens_scored == 3
    assert math.isnan(perplexity(lambda window: wild(window) * np.nan, [1, 2, 3], PerplexityConfig(4, 4)).perplexity)
