"""Training-text review: block sampling covers the whole pool, teacher text leaves the global RNG alone,
and data settings that cannot work are refused up front."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress.data import TokenData  # noqa: E402
from edgesdk.errors import BuildError  # noqa: E402


def test_a_pool_of_exactly_one_block_makes_that_block():
    """A block is input and (shifted inside it) targets: 10 tokens are one block of 10. It was refused as
    'training text has 10 tokens, fewer than one block of 10'."""
    data = TokenData(torch.arange(10), 0)
    (batch,) = data.batches(1, 1, 10, seed=0)
    assert batch.tolist() == [list(range(10))]
    with pytest.raises(BuildError, match="9 tokens, fewer than one block of 10"):
        TokenData(torch.arange(9), 0).batches(1, 1, 10, seed=0)


def test_every_start_including_the_last_is_drawn():
    """Starts were drawn from [0, N - length): the pool's last token was never trained on."""
    data = TokenData(torch.arange(12), 0)
    starts = {int(row[0]) for batch in data.batches(200, 4, 5, seed=3) for row in batch}
    assert starts == set(range(12 - 5 + 1))
