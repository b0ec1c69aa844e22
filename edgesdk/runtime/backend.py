"""The backend protocol every runtime backend implements (DESIGN.md, "Backend")."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class DecoderBackend(Protocol):
    """Prefill a prompt, then decode one token at a time against an internal KV cache."""

    name: str
    max_context: int  # tokens the KV cache holds: prompt plus generated tokens

    def reset(self) -> None:
        """Drop the KV cache; the next call starts a new sequence."""

    def prefill(self, token_ids: np.ndarray, keep_logits: int = 1) -> np.ndarray:
        """Run ``token_ids`` (T,) after the current cache; returns the logits of its last ``min(keep_logits, T)``
        positions (rows, vocab). ``keep_logits`` is at least 1: the ONNX Runtime backends refuse a smaller one."""

    def decode(self, token_id: int) -> np.ndarray:
        """Append one token; returns its next-token logits (vocab,)."""

    # Optional: ``rewind(length)`` keeps the first ``length`` tokens of the KV cache, so the next
    # prefill continues after them (``edgesdk.runtime.prompt_cache``). A backend without it starts
    # every answer from an empty cache. With it, ``save_cache() -> (state, nbytes)`` copies the cache
    # to host memory and ``load_cache(state)`` puts such a copy back (``edgesdk.runtime.cache_store``).

    @property
    def position(self) -> int:
        """Tokens currently in the KV cache."""
