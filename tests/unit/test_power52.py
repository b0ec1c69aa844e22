"""Power distillation: the training-side power distribution of a float32 power reads as the board's (numpy,
float64) distribution does, and the power KL of a zero-probability proxy token is 0, not NaN."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgesdk.power import distribution as D  # noqa: E402
from edgesdk.power import vector  # noqa: E402


@pytest.mark.parametrize("level", [0.1, 0.3, 1.7])
def test_a_constant_float32_power_gives_every_window_the_uniform_entropy_as_on_the_board(level):
    """Training holds powers in float32: the moving average taken as a difference of running sums carried the
    rounding of the whole prefix, and min-max stretched it over the window (0.84 nats instead of ln 8)."""
    p = torch.full((2, 96), level, dtype=torch.float32)  # (B, T)
    mask = torch.ones_like(p)
    prob, _ = vector.windowed(p, mask)  # (B, 12, 8)
    board, _ = D.windowed(p.double().numpy(), mask.double().numpy())
    np.testing.assert_allclose(D.entropy(board), math.log(D.WINDOW), atol=1e-9)
    np.testing.assert_allclose(vector.entropy(prob).numpy(), math.log(D.WINDOW), atol=1e-5)


def test_a_nearly_flat_float32_window_late_in_a_sequence_is_the_boards_distribution():
    generator = np.random.default_rng(0)
    p = 3.0 + 1e-3 * generator.random((2, 256))  # (B, T): a spread of a thousandth on a level of 3
    mask = np.ones_like(p)
    mask[1, 250:] = 0  # a padded tail
    ours, _ = vector.windowed(torch.from_numpy(p).float(), torch.from_numpy(mask).float())
    board, _ = D.windowed(p.astype(np.float32).astype(np.float64), mask)
    np.testing.assert_allclose(ours.numpy(), board, atol=2e-3)
    np.testing.assert_allclose(vector.entropy(ours).numpy(), D.entropy(board), atol=2e-3)


def test_the_power_kl_of_windows_without_a_floor_counts_a_zero_mass_token_as_zero_not_nan():
    """At a floor of 0 min-max gives each window's lowest token no mass: 0 * ln 0 made the KL and its gradient NaN."""
    p = torch.tensor([[0.1, 0.5, 0.3, 0.9, 0.2, 0.4, 0.8, 0.6] * 2], requires_grad=True)  # (1, 16)
    mask = torch.ones_like(p)
    proxy, window_mask = vector.windowed(p, mask, floor=0.0)  # (1, 2, 8)
    student, _ = vector.windowed(3.0 * p.detach() + 1.0, mask, floor=0.0)  # the same distribution (min-max)
    assert ((proxy == 0).sum(-1) >= 1).all()  # each window's lowest token(s)
    kl = vector.power_kl(proxy, student, window_mask)
    np.testing.assert_allclose(kl.detach().numpy(), 0.0, atol=1e-6)
    kl.sum().backward()
    assert torch.isfinite(p.grad).all()
    other, _ = vector.windowed(p.detach().flip(-1), mask, floor=0.0)  # mass where the student has none: inf
    assert torch.isinf(vector.power_kl(other, student, window_mask)).all()
