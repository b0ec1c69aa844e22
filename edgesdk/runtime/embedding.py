"""Embeddings from a bundle: a text's final-norm hidden states, pooled and normalised as llama.cpp does.

llama.cpp's embedding path (``llama-embedding``, ``llama-server --embeddings``) reads the output norm's tensor
(``result_norm``) of every position of a sequence and pools it (``llama_pooling_type``):

- ``mean``: the average over the sequence's positions;
- ``cls``: the first position's;
- ``last``: the last position's, what decoder embedding models (Qwen3-Embedding, e5-mistral, gte-Qwen2) are
  trained for, and what Ollama returns for a generative model; the default here;
- ``none``: every position's, unpooled.

Each vector is then normalised (``common_embd_normalize`` in llama.cpp's common/common.cpp): -1 leaves it as
it is, 0 scales its largest magnitude to 32760 (the int16 range), 1 divides by its sum of magnitudes, 2 (the
default of ``llama-embedding``, of OpenAI's and of Ollama's ``/api/embed``) by its Euclidean length, and p > 2
by its p-norm. A vector of zeros stays zeros.

The sequence runs on its own, beside the conversation in the KV cache, which it leaves as it was
(``hidden_states`` of :mod:`edgesdk.runtime.backend`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgesdk.errors import EdgeSDKError, RuntimeBackendError

POOLINGS = ("last", "mean", "cls", "none")
NORMALIZE_HELP = "-1 none, 0 max-abs scaled to int16, 1 taxicab, 2 euclidean, > 2 p-norm"


class EmbeddingError(EdgeSDKError, ValueError):
    """An embedding input or setting the runtime cannot use (empty, too long, an unknown pooling)."""


@dataclass(frozen=True)
class EmbeddingConfig:
    """How a sequence's hidden states become its embedding (llama.cpp's ``--pooling`` and ``--embd-normalize``)."""

    pooling: str = "last"
    normalize: int = 2

    def __post_init__(self):
        if self.pooling not in POOLINGS:
            raise EmbeddingError(f"pooling {self.pooling!r} is not one of {', '.join(POOLINGS)}",
                                 "pass last (decoder embedding models), mean, cls or none (every token's vector)")
        if isinstance(self.normalize, bool) or not isinstance(self.normalize, (int, np.integer)) \
                or self.normalize < -1:
            raise EmbeddingError(f"normalize {self.normalize!r} is not a whole number of at least -1",
                                 f"pass one of: {NORMALIZE_HELP}")


@dataclass(frozen=True)
class Embedding:
    """One input's embedding: a vector (hidden,), or with pooling ``none`` one per token (tokens, hidden)."""

    vectors: np.ndarray
    tokens: int  # tokens the model read (after any truncation)
    truncated: bool = False


def pool(hidden: np.ndarray, pooling: str) -> np.ndarray:
    """(T, D) hidden states -> (D,) for ``mean`` / ``cls`` / ``last``, or (T, D) unchanged for ``none``."""
    if pooling == "mean":
        return hidden.mean(axis=0, dtype=np.float64).astype(np.float32)
    if pooling == "cls":
        return hidden[0]
    if pooling == "last":
        return hidden[-1]
    return hidden


def normalize(vectors: np.ndarray, norm: int) -> np.ndarray:
    """Each row of ``vectors`` (D,) or (T, D) normalised as ``common_embd_normalize`` does (see the module)."""
    values = np.asarray(vectors, dtype=np.float64)
    magnitudes = np.abs(values)
    if norm == -1:
        return np.asarray(vectors, dtype=np.float32)
    if norm == 0:
        scale = magnitudes.max(axis=-1, keepdims=True) / 32760.0
    elif norm == 2:
        scale = np.sqrt((values * values).sum(axis=-1, keepdims=True))
    else:
        scale = (magnitudes ** norm).sum(axis=-1, keepdims=True) ** (1.0 / norm)
    factor = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale > 0)
    return (values * factor).astype(np.float32)


def embed_tokens(backend, token_ids: Sequence[int], config: EmbeddingConfig = EmbeddingConfig(),
                 truncate: bool = False) -> Embedding:
    """The embedding of ``token_ids`` on ``backend``. A sequence longer than the bundle's context is refused, or
    with ``truncate`` cut to its first ``max_context`` tokens (Ollama's ``/api/embed``, ``truncate`` on)."""
    ids = [int(token) for token in token_ids]
    if not ids:
        raise EmbeddingError("the input to embed holds no tokens", "pass a non-empty text or token list")
    limit = int(backend.max_context)
    truncated = len(ids) > limit
    if truncated and not truncate:
        raise EmbeddingError(f"the input to embed is {len(ids)} tokens, more than the bundle's context of {limit}",
                             "shorten the input or split it into passages")
    ids = ids[:limit]
    hidden_states = getattr(backend, "hidden_states", None)
    if hidden_states is None:
        raise RuntimeBackendError(f"the {backend.name} backend gives no hidden states, so it cannot make embeddings",
                                  "run the bundle on an ONNX Runtime backend (--backend ort-cpu, or ort-cuda on a "
                                  "Jetson)")
    hidden = hidden_states(np.asarray(ids, dtype=np.int64))  # (T, D)
    return Embedding(normalize(pool(hidden, config.pooling), config.normalize), len(ids), truncated)


def can_embed(backend) -> bool:
    """Whether ``backend`` gives hidden states at all (its graph may still lack them: ``hidden_states`` says)."""
    return callable(getattr(backend, "hidden_states", None))


__all__ = ["NORMALIZE_HELP", "POOLINGS", "Embedding", "EmbeddingConfig", "EmbeddingError", "can_embed",
           "embed_tokens", "normalize", "pool"]
