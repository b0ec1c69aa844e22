"""``edgesdk.evaluate.divergence``: KL(P_reference || P_bundle) per token and top-token agreement."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.evaluate import PerplexityConfig, bundle_perplexity, bundle_scorer, divergence, reference_scorer


def constant_scorer(row: np.ndarray):
    return lambda window: np.tile(row, (len(window), 1))


def test_kl_of_known_distributions():
    p = np.array([0.5, 0.25, 0.25])
    q = np.array([0.25, 0.5, 0.25])
    ids = list(range(3)) * 10
    result = divergence(constant_scorer(np.log(q)), constant_scorer(np.log(p) + 7.0), ids,
                        PerplexityConfig(context=8, stride=8))
    expected = float((p * np.log(p / q)).sum())  # the reference is P, the bundle Q
    assert result.mean_kld == pytest.approx(expected, rel=1e-12)
    assert result.max_kld == pytest.approx(expected, rel=1e-12)
    assert result.same_top_token == 0.0  # P's top is token 0, Q's token 1
    same = divergence(constant_scorer(np.log(p)), constant_scorer(np.log(p) - 3.0), ids,
                      PerplexityConfig(context=8, stride=8))
    assert same.mean_kld == pytest.approx(0.0, abs=1e-15)
    assert same.same_top_token == 1.0


def test_divergence_scores_the_tokens_perplexity_scores(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(tiny_bundle.path, threads=1)
    text = "The quick brown fox jumps over the lazy dog. " * 20
    config = PerplexityConfig(context=32, stride=24, max_chars=None)
    ids = runtime.tokenizer.encode(text, add_special_tokens=False)
    result = divergence(bundle_scorer(runtime), bundle_scorer(runtime), ids, config)
    assert result.tokens_scored == bundle_perplexity(runtime, text, config).tokens_scored
    assert result.mean_kld == pytest.approx(0.0, abs=1e-12)


def test_float_bundle_is_close_to_its_pytorch_model(tiny_bundle, tiny_model_dir):
    """The host bundle keeps float32 weights: its distributions match the source model's."""
    from transformers import AutoModelForCausalLM

    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(tiny_bundle.path, threads=1)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    ids = runtime.tokenizer.encode("Grouped-query attention shares key and value heads. " * 6,
                                   add_special_tokens=False)
    result = divergence(bundle_scorer(runtime), reference_scorer(model), ids, PerplexityConfig(context=40, stride=40))
    assert result.mean_kld < 1e-6
    assert result.same_top_token == 1.0
    # A bundle that drifts (a tenth of a logit's noise per vocabulary entry) is seen at once.
    rng = np.random.default_rng(1)
    plain = bundle_scorer(runtime)
    drifted = divergence(lambda w: plain(w) + rng.normal(0, 0.1, (len(w), plain(w).shape[1])),
                         reference_scorer(model), ids, PerplexityConfig(context=40, stride=40))
    assert drifted.mean_kld > 100 * max(result.mean_kld, 1e-9)


def test_mismatched_vocabularies_and_short_texts_are_refused():
    config = PerplexityConfig(context=8, stride=8)
    with pytest.raises(EdgeSDKError, match="shape"):
        divergence(constant_scorer(np.zeros(3)), constant_scorer(np.zeros(4)), [0, 1, 2, 1], config)
    with pytest.raises(EdgeSDKError, match="at least 2"):
        divergence(constant_scorer(np.zeros(3)), constant_scorer(np.zeros(3)), [1], config)


def test_eval_command_reports_the_divergence(tiny_bundle, tmp_path):
    import json

    from click.testing import CliRunner

    from edgesdk.cli import main

    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 30, encoding="utf-8")
    args = ["eval", str(tiny_bundle.path), "--text", str(text), "--context", "64", "--threads", "1"]
    result = CliRunner().invoke(main, [*args, "--reference", "--kl-divergence", "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["divergence"]["tokens_scored"] == body["bundle"]["tokens_scored"]
    assert body["divergence"]["mean_kld"] < 1e-6  # the host bundle keeps float32 weights
    assert body["divergence"]["same_top_token"] == 1.0
    shown = CliRunner().invoke(main, [*args, "--reference", "--kl-divergence"])
    assert shown.exit_code == 0, shown.output
    d = body["divergence"]
    assert f"mean KLD {d['mean_kld']:.6f} ± {d['mean_kld_uncertainty']:.6f} nats" in shown.stdout
    assert f"PPL(Q)/PPL(base) {d['ppl_ratio']:.6f} ± {d['ppl_ratio_uncertainty']:.6f}" in shown.stdout
    assert f"RMS Δp {d['rms_dp']:.3%} ± {d['rms_dp_uncertainty']:.3%}" in shown.stdout
    alone = CliRunner().invoke(main, [*args, "--kl-divergence"])
    assert alone.exit_code == 2
    assert "add --reference" in alone.output
