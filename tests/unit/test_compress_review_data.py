"""Training-text review: block sampling covers the whole pool, teacher text leaves the global RNG alone,
and data settings that cannot work are refused up front."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress.data import DataConfig, TokenData  # noqa: E402
from edgesdk.errors import BuildError  # noqa: E402
from tests._utils.tiny import tiny_llama, tiny_tokenizer  # noqa: E402


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


def test_teacher_text_leaves_the_global_rng_as_it_found_it(tmp_path, monkeypatch):
    """The power stage seeds the global RNG, loads the training text, then initialises its adapters from
    that RNG. Sampling teacher text reseeded it, reading the cached text did not: a first build and a
    rebuild from the cache got different adapters. Both now leave the caller's RNG stream untouched."""
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    model, tokenizer = tiny_llama(seed=3), tiny_tokenizer()
    config = DataConfig(generated_sequences=2, generated_tokens=4, seed=1)
    draws, texts = [], []
    for _ in range(2):  # first: sampled and cached; second: read from the cache
        torch.manual_seed(123)
        texts.append(TokenData.load(config, tokenizer, model).ids)
        draws.append(torch.rand(4))
    assert list((tmp_path / "cache" / "teacher-text").glob("*.pt"))
    torch.testing.assert_close(texts[0], texts[1])
    torch.testing.assert_close(draws[0], draws[1])
    torch.manual_seed(123)
    torch.testing.assert_close(draws[0], torch.rand(4))
