"""KV caches kept in host memory, so a server can go back to a conversation after serving another.

A board holds one live KV cache. When a request's prompt shares little with it (another user, or
the title and tag requests Open WebUI sends between a chat's turns), the live cache is saved here
before it is rewound, and a later prompt that continues a saved conversation gets its cache back
instead of prefilling it again: llama-server's host-memory prompt cache (``--cache-ram``).

Entries are evicted least recently used first once their bytes pass the budget; an entry whose
tokens begin another's is dropped when the longer one is saved (and not saved beside it), since the
longer one serves every prompt the shorter one could.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from edgesdk.runtime.prompt_cache import common_prefix_length


@dataclass
class SavedCache:
    """A KV cache's token ids and the backend's copy of their keys and values (``save_cache``)."""

    tokens: tuple[int, ...]
    state: object
    nbytes: int


class CacheStore:
    """Saved KV caches within ``budget_bytes``, most recently used last."""

    def __init__(self, budget_bytes: int):
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self.entries: list[SavedCache] = []

    @property
    def nbytes(self) -> int:
        return sum(entry.nbytes for entry in self.entries)

    def best(self, prompt_ids: Sequence[int]) -> tuple[int, SavedCache | None]:
        """The saved cache sharing the longest prefix with ``prompt_ids``, and that prefix's length."""
        found, length = None, 0
        for entry in self.entries:
            shared = common_prefix_length(entry.tokens, prompt_ids)
            if shared > length:
                found, length = entry, shared
        return length, found

    def use(self, entry: SavedCache) -> SavedCache:
        """Mark ``entry`` most recently used (it is being loaded; loading copies it, so it stays saved)."""
        self.entries.remove(entry)
        self.entries.append(entry)
        return entry

    def put(self, tokens: Sequence[int], state: object, nbytes: int) -> bool:
        """Save a cache; False when it alone exceeds the budget (nothing is kept then). A cache whose
        tokens a saved one begins with is not kept beside it: that one is marked used instead."""
        tokens = tuple(tokens)
        for entry in self.entries:
            if entry.tokens[: len(tokens)] == tokens:
                self.use(entry)
                return True
        if nbytes > self.budget_bytes:
            return False
        self.entries = [entry for entry in self.entries if tokens[: len(entry.tokens)] != entry.tokens]
        self.entries.append(SavedCache(tokens, state, nbytes))
        while self.nbytes > self.budget_bytes:
            self.entries.pop(0)  # least recently used
        return True
