"""``edgesdk eval --reference --kl-divergence`` against llama.cpp's ``llama-perplexity --kl-divergence``
(``kl_divergence()`` in tools/perplexity/perplexity.cpp): the statistics it prints, computed here from both
models' logits with its accumulations written out (sums of values and of their squares, its
``mean_and_uncertainty``, ``covariance`` and ``percentile``), for an INT8 bundle against its float32 source."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from edgesdk.evaluate import PerplexityConfig, divergence
from tests._utils.builds import build_tiny_bundle
from tests._utils.tiny import CORPUS
from tests.unit.test_cli import invoke

torch = pytest.importorskip("torch")

INT8 = "name: q\nstages: []\nexport: {form: ort-fused, weights: int8}\n"
TEXT = " ".join(CORPUS[:40])  # a few hundred tokens: over 100 scored under --context 32, as llama.cpp asks
CONTEXT = 32


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Llama with weights large enough (init range 0.2, untied head) for peaked next-token
    distributions, which INT8 weights move measurably."""
    from tests._utils.tiny import save_tiny_model_dir

    return save_tiny_model_dir(tmp_path_factory.mktemp("peaked") / "model", tie=False,
                               config_overrides={"initializer_range": 0.2})


@pytest.fixture(scope="module")
def int8_bundle(model_dir, tmp_path_factory):
    return build_tiny_bundle(tmp_path_factory.mktemp("int8-host"), INT8, "host", model_dir=model_dir)


@pytest.fixture(scope="module")
def int8_runtime(int8_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(int8_bundle.path, threads=1)


@pytest.fixture(scope="module")
def source_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


def _log_softmax(row: np.ndarray) -> np.ndarray:
    row = row.astype(np.float64)
    shifted = row - row.max()
    return shifted - math.log(np.exp(shifted).sum())


def _llama_cpp_statistics(rows_q: list[np.ndarray], rows_base: list[np.ndarray], targets: list[int]) -> dict:
    """kl_divergence()'s per-token sums and final figures, token by token as its loop takes them."""
    s = dict.fromkeys(["nll", "nll2", "base", "base2", "nll_base", "kld", "kld2", "dp", "dp2", "dp4"], 0.0)
    klds, dps, same = [], [], 0
    for q_row, base_row, token in zip(rows_q, rows_base, targets, strict=True):
        log_q, log_base = _log_softmax(q_row), _log_softmax(base_row)
        nll, nll_base = -log_q[token], -log_base[token]
        kld = sum(math.exp(b) * (b - q) for b, q in zip(log_base, log_q, strict=True))
        dp = math.exp(-nll) - math.exp(-nll_base)
        for key, value in (("nll", nll), ("nll2", nll * nll), ("base", nll_base), ("base2", nll_base * nll_base),
                           ("nll_base", nll * nll_base), ("kld", kld), ("kld2", kld * kld), ("dp", dp),
                           ("dp2", dp * dp), ("dp4", dp ** 4)):
            s[key] += value
        same += int(np.argmax(q_row) == np.argmax(base_row))
        klds.append(kld)
        dps.append(dp)
    n = len(targets)

    def mean_and_uncertainty(total, total2):
        f = total / n
        df = total2 / n - f * f
        return f, (math.sqrt(df / (n - 1)) if df > 0 and n > 10 else 0.0)

    def percentile(values, fraction):
        p = fraction * (len(values) - 1)
        ip = int(p)
        p -= ip
        return (1 - p) * values[ip] + p * values[min(ip + 1, len(values) - 1)]

    def median(values):
        half = len(values) // 2
        return 0.5 * (values[half] + values[half - 1]) if len(values) % 2 == 0 else values[half]

    klds, dps = sorted(klds), sorted(dps)
    log_ppl, log_ppl_unc = mean_and_uncertainty(s["nll"], s["nll2"])
    log_base, log_base_unc = mean_and_uncertainty(s["base"], s["base2"])
    cov = (s["nll_base"] / n - (s["nll"] / n) * (s["base"] / n)) / (n - 1)
    ppl, ppl_base = math.exp(log_ppl), math.exp(log_base)
    ln_ratio_unc = math.sqrt(log_ppl_unc ** 2 + log_base_unc ** 2 - 2 * cov)
    kld, kld_unc = mean_and_uncertainty(s["kld"], s["kld2"])
    mean_dp, mean_dp_unc = mean_and_uncertainty(s["dp"], s["dp2"])
    mse, mse_unc = mean_and_uncertainty(s["dp2"], s["dp4"])
    same_top = same / n
    return {
        "tokens_scored": n, "ppl": ppl, "ppl_uncertainty": ppl * log_ppl_unc,
        "ppl_reference": ppl_base, "ppl_reference_uncertainty": ppl_base * log_base_unc,
        "ppl_correlation": cov / (log_ppl_unc * log_base_unc),
        "ln_ppl_ratio": log_ppl - log_base, "ln_ppl_ratio_uncertainty": ln_ratio_unc,
        "ppl_ratio": math.exp(log_ppl - log_base), "ppl_ratio_uncertainty": math.exp(log_ppl - log_base) * ln_ratio_unc,
        "ppl_difference": ppl - ppl_base,
        "ppl_difference_uncertainty": math.sqrt((ppl * log_ppl_unc) ** 2 + (ppl_base * log_base_unc) ** 2
                                                - 2 * ppl * ppl_base * cov),
        "mean_kld": kld, "mean_kld_uncertainty": kld_unc, "max_kld": klds[-1], "min_kld": klds[0],
        "median_kld": median(klds), "p99_kld": percentile(klds, 0.99),
        "kld_percentiles": {f"{q:.1f}": percentile(klds, q / 100) for q in (99.9, 99, 95, 90, 10, 5, 1, 0.1)},
        "mean_dp": mean_dp, "mean_dp_uncertainty": mean_dp_unc,
        "dp_percentiles": {"max": dps[-1], **{f"{q:.1f}": percentile(dps, q / 100)
                                              for q in (99.9, 99, 95, 90, 75)},
                           "50.0": median(dps), **{f"{q:.1f}": percentile(dps, q / 100) for q in (25, 10, 5, 1, 0.1)},
                           "min": dps[0]},
        "rms_dp": math.sqrt(mse), "rms_dp_uncertainty": 0.5 / math.sqrt(mse) * mse_unc,
        "same_top_token": same_top, "same_top_token_uncertainty": math.sqrt(same_top * (1 - same_top) / (n - 1)),
    }


def _logits(runtime, model, chunk: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(bundle, source model) logits of every position of ``chunk``, each from an empty cache."""
    window = np.asarray(chunk, np.int64)
    runtime.backend.reset()
    ours = runtime.backend.prefill(window, keep_logits=len(window))
    with torch.no_grad():
        theirs = model(torch.from_numpy(window)[None], use_cache=False).logits[0].float().numpy()
    return ours, theirs


def _by_hand_llama_perplexity_positions(runtime, model, ids: list[int], n_ctx: int) -> dict:
    """llama.cpp's chunks (len // n_ctx, the tail dropped; no BOS here: the tiny tokenizer adds none) and its
    positions: the logits at n_ctx/2 .. n_ctx-2 against the tokens after them."""
    first, rows_q, rows_base, targets = n_ctx // 2, [], [], []
    for i in range(len(ids) // n_ctx):
        chunk = ids[i * n_ctx:(i + 1) * n_ctx]
        ours, theirs = _logits(runtime, model, chunk)
        for j in range(first, n_ctx - 1):
            rows_q.append(ours[j])
            rows_base.append(theirs[j])
            targets.append(chunk[j + 1])
    return _llama_cpp_statistics(rows_q, rows_base, targets)


def _assert_same(found: dict, expected: dict, abs_tol: float):
    for key, value in expected.items():
        if isinstance(value, dict):
            assert list(found[key]) == list(value), key
            _assert_same(found[key], value, abs_tol)
        else:
            assert found[key] == pytest.approx(value, rel=1e-6, abs=abs_tol), key


def test_eval_kl_divergence_prints_llama_cpp_s_statistics(int8_bundle, int8_runtime, source_model, tmp_path):
    """The command's --json against llama.cpp's figures computed from the INT8 bundle's and the float32
    source model's logits at llama-perplexity's positions."""
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")  # no trailing newline: llama-perplexity's -f reads it as it is
    ids = int8_runtime.tokenizer.encode(TEXT, add_special_tokens=False)
    expected = _by_hand_llama_perplexity_positions(int8_runtime, source_model, ids, CONTEXT)
    assert expected["tokens_scored"] == len(ids) // CONTEXT * (CONTEXT - CONTEXT // 2 - 1) >= 100
    assert expected["mean_kld"] > 0  # the INT8 weights move the distributions
    assert expected["same_top_token"] < 1

    result = invoke("eval", int8_bundle.path, "--text", text, "--method", "llama-perplexity", "--context", CONTEXT,
                    "--max-chars", 0, "--reference", "--kl-divergence", "--json", "--threads", 1)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    _assert_same(report["divergence"], expected, abs_tol=1e-6)  # --json rounds to 6 decimals
    # llama.cpp's Mean PPL(Q) and PPL(base) are the perplexities the command reports for the same tokens.
    assert report["divergence"]["ppl"] == pytest.approx(report["bundle"]["perplexity"], rel=1e-6)
    assert report["divergence"]["ppl_reference"] == pytest.approx(report["reference"]["perplexity"], rel=1e-6)
    assert report["divergence"]["ppl_ratio"] == pytest.approx(1 + report["relative_difference"], rel=1e-6)


def test_the_library_s_statistics_under_the_windows_method(int8_runtime, source_model):
    """Overlapping windows (stride < context): every token from the first not yet scored, at full precision."""
    from edgesdk.evaluate import bundle_scorer, reference_scorer

    ids = int8_runtime.tokenizer.encode(TEXT, add_special_tokens=False)[:150]
    config = PerplexityConfig(context=48, stride=32)
    result = divergence(bundle_scorer(int8_runtime), reference_scorer(source_model), ids, config)
    rows_q, rows_base, targets, scored_until = [], [], [], 1
    for start in range(0, len(ids), 32):  # windows 0-48, 32-80, ...: each scores past the previous one's end
        chunk = ids[start:start + 48]
        ours, theirs = _logits(int8_runtime, source_model, chunk)
        for j in range(max(scored_until - start, 1), len(chunk)):
            rows_q.append(ours[j - 1])
            rows_base.append(theirs[j - 1])
            targets.append(chunk[j])
        scored_until = start + len(chunk)
        if scored_until == len(ids):
            break
    assert len(targets) == len(ids) - 1
    _assert_same(vars(result), _llama_cpp_statistics(rows_q, rows_base, targets), abs_tol=1e-12)


def test_a_token_the_reference_rules_out_adds_nothing_to_the_kl_divergence():
    """A reference logit of -inf (probability 0) is 0 ln 0 = 0 in the sum, as llama.cpp leaves such tokens
    out of it; the statistics were NaN."""
    p = np.array([0.5, 0.5, 0.0])
    q = np.array([0.25, 0.5, 0.25])
    with np.errstate(divide="ignore"):
        log_p = np.log(p)

    def reference(window):
        return np.tile(log_p, (len(window), 1))

    def bundle(window):
        return np.tile(np.log(q), (len(window), 1))

    result = divergence(bundle, reference, [0, 1] * 10, PerplexityConfig(context=8, stride=8))
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.5)
    assert result.mean_kld == pytest.approx(expected, rel=1e-12)
    assert result.max_kld == pytest.approx(expected, rel=1e-12)
    assert result.mean_kld_uncertainty == 0.0  # every token alike
    broken = divergence(bundle, lambda window: np.full((len(window), 3), np.nan), [0, 1] * 10,
                        PerplexityConfig(context=8, stride=8))
    assert math.isnan(broken.mean_kld)  # a NaN reference is not a probability of 0


def test_a_text_of_a_few_tokens_gives_strict_json(runtime, tiny_bundle, tmp_path):
    """Under 11 scored tokens llama.cpp's uncertainties are 0; the same-top uncertainty of one token (n - 1 = 0)
    and a correlation without spread have no value: --json writes null, never NaN."""
    text = tmp_path / "short.txt"
    text.write_text("The.", encoding="utf-8")
    assert len(runtime.tokenizer.encode("The.", add_special_tokens=False)) == 2
    result = invoke("eval", tiny_bundle.path, "--text", text, "--context", 64, "--reference", "--kl-divergence",
                    "--json", "--threads", 1)
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)["divergence"]
    assert found["tokens_scored"] == 1
    assert found["mean_kld_uncertainty"] == found["ppl_uncertainty"] == found["ln_ppl_ratio_uncertainty"] == 0.0
    assert found["same_top_token_uncertainty"] is None
    assert found["ppl_correlation"] is None
