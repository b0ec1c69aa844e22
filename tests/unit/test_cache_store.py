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
    store.take(store.entries[0])  # "a" restored: it is live now, saved again when left
    store.put([1], "a", 10)
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
