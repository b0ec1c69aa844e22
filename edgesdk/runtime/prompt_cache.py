"""Reuse the previous answer's KV cache for the part of the next prompt that repeats it.

A chat client sends the whole conversation with every turn, so the next prompt starts with the
tokens the cache already holds: the previous prompt and the answer the model gave. Prefilling
only what follows their longest common prefix is what llama-server does by default
(``cache_prompt``; llama.cpp tools/server); on a board, where a prompt token costs a few
milliseconds, it takes seconds off a long conversation's time to first token.

The cache is rewound to the common prefix (``rewind`` on the backend, which every backend here
has; ``tensorrt``'s moves the kept entries of each past tensor, whose layout depends on its
length, to where the engine reads a shorter past) and the rest of the prompt is prefilled after
it. At least the prompt's last token is always prefilled, since its logits give the first new
token.

A power-gated backend whose controller steers the gates (``--gating``) is not reused: its controller starts over
on a rewind and then sees only the tokens prefilled after it, so the threshold, and which FFN blocks run, would
depend on what the previous request left in the cache; a whole prefill gives every request the threshold a fresh
sequence gets (as such a backend decodes without drafts, edgesdk/runtime/generate.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from edgesdk.runtime.backend import DecoderBackend

if TYPE_CHECKING:
    from edgesdk.runtime.cache_store import CacheStore

# A live cache that a prompt would cut by this many tokens or more is saved first (with a store): a
# chat's next turn keeps all but the few tokens whose text the template re-tokenizes, another
# conversation cuts it back to the shared system prompt.
SAVE_AT_LEAST = 64


def steers_gates(backend: DecoderBackend) -> bool:
    """Whether ``backend``'s power gates follow a controller's threshold (gating on, no fixed threshold): its
    answer depends on the tokens the controller saw since it last started over."""
    return getattr(backend, "controller", None) is not None and bool(getattr(backend, "gating", False)) \
        and getattr(backend, "fixed_tau", None) is None


def common_prefix_length(first: Sequence[int], second: Sequence[int]) -> int:
    """How many leading tokens two sequences share."""
    length = 0
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        length += 1
    return length


class PromptCache:
    """The token ids held in ``backend``'s KV cache, and the prefix of a new prompt they can serve.

    ``tokens`` always lists what the cache holds: :func:`edgesdk.runtime.generate.generate` adds
    each token after the backend has taken it. Should a step fail halfway (an exception inside the
    backend), the count no longer matches the backend's position and the next prompt starts from
    an empty cache.
    """

    def __init__(self, backend: DecoderBackend, store: CacheStore | None = None):
        self.backend = backend
        self.tokens: list[int] = []
        self.reused = 0  # the last prompt's tokens served from the cache
        self.supported = callable(getattr(backend, "rewind", None))
        # Saved caches to go back to (a server's other conversations); needs save_cache / load_cache.
        self.store = store if self.supported and callable(getattr(backend, "save_cache", None)) else None
        self._live_saved = False  # the live cache equals a saved one (loaded or saved, nothing added since)

    def start(self, prompt_ids: Sequence[int], reuse: bool = True) -> int:
        """Leave the cache holding the longest reusable prefix of ``prompt_ids``; returns its length.

        With a ``store``, a saved cache that shares more of the prompt than the live one replaces it,
        and a live cache that would lose ``SAVE_AT_LEAST`` tokens or more is saved first.
        With ``reuse`` False (or a backend that cannot rewind, or one that steers its gates) the cache is emptied."""
        if len(self.tokens) != self.backend.position:  # a step failed halfway: what the cache holds is unknown
            self.tokens = []
            self.backend.reset()
        steering = steers_gates(self.backend)
        reuse = reuse and not steering
        live = common_prefix_length(self.tokens, prompt_ids) if reuse and self.supported else 0
        saved, entry = self.store.best(prompt_ids) if reuse and self.store is not None else (0, None)
        if entry is not None and saved > live:
            # Marked used before the live cache is saved, as that may evict the least recently used; should
            # it still evict this one (a budget for one cache), it is loaded all the same, and is no longer saved.
            self.store.use(entry)
            if len(self.tokens) >= SAVE_AT_LEAST:  # all of the live cache is about to go
                self._save_live()
            self.backend.load_cache(entry.state)
            self.tokens, live = list(entry.tokens), saved
            self._live_saved = any(other is entry for other in self.store.entries)
        kept = min(live, len(prompt_ids) - 1)
        if self.store is not None and not steering and len(self.tokens) - kept >= SAVE_AT_LEAST:
            self._save_live()
        if kept > 0:
            self.backend.rewind(kept)
        else:
            self.backend.reset()
        self.tokens = list(prompt_ids[:kept])
        self._live_saved = False
        self.reused = kept
        return kept

    def reusable(self, prompt_ids: Sequence[int], reuse: bool = True) -> int:
        """The tokens :meth:`start` would keep of ``prompt_ids`` now (the live cache's shared prefix or a saved
        cache's, whichever is longer, less the prompt's last token), changing nothing: what a stream that opens
        before its prefill reports as cached (Anthropic's ``message_start``)."""
        if not reuse or steers_gates(self.backend) or not prompt_ids:
            return 0
        whole = len(self.tokens) == self.backend.position  # else start() empties the live cache first
        live = common_prefix_length(self.tokens, prompt_ids) if self.supported and whole else 0
        saved = self.store.best(prompt_ids)[0] if self.store is not None else 0
        return max(0, min(max(live, saved), len(prompt_ids) - 1))

    def _save_live(self) -> None:
        if self.tokens and not self._live_saved:
            state, nbytes = self.backend.save_cache()
            self.store.put(self.tokens, state, nbytes)
            self._live_saved = True

    def forget(self) -> None:
        """The backend ran something else (perplexity windows): its KV cache holds nothing the next prompt
        may reuse, so the cache starts over empty (the saved caches of a store stay)."""
        self.tokens = []
        self._live_saved = False
        self.backend.reset()

    def took(self, token_ids: Sequence[int]) -> None:
        """The backend has just added ``token_ids`` to its cache."""
        self.tokens.extend(int(token) for token in token_ids)
        self._live_saved = False
