"""Power distillation: a training text of exactly one prompt gives that prompt (it was refused as fewer than one)."""

import pytest

torch = pytest.importorskip("torch")

from edgesdk.power import train  # noqa: E402


def test_a_text_of_exactly_one_prompt_gives_that_prompt():
    """A pool of 32 tokens holds one prompt of 32: it was refused as having "fewer than one prompt of 32"."""
    pool = torch.arange(32)
    prompts = train.sample_prompts(pool, 3, 32, torch.Generator().manual_seed(0))
    assert prompts.shape == (3, 32)
    assert (prompts == pool).all()

