"""Evaluation review 46: perplexity's uncertainty, as llama-perplexity prints it ("Final estimate: PPL = X +/- Y",
perplexity() in tools/perplexity/perplexity.cpp): the perplexity times sqrt(var / (n - 1)), var the population
variance of the n scored tokens' negative log-likelihoods, no estimate where var is not positive. eval printed and
returned the perplexity alone, so two bundles' figures could not be told apart from noise."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from edgesdk.evaluate import LLAMA_PERPLEXITY, PerplexityConfig, perplexity
from tests.unit.test_cli import assert_ok, invoke


def _llama_perplexity_estimate(losses: list[float]) -> tuple[float, float | None]:
    """llama-perplexity's last lines written out: sums of nll and nll^2, then PPL and nll2 * PPL."""
    count, nll, nll2 = len(losses), sum(losses), sum(x * x for x in losses)
    nll2, nll = nll2 / count, nll / count
    ppl = math.exp(nll)
    nll2 -= nll * nll
    return ppl, (math.sqrt(nll2 / (count - 1)) * ppl if nll2 > 0 else None)


def _scorer(vocab: int = 17, seed: int = 3):
    """``score(window) -> logits``: a fixed function of the window's tokens (a causal toy model: row t depends on
    tokens 0..t only)."""
    table = np.random.default_rng(seed).normal(size=(vocab, vocab)) * 2.0

    def score(window: np.ndarray) -> np.ndarray:
        return np.cumsum(table[window], axis=0) / np.arange(1, len(window) + 1)[:, None]

    return score


def _losses_by_hand(score, ids: list[int], spans) -> list[float]:
    losses = []
    for start, end, first in spans:
        window = np.asarray(ids[start:end])
        logits = score(window).astype(np.float64)
        for t in range(first, len(window)):
            row = logits[t - 1]
            losses.append(float(np.log(np.exp(row - row.max()).sum()) + row.max() - row[window[t]]))
    return losses


@pytest.mark.parametrize("config", [PerplexityConfig(context=16, stride=16),
                                    PerplexityConfig(context=16, stride=16, method=LLAMA_PERPLEXITY),
                                    PerplexityConfig(context=12, stride=5)])
def test_the_perplexity_comes_with_llama_perplexity_s_uncertainty(config):
    from edgesdk.evaluate import windows

    ids = [int(i) for i in np.random.default_rng(0).integers(0, 17, size=100)]
    score = _scorer()
    result = perplexity(score, ids, config)
    ppl, uncertainty = _llama_perplexity_estimate(_losses_by_hand(score, ids, windows(ids, config)))
    assert result.perplexity == pytest.approx(ppl, rel=1e-9)
    assert result.uncertainty == pytest.approx(uncertainty, rel=1e-6)
    assert 0 < result.uncertainty < result.perplexity
    assert result.to_json()["perplexity_uncertainty"] == round(result.uncertainty, 6)


def test_no_estimate_where_the_losses_do_not_vary():
    """One token scored (or every loss equal): llama-perplexity prints no estimate; the figure is None (JSON null)."""
    one = perplexity(_scorer(), [1, 2], PerplexityConfig(context=16, stride=16))
    assert one.tokens_scored == 1
    assert one.uncertainty is None
    assert one.to_json()["perplexity_uncertainty"] is None
    flat = perplexity(lambda window: np.zeros((len(window), 5)), [0, 1, 2, 3, 4, 0, 1],
                      PerplexityConfig(context=4, stride=4))
    assert flat.perplexity == pytest.approx(5.0)
    assert flat.uncertainty is None


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    from tests._utils.tiny import CORPUS

    path = tmp_path_factory.mktemp("eval46") / "text.txt"
    path.write_text(" ".join(CORPUS[:20]))
    return path


def test_eval_prints_and_returns_the_uncertainty_of_both_figures(tiny_bundle, text_file):
    pytest.importorskip("torch")
    from edgesdk.evaluate import _scored_ids, bundle_scorer, windows
    from edgesdk.runtime.session import open_runtime

    args = ("eval", tiny_bundle.path, "--text", text_file, "--context", 32, "--reference")
    found = invoke(*args, "--json")
    assert_ok(found)
    data = json.loads(found.stdout)
    runtime = open_runtime(tiny_bundle.path, threads=1)
    config = PerplexityConfig(context=32, stride=32)
    ids = _scored_ids(runtime, text_file.read_text(), config)
    ppl, uncertainty = _llama_perplexity_estimate(_losses_by_hand(bundle_scorer(runtime), ids, windows(ids, config)))
    assert data["bundle"]["perplexity"] == pytest.approx(ppl, rel=1e-6)
    assert data["bundle"]["perplexity_uncertainty"] == pytest.approx(uncertainty, rel=1e-4)
    assert data["reference"]["perplexity_uncertainty"] == pytest.approx(uncertainty, rel=1e-3)

    result = invoke(*args)
    assert_ok(result)
    lines = result.stdout.splitlines()  # another run: the figures to the printed digits, not the JSON's strings
    bundle = re.fullmatch(r"bundle perplexity    (\d+\.\d{4}) ± (\d+\.\d{4}) \(\d+ tokens, \d+ windows\)", lines[0])
    reference = re.fullmatch(r"reference \(PyTorch\)  (\d+\.\d{4}) ± (\d+\.\d{4})", lines[1])
    assert bundle, lines[0]
    assert reference, lines[1]
    for match, key in ((bundle, "bundle"), (reference, "reference")):
        assert float(match[1]) == pytest.approx(data[key]["perplexity"], rel=1e-6)
        assert float(match[2]) == pytest.approx(data[key]["perplexity_uncertainty"], rel=1e-4)


# PerplexityConfig's stride defaulted to 512 whatever the context: PerplexityConfig(context=256) was refused
# ("1 <= stride <= context, got 256/512"), PerplexityConfig(context=1024) overlapped its windows by half (stride 512,
# not the non-overlapping windows eval and DESIGN.md measure), and PerplexityConfig(context=256,
# method="llama-perplexity"), which has no stride at all, was refused for the stride nobody set.


@pytest.mark.parametrize("context", [32, 256, 1024])
def test_a_context_alone_gives_non_overlapping_windows(context):
    from edgesdk.evaluate import windows

    config = PerplexityConfig(context=context)
    assert config.stride == context
    ids = list(range(3 * context + 5))
    assert [(start, end) for start, end, _ in windows(ids, config)] == [
        (0, context), (context, 2 * context), (2 * context, 3 * context), (3 * context, 3 * context + 5)]
    assert all(first == 1 for _, _, first in windows(ids, config))


@pytest.mark.parametrize("context", [32, 1024])
def test_llama_perplexity_takes_a_context_without_a_stride(context):
    from edgesdk.evaluate import windows

    config = PerplexityConfig(context=context, method=LLAMA_PERPLEXITY)
    assert windows(list(range(2 * context + 3)), config) == [(0, context, context // 2 + 1),
                                                               (context, 2 * context, context // 2 + 1)]
    with pytest.raises(ValueError, match="no stride; got stride 16 for context 32"):
        PerplexityConfig(context=32, stride=16, method=LLAMA_PERPLEXITY)  # one given explicitly is still refused


def test_a_stride_given_is_kept():
    assert PerplexityConfig().stride == 512
    assert PerplexityConfig(context=64, stride=16).stride == 16
    with pytest.raises(ValueError, match=r"stride 128 is outside 1 \.\. 64 \(the context\)"):
        PerplexityConfig(context=64, stride=128)
