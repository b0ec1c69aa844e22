"""Power distillation: the loss of a training round does not depend on how its rollout is split into micro-batches
(the token KL is the rollout's mean, the power terms the means over the round's windows), nor do the running
z-score statistics of the per-sample KL."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.power import adapter, losses, train  # noqa: E402
from edgesdk.power.profiler import CostStats  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


def _round_log(rollout: int, micro_batch: int) -> dict:
    """The log of one training round of a tiny model whose adapters change it (a token KL well above 0), with only
    the token-KL term in the loss."""
    model = tiny_llama(layers=2)
    state = adapter.install_adapters(model, 4)
    with torch.no_grad():  # channel and head scales far from 1; the gate logit (last) kept, so every FFN runs
        for name, p in model.named_parameters():
            if ".power_adapter.proj2.bias" in name:
                p[:-1].add_(torch.randn(p.numel() - 1, generator=torch.Generator().manual_seed(1)) * 30)
    peak, ffn = train.calibrate_scales(model, state, torch.randint(0, 320, (2, 16),
                                                                    generator=torch.Generator().manual_seed(1)))
    info = train.PowerModelInfo((0.25, 0.5, 0.25), peak, ffn, 0.5, CostStats(16, [0.0, 0.2], {}, 0.0125, 0.0))
    config = train.PowerTrainConfig(rounds=1, rollout=rollout, micro_batch=micro_batch, prompt_tokens=8,
                                    new_tokens=8, zscore=False, weight_token_kl=1.0, weight_power_kl=0.0, weight_budget=0.0,
                                    entropy_start=0.0, entropy_end=0.0)
    pool = torch.randint(0, 320, (200,), generator=torch.Generator().manual_seed(0))
    return train.train_adapters(model, state, info, pool, config, eos_ids=[], pad_id=0).rounds[0]


def test_the_token_kl_term_is_the_rollouts_mean_whatever_the_micro_batch_size():
    """Each micro-batch's KL was summed over its sequences and the loss divided by the number of micro-batches:
    the KL term was micro_batch times the rollout's mean (2x at the default of 2, 4x in one micro-batch of 4),
    so its weight against the power, entropy and budget terms changed with the accumulation setting."""
    rounds = {micro: _round_log(4, micro) for micro in (1, 2, 4)}
    assert rounds[1]["token_kl"] > 0.01
    for micro in (2, 4):
        assert rounds[micro]["token_kl"] == pytest.approx(rounds[1]["token_kl"], rel=1e-3)
        assert rounds[micro]["loss"] == pytest.approx(rounds[1]["loss"], rel=1e-3)
    assert rounds[1]["loss"] == pytest.approx(rounds[1]["token_kl"], rel=1e-3)  # the mean, not a sum


def test_a_rollout_split_unevenly_weighs_every_sequence_alike():
    """A rollout of 3 in micro-batches of 2 (2 + 1): dividing each micro-batch's mean by the number of micro-batches
    gave the last sequence twice the weight of the others."""
    three = _round_log(3, 2)
    assert three["token_kl"] == pytest.approx(_round_log(3, 1)["token_kl"], rel=1e-3)
    assert three["loss"] == pytest.approx(three["token_kl"], rel=1e-3)


@pytest.mark.parametrize("size", [1, 2, 4])
def test_the_running_kl_statistics_are_the_same_whatever_the_micro_batch_size(size):
    """Eight KLs (fewer than the 10 samples of the average's window) fed in micro-batches of 8, 4, 2 or 1 stand for
    the same samples: their mean and sample spread. An average started from the first batch and moved by 0.1 per
    batch read 0.36 (micro-batches of 1) or 0.39 (of 2) for a mean of 0.46, and z-scored the next KL against it."""
    kls = torch.tensor([0.2, 0.5, 0.1, 0.9, 0.4, 0.3, 0.7, 0.6])
    whole, split = losses.RunningZ(), losses.RunningZ()
    whole(kls)
    for chunk in kls.split(size):
        split(chunk)
    assert split.mean == pytest.approx(float(kls.mean()))
    probe = torch.tensor([0.5])
    z = whole(probe)
    torch.testing.assert_close(split(probe), z)
    both = torch.cat([kls, probe])  # the statistics take in the sample they z-score
    torch.testing.assert_close(z, (probe - both.mean()) / both.std(), rtol=1e-4, atol=1e-6)


def test_the_running_kl_spread_after_two_single_samples_is_theirs():
    """Micro-batches of 1: the variance started at 0 (one sample) and moved by 0.1 toward the next deviation, so
    two KLs 0.1 apart read a spread of 0.032 (theirs: 0.071) and a mean of 0.31 (theirs: 0.35), and the second
    was z-scored 2.8 where it lies 0.71 of their spread above their mean."""
    z = losses.RunningZ()
    z(torch.tensor([0.3]))
    out = z(torch.tensor([0.4]))
    assert float(out) == pytest.approx(0.05 / float(torch.tensor([0.3, 0.4]).std()), rel=1e-5)


def _entropy_round(rollout: int, micro_batch: int) -> dict:
    """One round of fresh adapters (gated = ungated: token KL and power KL 0) with the entropy term alone."""
    model = tiny_llama(layers=2)
    state = adapter.install_adapters(model, 4)
    peak, ffn = train.calibrate_scales(model, state, torch.randint(0, 320, (2, 16),
                                                                    generator=torch.Generator().manual_seed(1)))
    info = train.PowerModelInfo((0.25, 0.5, 0.25), peak, ffn, 0.5, CostStats(4, [0.0, 0.2, 0.9, 1.0, 1.1], {},
                                                                              0.05, 0.0))
    config = train.PowerTrainConfig(rounds=1, rollout=rollout, micro_batch=micro_batch, prompt_tokens=8,
                                    new_tokens=16, weight_power_kl=0.0, weight_budget=0.0, entropy_start=1.0,
                                    entropy_end=1.0)
    pool = torch.randint(0, 320, (200,), generator=torch.Generator().manual_seed(0))
    return train.train_adapters(model, state, info, pool, config, eos_ids=[], pad_id=0).rounds[0]


def test_the_entropy_term_weighs_every_window_of_the_round_alike():
    """A rollout of 3 in micro-batches of 2: each micro-batch's mean over its windows, divided by the number of
    micro-batches, gave the last sequence's windows twice the weight of the others'."""
    one, two = _entropy_round(3, 1), _entropy_round(3, 2)
    assert one["entropy"] == pytest.approx(two["entropy"], rel=1e-4)
    assert one["loss"] == pytest.approx(two["loss"], rel=1e-3)
    assert _entropy_round(3, 3)["loss"] == pytest.approx(one["loss"], rel=1e-3)
