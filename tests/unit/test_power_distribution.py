"""The power distribution P: padding masked, causal smoothing, min-max and L1 normalisation, entropy."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.power import distribution as D


def _stream(seed: int, shape=(3, 32)) -> np.ndarray:
    return np.random.default_rng(seed).gamma(2.0, 1.0, shape)


def test_each_window_sums_to_one_over_valid_tokens_and_is_zero_on_padding():
    p = _stream(0)
    mask = np.ones_like(p)
    mask[1, 20:] = 0  # a padded tail
    mask[2, 5] = 0  # a hole
    prob, m = D.windowed(p, mask)
    assert prob.shape == (3, 4, 8)
    sums = prob.sum(-1)
    has_valid = m.sum(-1) > 0
    np.testing.assert_allclose(sums[has_valid], 1.0, atol=1e-12)
    assert np.all(prob[m == 0] == 0)
    assert np.all(prob[m > 0] > 0)  # the floor: no valid token has zero mass


def test_padding_values_do_not_change_p():
    p = _stream(1)
    mask = np.ones_like(p)
    mask[:, 27:] = 0
    other = p.copy()
    other[:, 27:] = 1e6  # garbage where the sequence is padded
    np.testing.assert_array_equal(D.windowed(p, mask)[0], D.windowed(other, mask)[0])


def test_min_max_makes_p_invariant_to_offset_and_scale():
    p = _stream(2)
    mask = np.ones_like(p)
    np.testing.assert_allclose(D.windowed(p, mask)[0], D.windowed(3.0 * p + 7.0, mask)[0], atol=1e-12)


@pytest.mark.parametrize("floor", [D.FLOOR, 0.0])
def test_constant_power_is_uniform_and_entropy_reaches_ln_window(floor):
    """Also without a floor (a bundle's power.json may hold 0): P was all zeros there and the entropy 0."""
    p = np.full((1, 16), 2.5)
    prob, _ = D.windowed(p, np.ones_like(p), floor=floor)
    np.testing.assert_allclose(prob, 1 / D.WINDOW)
    np.testing.assert_allclose(D.entropy(prob), np.log(D.WINDOW))
    assert D.window_entropy(np.ones(10), floor=floor) == pytest.approx(np.log(D.WINDOW))
    torch = pytest.importorskip("torch")
    from edgesdk.power import vector

    ours, _ = vector.windowed(torch.from_numpy(p), torch.ones(1, 16, dtype=torch.float64), floor=floor)
    np.testing.assert_allclose(ours.numpy(), 1 / D.WINDOW)


def test_entropy_bounds_and_a_spike_lowers_it():
    p = _stream(3, (50, 64))
    h = D.entropy(D.windowed(p, np.ones_like(p))[0])
    assert np.all(h >= 0)
    assert np.all(h <= np.log(D.WINDOW) + 1e-12)
    spike = np.full((1, 16), 0.1)
    spike[0, 12] = 5.0
    h_spike = D.entropy(D.windowed(spike, np.ones_like(spike))[0])[0, 1]
    assert h_spike < 1.5 < h.mean()  # the design window: natural power above 1.5 nats, a spike below


def test_smoothing_is_causal_and_averages_valid_tokens_only():
    p = np.array([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])
    mask = np.array([[1, 1, 0, 1, 1, 1]])
    s = D.smooth(p, mask, 3)
    # t=3 averages positions 1..3 without the masked position 2: (2 + 4) / 2
    np.testing.assert_allclose(s[0], [1.0, 1.5, 0.0, 3.0, 4.5, 5.0])
    changed = p.copy()
    changed[0, 5] = 100.0
    np.testing.assert_array_equal(D.smooth(changed, mask, 3)[0, :5], s[0, :5])  # no look-ahead


def test_window_entropy_of_a_stream_needs_a_full_window():
    with pytest.raises(ValueError, match="at least 8 tokens"):
        D.window_entropy(np.ones(5))
    stream = _stream(4, (40,))
    direct = D.entropy(D.distribution(D.smooth(stream, np.ones_like(stream))[-8:], np.ones(8)))
    assert D.window_entropy(stream) == pytest.approx(float(direct))


def test_torch_version_equals_the_board_version():
    torch = pytest.importorskip("torch")
    from edgesdk.power import vector

    p = _stream(5, (4, 40))
    mask = np.ones_like(p)
    mask[0, 30:] = 0
    mask[3, :3] = 0
    ours, m = vector.windowed(torch.from_numpy(p), torch.from_numpy(mask))
    board, m_board = D.windowed(p, mask)
    np.testing.assert_allclose(ours.numpy(), board, atol=1e-12)
    np.testing.assert_allclose(vector.entropy(ours).numpy(), D.entropy(board), atol=1e-12)
    weights, scales = (0.2, 0.5, 0.3), (0.4, 2.0, 3.0)
    a, f, c = (_stream(s, (2, 5)) for s in (6, 7, 8))
    np.testing.assert_allclose(
        vector.combine(*(torch.from_numpy(x) for x in (a, f, c)), weights, scales).numpy(),
        D.combine(a, f, c, weights, scales))


def test_torch_smoothing_skips_a_masked_position_as_the_board_does():
    torch = pytest.importorskip("torch")
    from edgesdk.power import vector

    p = np.array([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])
    mask = np.array([[1.0, 1.0, 0.0, 1.0, 1.0, 1.0]])
    ours = vector.smooth(torch.from_numpy(p), torch.from_numpy(mask), 2).numpy()
    np.testing.assert_allclose(ours, D.smooth(p, mask, 2))
    assert ours[0, 3] == 4.0  # the masked position 2 is skipped, position 1 is outside the span
