import pytest


def test_every_start_of_the_pool_is_drawn_the_last_token_included():
    """A pool one token longer than a prompt has two starts, 0 and 1: randint's high is exclusive, and the bound
    left out the last start, so the pool's last token was never in a prompt."""
    torch = pytest.importorskip("torch")
    from edgesdk.power import train

    pool = torch.arange(9)
    prompts = train.sample_prompts(pool, 200, 8, torch.Generator().manual_seed(0))
    assert set(prompts[:, 0].tolist()) == {0, 1}
    assert (prompts[:, -1] == 8).any()
