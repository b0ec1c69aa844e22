"""The torch power distribution masks padding as the board's numpy version does, whatever the padding holds."""

from __future__ import annotations

import numpy as np
import torch

from edgesdk.power import distribution, vector


def test_a_non_finite_value_on_padding_does_not_reach_the_valid_tokens_after_it():
    """``p * mask`` kept a NaN (0 * NaN) or turned an inf into NaN (0 * inf) at a padded position,
    and the cumulative sum carried it to every later valid token: P was NaN there."""
    p = np.array([[1.0, np.nan, 2.0, 3.0, np.inf, 4.0, 5.0, 6.0]])
    mask = np.array([[1.0, 0, 1, 1, 0, 1, 1, 1]])
    board = distribution.windowed(p, mask)[0]
    P, _ = vector.windowed(torch.tensor(p, dtype=torch.float64), torch.tensor(mask))
    assert np.isfinite(P.numpy()).all()
    np.testing.assert_allclose(P.numpy(), board, atol=1e-12)
