"""Loss terms of power distillation: zero where they must be, positive otherwise; the stabilisers."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from edgesdk.power import losses, vector  # noqa: E402


def test_token_kl_is_zero_for_equal_logits_and_positive_otherwise():
    logits = torch.randn(2, 5, 11)
    assert torch.allclose(losses.token_kl(logits, logits), torch.zeros(2, 5), atol=1e-6)
    other = logits + torch.randn(2, 5, 11)
    kl = losses.token_kl(logits, other)
    assert torch.all(kl > 0)
    assert not torch.allclose(kl, losses.token_kl(other, logits))  # direction matters: KL(ungated || gated)


def test_power_kl_is_zero_for_equal_distributions_positive_otherwise_and_ignores_padding():
    torch.manual_seed(0)
    p = torch.rand(3, 24) + 0.1
    q = torch.rand(3, 24) + 0.1
    mask = torch.ones(3, 24)
    mask[1, 18:] = 0
    P, m = vector.windowed(p, mask)
    Q, _ = vector.windowed(q, mask)
    assert torch.allclose(vector.power_kl(P, P, m), torch.zeros(3, 3), atol=1e-9)
    kl = vector.power_kl(P, Q, m)
    # min-max maps any two valid tokens to (0, 1) or (1, 0): a window of two can hold the same P and Q
    assert torch.all(kl[m.sum(-1) > 2] > 0)
    assert torch.isfinite(kl).all()  # the floor keeps it finite where min-max gives a zero


def test_sqrt_clip_is_identity_below_half_continuous_and_smaller_above():
    kl = torch.tensor([0.0, 0.2, 0.5, 0.8, 4.0])
    clipped = losses.sqrt_clip(kl)
    assert torch.equal(clipped[:3], kl[:3])
    assert torch.all(clipped[3:] < kl[3:])
    assert clipped[3] == pytest.approx(math.sqrt(0.5 * 0.8))
    assert losses.sqrt_clip(torch.tensor(0.5 + 1e-6)) == pytest.approx(0.5, abs=1e-5)


def test_entropy_and_budget_terms_are_zero_on_target_and_within_budget():
    assert losses.entropy_term(torch.tensor(1.5), 1.5) == 0
    assert losses.entropy_term(torch.tensor(1.3), 1.5) > 0
    assert losses.entropy_term(torch.tensor(1.7), 1.5) > 0
    assert losses.budget_term(torch.tensor(0.5), 0.6) == 0
    assert losses.budget_term(torch.tensor(0.6), 0.6) == 0
    assert losses.budget_term(torch.tensor(0.7), 0.6) == pytest.approx(0.1)


def test_low_power_tokens_get_weight_point_three_and_padding_zero():
    p = torch.tensor([[1.0, 3.0, 2.0, 9.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])  # mean over valid = 3.75
    weights = losses.power_weights(p, mask)
    assert weights.tolist() == [[pytest.approx(0.3), pytest.approx(0.3), pytest.approx(0.3), 1.0, 0.0]]


def test_reweighting_multiplies_the_gradient_of_low_power_tokens_by_point_three():
    x = torch.ones(1, 4, requires_grad=True)
    p = torch.tensor([[1.0, 5.0, 1.0, 5.0]])
    (losses.power_weights(p, torch.ones(1, 4)) * x * 2).sum().backward()
    assert x.grad.tolist() == [[pytest.approx(0.6), 2.0, pytest.approx(0.6), 2.0]]


def test_entropy_weight_schedule_follows_the_seed():
    assert losses.entropy_weight(0.0) == 0.01
    assert losses.entropy_weight(0.19) == 0.01
    assert losses.entropy_weight(0.5) == pytest.approx(0.045)
    assert losses.entropy_weight(0.8) == 0.08
    assert losses.entropy_weight(1.0) == 0.08
    values = [losses.entropy_weight(i / 100) for i in range(101)]
    assert values == sorted(values)


def test_running_z_scales_the_gradient_by_the_detached_spread():
    z = losses.RunningZ(momentum=0.0, min_std=1e-6)  # statistics of the current batch only
    kl = torch.tensor([0.1, 0.3, 0.5, 0.7], requires_grad=True)
    out = z(kl)
    assert out.mean().item() == pytest.approx(0.0, abs=1e-6)
    out.sum().backward()
    std = float(torch.tensor([0.1, 0.3, 0.5, 0.7]).var())
    assert kl.grad.tolist() == pytest.approx([1 / math.sqrt(std)] * 4)
    floored = losses.RunningZ(min_std=0.05)
    assert floored(torch.zeros(3)).abs().max() == 0  # no 1/0 when the first KLs are all zero
