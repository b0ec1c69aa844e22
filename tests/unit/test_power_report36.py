"""A power-gated bundle's report plots the power distribution of a sample text and the quality / compute curve
(issue: "the bundle report plots the power distribution of a sample text and the quality/speed curve"): the power
stage measures both on the held-out tokens, the manifest keeps them, report.md tabulates them and report.png draws
them."""

from __future__ import annotations

import math

import pytest

from edgesdk.power.distribution import WINDOW
from edgesdk.power.stage import CURVE_TAUS, SAMPLE_TOKENS
from tests.unit.test_power_export import power_bundle  # noqa: F401  (the module's fixture)


def test_the_power_stage_records_a_sample_s_distribution_and_a_curve(power_bundle):  # noqa: F811
    metrics = power_bundle.manifest["stages"][0]["metrics"]
    curve = metrics["curve"]
    assert [point["tau"] for point in curve] == sorted({0.0, 0.5, *CURVE_TAUS})
    assert curve[0] == metrics["heldout"]["every_ffn"]  # the points measured already are not measured again
    # gating off is the loaded model: the baseline's figure on the same held-out tokens
    baseline = power_bundle.manifest["baseline"]["heldout_perplexity"]
    assert metrics["heldout"]["gating_off"]["perplexity"] == pytest.approx(baseline, rel=1e-4)
    assert metrics["heldout_perplexity"] == metrics["heldout"]["gating_off"]["perplexity"]
    assert metrics["heldout"]["at_tau_train"] in curve
    assert all(0.0 <= point["executed_fraction"] <= 1.0 for point in curve)
    fractions = [point["executed_fraction"] for point in curve]
    assert fractions == sorted(fractions, reverse=True)  # a higher threshold skips at least as many blocks
    sample = metrics["sample_power"]
    assert sample["window"] == WINDOW
    assert len(sample["p"]) == len(sample["P"]) == SAMPLE_TOKENS
    assert len(sample["entropy"]) == SAMPLE_TOKENS // WINDOW
    for start in range(0, SAMPLE_TOKENS, WINDOW):  # each window's P is a distribution, its entropy that of P
        window = sample["P"][start:start + WINDOW]
        assert sum(window) == pytest.approx(1.0, abs=1e-3)
        entropy = -sum(p * math.log(p) for p in window if p > 0)
        assert sample["entropy"][start // WINDOW] == pytest.approx(entropy, abs=2e-3)
        assert 0.0 < entropy <= math.log(WINDOW) + 1e-6


def test_the_report_tabulates_and_plots_them(power_bundle):  # noqa: F811
    pytest.importorskip("matplotlib")
    from PIL import Image

    metrics = power_bundle.manifest["stages"][0]["metrics"]
    report = (power_bundle.path / "report.md").read_text()
    assert "| gate threshold tau | FFN blocks run | held-out perplexity |" in report
    for point in metrics["curve"]:
        assert f"| {point['tau']:g} | {point['executed_fraction']:.1%} | {point['perplexity']:.3f} |" in report
    entropy = metrics["sample_power"]["entropy"]
    assert (f"Power distribution of the first {SAMPLE_TOKENS} held-out tokens (every FFN running): entropy per "
            f"window of {WINDOW} tokens {min(entropy):.3f} to {max(entropy):.3f} nats") in report
    width, height = Image.open(power_bundle.path / "report.png").size
    assert height > width / 2  # two rows of panels: the stages, and the power distribution with the curve


def test_a_diverged_model_s_heldout_perplexity_is_inf_not_an_overflow():
    """A stage whose model diverged (a mean loss past 709.8 nats) raised OverflowError in math.exp, ending the build;
    the figure is inf, which the report shows as 'not finite' and the manifest as null."""
    import torch

    from edgesdk.compress.measure import heldout_perplexity
    from tests._utils.tiny import tiny_llama

    model = tiny_llama().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(1e6)  # logits of order 1e6: the wrong tokens lose by far more than 709.8 nats
    ids = torch.randint(0, model.config.vocab_size, (64,), generator=torch.Generator().manual_seed(0))
    assert heldout_perplexity(model, ids, 32) == math.inf
