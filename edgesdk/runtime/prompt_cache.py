"""Reuse the previous answer's KV cache for the part of the next prompt that repeats it.

A chat client sends the whole conversation with every turn, so the next prompt starts with the
tokens the cache already holds: the previous prompt and the answer the model gave. Prefilling
only what follows their longest common prefix is what llama-server does by default
(``cache_prompt``; llama.cpp tools/server); on a board, where a prompt token costs a few
milliseconds, it takes seconds off a long conversation's time to first token.

The cache is rewound to the common prefix (``rewind`` on the backend, which every backend here
has but ``tensorrt``: the length of its past tensors is part of their layout) and the rest of
the prompt is prefilled after it. At least the prompt's last token is always prefilled, since
its logits give the first new token.
"""

from __future__ import annotations

from collections.abc import Sequence

from edgesdk.runtime.backend import DecoderBackend


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

    def __init__(self, backend: DecoderBackend):
        self.backend = backend
        self.tokens: list[int] = []
        self.reused = 0  # the last prompt's tokens served from the cache
        self.supported = callable(getattr(backend, "rewind", None))

    def start(self, prompt_ids: Sequence[int], reuse: bool = True) -> int:
        """Leave the cache holding the longest reusable prefix of ``prompt_ids``; returns its length.

        With ``reuse`` False (or a backend that cannot rewind) the cache is emptied."""
        kept = 0
        if reuse and self.supported and len(self.tokens) == self.backend.position:
            kept = min(common_prefix_length(self.tokens, prompt_ids), len(prompt_ids) - 1)
        if kept > 0:
            self.backend.rewind(kept)
        else:
            self.backend.reset()
        self.tokens = list(prompt_ids[:kept])
        self.reused = kept
        return kept

    def took(self, token_ids: Sequence[int]) -> None:
        """The backend has just added ``token_ids`` to its cache."""
        self.tokens.extend(int(token) for token in token_ids)

    def clear(self) -> None:
        """Forget the cache (the next prompt is prefilled whole)."""
        self.tokens = []
        self.backend.reset()
