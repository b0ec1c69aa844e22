"""The backend protocol every runtime backend implements (DESIGN.md, "Backend")."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from edgesdk.errors import RuntimeBackendError

# The graphs' output of every position's final-norm hidden state (B, T, D): what embeddings pool, as
# llama.cpp pools its ``result_norm`` tensor (export/llama_graph.py, export/fused_graph.py).
HIDDEN_STATES = "hidden_states"
# The QDQ graph (the standard form with int8 weights: recipes int8-qdq, jetson, jetson-sparse) leaves the output out,
# so "rebuild in a standard or fused graph form" sent a bundle of the standard form back to the same build.
NO_HIDDEN_STATES_OUTPUT = ("the bundle's graph has no 'hidden_states' output (it was exported before graphs gave one, "
                           "or is the QDQ graph TensorRT builds from: the standard form with int8 weights, as the "
                           "recipes int8-qdq, jetson and jetson-sparse export it), so it cannot give embeddings")
REBUILD_FOR_HIDDEN_STATES = ("rebuild the bundle with 'edgesdk build' and a recipe that exports the fused form (default, "
                             "int8-only, int4, fp32-fused) or the standard form with float32 weights (fp32-standard); "
                             "a Jetson bundle embeds on the triton backend")


class DecoderBackend(Protocol):
    """Prefill a prompt, then decode one token at a time against an internal KV cache."""

    name: str
    max_context: int  # tokens the KV cache holds: prompt plus generated tokens

    def reset(self) -> None:
        """Drop the KV cache; the next call starts a new sequence."""

    def prefill(self, token_ids: np.ndarray, keep_logits: int = 1) -> np.ndarray:
        """Run ``token_ids`` (T,) after the current cache; returns the logits of its last ``min(keep_logits, T)``
        positions (rows, vocab). ``keep_logits`` is at least 1 (:func:`checked_keep_logits`)."""

    def decode(self, token_id: int) -> np.ndarray:
        """Append one token; returns its next-token logits (vocab,)."""

    # Optional: ``hidden_states(token_ids) -> (T, hidden)`` runs the ids as a sequence of their own and returns
    # their final-norm hidden states, leaving the KV cache as it was (embeddings, edgesdk.runtime.embedding);
    # ``gives_hidden_states`` says False where the method exists but the bundle's graph lacks them.
    # Optional: ``rewind(length)`` keeps the first ``length`` tokens of the KV cache, so the next
    # prefill continues after them (``edgesdk.runtime.prompt_cache``). A backend without it starts
    # every answer from an empty cache. With it, ``save_cache() -> (state, nbytes)`` copies the cache
    # to host memory and ``load_cache(state)`` puts such a copy back (``edgesdk.runtime.cache_store``).
    # Optional: ``close()`` gives back what the backend holds now (``edgesdk.serve.completion.Completer.close``): the
    # ONNX Runtime backends their session (the model's weights) and KV cache, every later step then a
    # RuntimeBackendError naming the closed backend; ``tensorrt`` likewise its engine, execution context, device
    # buffers and stream; ``triton`` its decoder's weights, KV cache, CUDA graph and compiled kernels' modules.

    @property
    def position(self) -> int:
        """Tokens currently in the KV cache."""


def checked_keep_logits(keep_logits: object) -> int:
    """``keep_logits`` of a prefill as an int, or a RuntimeBackendError naming it where it is not a whole number of
    at least 1 (the graphs slice the logits at -num_logits_to_keep: 0 gave every position's row, -1 all but the
    first; TensorRT's backend took such a value as 1 and Triton's as every row)."""
    if isinstance(keep_logits, bool) or not isinstance(keep_logits, (int, np.integer)) or keep_logits < 1:
        raise RuntimeBackendError(f"prefill with keep_logits={keep_logits!r}: expected a whole number of at "
                                  "least 1 (the rows of logits returned, counted back from the last position)",
                                  "pass keep_logits=1 for the next token's logits, or the number of tokens "
                                  "for every position's")
    return int(keep_logits)


def prefill_passes(total: int, keep: int, max_tokens: int) -> list[tuple[int, int, int]]:
    """The passes a prefill of ``total`` tokens runs in where one pass takes at most ``max_tokens`` (an engine's
    optimization profile), each on top of the ones before it in the KV cache, as llama.cpp decodes a batch in
    micro-batches of ``n_ubatch``: (start, end, rows) per pass, ``rows`` how many of its positions are among the
    last ``keep`` whose logits the prefill returns (0 for a pass before them, which the caller runs for one row it
    drops: the graphs return at least one)."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)) or max_tokens < 1:
        raise RuntimeBackendError(f"a prefill pass of at most {max_tokens!r} tokens: expected a whole number of at "
                                  "least 1", "set max_prefill to None (one pass) or to the tokens a pass may take")
    passes = []
    for start in range(0, total, int(max_tokens)):
        end = min(start + int(max_tokens), total)
        passes.append((start, end, max(0, min(end - start, end - (total - keep)))))
    return passes


def checked_token_ids(given: object, vocab_size: int, call: str) -> np.ndarray:
    """``given`` token ids as (1, T) int64, or a RuntimeBackendError naming the first that is not an id of the
    bundle's vocabulary, or a batch of several sequences. An embedding lookup takes a negative id as counted from
    the end (ONNX ``Gather``: indices in [-s, s-1]), a silently wrong row, and a GPU one past the table reads
    memory it should not; a float was cut to an int, a (2, T) batch run as one sequence of 2T tokens. llama.cpp's
    ``llama_decode`` refuses such a batch ("invalid token[i] = id"). Python ints past int64 are named as the ids they
    are (:func:`_id_array`), not as ids of numpy's float64 or object dtype."""
    given = _id_array(given)
    if given.dtype.kind not in "iu" and not _holds_ints(given):
        raise RuntimeBackendError(f"{call} with token ids of dtype {given.dtype} ({given.ravel()[:4].tolist()!r:.80}"
                                  "): expected whole numbers", "pass the integer ids the bundle's tokenizer gives")
    if given.ndim > 2 or (given.ndim == 2 and given.shape[0] != 1):  # was flattened into one sequence
        raise RuntimeBackendError(f"{call} with token ids of shape {given.shape}: expected one sequence, (T,) or "
                                  "(1, T)", "pass the sequences one at a time (the backends run batch 1)")
    # checked before the cast to int64, which wraps a uint64 id of 2**63 or more to a negative one (2**64 - 1 was
    # named as "token id -1")
    flat = given.reshape(-1)
    bad = np.flatnonzero((flat < 0) | (flat >= vocab_size))
    if bad.size:
        at = int(bad[0])
        raise RuntimeBackendError(f"{call} with token id {int(flat[at])} at position {at}: expected an id from 0 "
                                  f"to {vocab_size - 1} (the rows of the bundle's embedding)",
                                  "pass ids the bundle's tokenizer gives that the model has embedding rows for")
    return flat.astype(np.int64, copy=False).reshape(1, -1)  # (1, T)


def _id_array(given: object) -> np.ndarray:
    """``given`` as an array, Python ints kept whole as objects where numpy cannot hold them in one integer dtype: it
    makes [2**64] an object array and [-1, 2**63] a float64 one (both refused as "expected whole numbers", the id
    out of the vocabulary unnamed). A float, bool or string keeps numpy's dtype and is refused as such."""
    array = np.asarray(given)
    if array.dtype.kind != "f" or isinstance(given, np.ndarray):
        return array
    whole = np.array(given, dtype=object)  # the same nesting, each value as given
    return whole if _holds_ints(whole) else array


def _holds_ints(array: np.ndarray) -> bool:
    """Whether ``array`` is an object array of whole numbers only (Python or numpy ints, no bools)."""
    return array.dtype.kind == "O" and array.size > 0 and all(
        isinstance(value, (int, np.integer)) and not isinstance(value, bool) for value in array.flat)


def checked_decode_id(given: object, vocab_size: int) -> np.ndarray:
    """The one token id of a decode step as (1, 1) int64 (:func:`checked_token_ids`), or a RuntimeBackendError naming
    a step of several or none. A one-element array is its id: ``prefill(ids).argmax(-1)`` (argmax over the (1, vocab)
    row of the next token's logits) gives shape (1,), which the ONNX Runtime backends fed as (1, 1, 1) ids
    (onnxruntime's "Invalid rank for input: input_ids"). Two ids were numpy's "truth value of an array ... is
    ambiguous" there, and the Triton and TensorRT backends ran them as one step, returning only the last one's
    logits: decode appends one token, as the protocol says; a prompt of several goes to ``prefill``."""
    ids = np.asarray(given)
    if ids.size != 1:
        raise RuntimeBackendError(f"decode of {ids.size} token ids (shape {ids.shape}): expected one, the next "
                                  "token", "pass one token id per decode step; prefill runs several in one pass")
    return checked_token_ids(ids.reshape(1), vocab_size, "decode")


def checked_rewind(length: object, position: int) -> int:
    """``length`` of a ``rewind`` as an int, or a RuntimeBackendError naming it where it is not a whole number from 0
    to the cache's ``position`` (llama.cpp's ``llama_memory_seq_rm`` keeps the positions before a whole-number p0).
    A float 2.5 or True set the cache's position to 2.5 or True, which the next step's slices refused in torch's or
    onnxruntime's words."""
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)):
        raise RuntimeBackendError(f"cannot rewind the KV cache to {length!r} tokens: expected a whole number",
                                  "rewind to a whole number of tokens between 0 and the backend's position")
    if not 0 <= length <= position:
        raise RuntimeBackendError(f"cannot rewind the KV cache to {length} tokens: it holds {position}",
                                  "rewind to a length between 0 and the backend's position")
    return int(length)


def checked_cache_state(state: object, kv_heads: list[int], head_dim: int, dtype: object, max_context: int) -> int:
    """The length of a ``save_cache`` ``state`` a backend's cache can take, or a RuntimeBackendError naming what does
    not fit: a key and a value array of ``dtype`` shaped (1, kv_heads[layer], length, head_dim) per layer, all of
    one length, at most ``max_context``. Checked before the cache changes, as llama.cpp's
    ``llama_kv_cache::state_read_data`` refuses a state of another layer count, key / value type or row size
    ("mismatched key row size") or more cells than the cache holds ("not enough cells in kv cache to restore
    state"): a state of another bundle (or a cut one) was taken and failed in the next step in the backend's own
    words (onnxruntime's, numpy's, torch's), with the cache left broken."""
    expected = [(1, kv, head_dim) for kv in kv_heads for _ in range(2)]
    arrays = list(state) if isinstance(state, (list, tuple)) else None
    fix = "load a state this backend's save_cache gave (a backend of the same bundle), or prefill the tokens"
    if arrays is None or len(arrays) != len(expected):
        given = f"{len(arrays)} arrays" if arrays is not None else type(state).__name__
        raise RuntimeBackendError(f"load_cache of {given}: this backend's KV cache has {len(expected)} (a key "
                                  f"and a value per layer of {len(kv_heads)})", fix)
    length = None
    for index, (array, (batch, kv, width)) in enumerate(zip(arrays, expected, strict=True)):
        shape, given_dtype = tuple(getattr(array, "shape", ())), getattr(array, "dtype", None)
        if given_dtype != dtype or len(shape) != 4 or (shape[0], shape[1], shape[3]) != (batch, kv, width) \
                or (length is not None and shape[2] != length):
            want = f"{dtype} (1, {kv}, {length if length is not None else 'tokens'}, {width})"
            raise RuntimeBackendError(f"load_cache array {index} (layer {index // 2} "
                                      f"{('key', 'value')[index % 2]}) is {given_dtype} {shape}: expected {want}", fix)
        length = int(shape[2])
    if length > max_context:
        raise RuntimeBackendError(f"load_cache of {length} tokens: the bundle's max_context is {max_context}", fix)
    return length


def close_backend(backend: DecoderBackend) -> None:
    """Give back ``backend``'s session or engine (the model's weights) now, where it has a ``close``."""
    closing = getattr(backend, "close", None)
    if callable(closing):
        closing()
