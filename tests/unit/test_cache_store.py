"""The host-memory store of KV caches (edgesdk/runtime/cache_store.py): best match, budget, LRU, prefixes."""

from __future__ import annotations

import pytest

from edgesdk.runtime.cache_store import CacheStore


def test_best_is_the_entry_sharing_the_longest_prefix():
    store = CacheStore(budget_bytes=100)
    store.put([1, 2, 3, 4], "a", 10)
    store.put([1, 2, 9], "b", 10)
    store.put([5, 6], "c", 10)
    assert store.best([1, 2, 3, 7]) == (3, store.entries[0])
    assert store.best([1, 2, 9, 9])[1].state == "b"
    assert store.best([8]) == (0, None)


def test_the_least_recently_saved_goes_first_past_the_budget():
    store = CacheStore(budget_bytes=25)
    store.put([1], "a", 10)
    store.put([2], "b", 10)
    store.use(store.entries[0])  # "a" loaded: used more recently than "b"
    store.put([3], "c", 10)
    assert [entry.state for entry in store.entries] == ["a", "c"]
    assert store.nbytes == 20


def test_a_saved_prefix_is_dropped_for_the_longer_cache():
    store = CacheStore(budget_bytes=100)
    store.put([1, 2], "short", 10)
    store.put([1, 2, 3], "long", 10)
    assert [entry.state for entry in store.entries] == ["long"]
    store.put([1, 4], "other", 10)
    assert [entry.state for entry in store.entries] == ["long", "other"]


def test_a_cache_larger_than_the_budget_is_not_kept():
    store = CacheStore(budget_bytes=5)
    assert not store.put([1], "big", 6)
    assert store.entries == []
    assert not CacheStore(0).put([1], "any", 1)


def test_a_negative_budget_is_refused():
    with pytest.raises(ValueError, match="budget_bytes must be >= 0, got -1"):
        CacheStore(-1)


# ------------------------------------------------------------------- with a backend: the prompt cache

@pytest.fixture(scope="module", params=["standard", "ort-fused", "gated", "triton-reference"])
def backend(request, tmp_path_factory):
    pytest.importorskip("torch")
    from tests.unit.test_prompt_cache import BACKENDS

    return BACKENDS[request.param](tmp_path_factory.mktemp(request.param))


def _ids(seed: int, count: int) -> list[int]:
    import numpy as np

    return [int(t) for t in np.random.default_rng(seed).integers(0, 320, count)]


def _answer(backend, prompt, cache=None, **kwargs):
    from edgesdk.runtime.generate import SamplingConfig, generate

    return generate(backend, prompt, SamplingConfig(max_new_tokens=6), stop_ids=set(), cache=cache, **kwargs)


def test_a_conversation_gets_its_cache_back_after_another_prompt(backend):
    """Chat A, an unrelated prompt B (a title request), chat A's next turn: A's tokens come back from
    the store, and every answer equals the one an empty cache gives."""
    from edgesdk.runtime.prompt_cache import SAVE_AT_LEAST, PromptCache

    cache = PromptCache(backend, CacheStore(2**26))
    chat = _ids(20, SAVE_AT_LEAST + 10)
    answer, _ = _answer(backend, chat, cache)
    held = len(cache.tokens)
    other, stats = _answer(backend, _ids(21, 12), cache)
    assert stats.cached_tokens == 0
    assert [entry.tokens for entry in cache.store.entries] == [tuple(chat + answer[:-1])]  # saved before B
    follow_up = chat + answer + _ids(22, 5)
    again, stats = _answer(backend, follow_up, cache)
    assert stats.cached_tokens == held
    assert again == _answer(backend, follow_up)[0]
    # B's cache was saved when A came back only if it was worth it (fewer than SAVE_AT_LEAST tokens: not).
    assert len(cache.store.entries) == 1


def test_a_request_that_opts_out_still_keeps_the_conversation(backend):
    from edgesdk.runtime.prompt_cache import SAVE_AT_LEAST, PromptCache

    cache = PromptCache(backend, CacheStore(2**26))
    chat = _ids(23, SAVE_AT_LEAST + 4)
    answer, _ = _answer(backend, chat, cache)
    _, stats = _answer(backend, chat, cache, reuse_cache=False)  # "cache_prompt": false
    assert stats.cached_tokens == 0
    _, stats = _answer(backend, chat + answer, cache)
    assert stats.cached_tokens == len(chat) + len(answer) - 1


def test_with_no_room_in_the_store_the_other_prompt_costs_the_chat_its_cache(backend):
    from edgesdk.runtime.prompt_cache import SAVE_AT_LEAST, PromptCache

    cache = PromptCache(backend, CacheStore(budget_bytes=1))
    chat = _ids(24, SAVE_AT_LEAST + 4)
    answer, _ = _answer(backend, chat, cache)
    _answer(backend, _ids(25, 8), cache)
    assert cache.store.entries == []
    _, stats = _answer(backend, chat + answer, cache)
    assert stats.cached_tokens == 0


def test_a_saved_cache_loads_into_a_grown_buffer(tmp_path):
    """A fused backend whose buffers grew past 256 entries saves them; loaded after a reset (buffers
    of the same size), the continuation equals one whole prefill."""
    import numpy as np

    from tests.unit.test_prompt_cache import _fused

    backend = _fused(tmp_path)
    ids = _ids(26, 300)
    backend.prefill(np.array(ids))
    state, nbytes = backend.save_cache()
    assert nbytes == sum(array.nbytes for array in state) > 0
    backend.reset()
    backend.prefill(np.array(_ids(27, 10)))  # overwrite the start of the buffers
    backend.load_cache(state)
    assert backend.position == 300
    tail = backend.prefill(np.array(_ids(28, 4)), keep_logits=4)
    backend.reset()
    whole = backend.prefill(np.array(ids + _ids(28, 4)), keep_logits=4)
    np.testing.assert_allclose(tail, whole, atol=2e-4)


def test_serve_says_cache_ram_is_not_used_without_the_prompt_cache(tiny_bundle):
    """The warning comes before the server starts; here the port is taken, so serve stops right after."""
    import socket

    from tests.unit.test_cli import invoke

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = invoke("serve", tiny_bundle.path, "--port", port, "--no-prompt-cache", "--cache-ram", 64,
                        "--threads", 1)
        quiet = invoke("serve", tiny_bundle.path, "--port", port, "--no-prompt-cache", "--threads", 1)
    assert result.exit_code != 0
    assert "--cache-ram is not used: --no-prompt-cache keeps no KV cache between requests" in result.stderr
    assert "--cache-ram is not used" not in quiet.stderr
