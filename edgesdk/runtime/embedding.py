"""Embeddings from a bundle: a text's final-norm hidden states, pooled and normalised as llama.cpp does.

llama.cpp's embedding path (``llama-embedding``, ``llama-server --embeddings``) reads the output norm's tensor
(``result_norm``) of every position of a sequence and pools it (``llama_pooling_type``):

- ``mean``: the average over the sequence's positions;
- ``cls``: the first position's;
- ``last``: the last position's, what decoder embedding models (Qwen3-Embedding, e5-mistral, gte-Qwen2) are
  trained for, and what Ollama returns for a generative model;
- ``none``: every position's, unpooled.

A bundle pools as its model declares (a GGUF's ``pooling_type``, a sentence-transformers Pooling module: the
manifest's ``model.before.pooling``, edgesdk/models/pooling.py), as llama.cpp takes the model's pooling when none
is asked for. A model that declares none, a chat model, pools with ``mean``: SmolLM2-135M-Instruct's mean-pooled
vectors find the paragraph of the same WikiText-2 article in 51.7 % of 60 articles, its last-token vectors in 26.7 %
(tests/benchmarks/test_embedding.py).

Each vector is then normalised (``common_embd_normalize`` in llama.cpp's common/common.cpp): -1 leaves it as
it is, 0 scales its largest magnitude to 32760 (the int16 range), 1 divides by its sum of magnitudes, 2 (the
default of ``llama-embedding``, of OpenAI's and of Ollama's ``/api/embed``) by its Euclidean length, and p > 2
by its p-norm. A vector of zeros stays zeros.

The sequence runs on its own, beside the conversation in the KV cache, which it leaves as it was
(``hidden_states`` of :mod:`edgesdk.runtime.backend`).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from os import PathLike, fspath

import numpy as np

from edgesdk.errors import EdgeSDKError, RuntimeBackendError, overflow_headline
from edgesdk.runtime.backend import NO_HIDDEN_STATES_OUTPUT, REBUILD_FOR_HIDDEN_STATES
from edgesdk.runtime.text import check_utf8

POOLINGS = ("last", "mean", "cls", "none")
DEFAULT_POOLING = "mean"  # for a model that declares no pooling (see the module)
NORMALIZE_HELP = "-1 none, 0 max-abs scaled to int16, 1 taxicab, 2 euclidean, > 2 p-norm"
# the recipes whose graph has the hidden-state output, which every ONNX Runtime backend runs
EMBEDDING_RECIPES = ("a recipe that exports the fused form (default, int8-only, int4, fp32-fused) or the standard form "
                     "with float32 weights (fp32-standard)")
# the fix where the bundle is not known (hidden_states_problem without a manifest): which backend embeds depends on
# it (hidden_states_fix), so each kind is named, and the command that says which kind a bundle is
NO_HIDDEN_STATES_FIX = ("a bundle whose graph has a hidden-state output embeds on --backend ort-cpu; one with "
                        "block-sparse weights (recipes jetson, jetson-sparse) only on --backend triton, on a machine "
                        "with an NVIDIA GPU; one with neither (int8-qdq) on no backend: rebuild it with "
                        f"{EMBEDDING_RECIPES} ('edgesdk inspect BUNDLE' says which it is on its embeddings line)")
BUNDLE_CONTEXT = "the bundle's context"  # the window an input is fitted to where a request sets none (fitted)


class EmbeddingError(EdgeSDKError, ValueError):
    """An embedding input or setting the runtime cannot use (empty, too long, an unknown pooling)."""


class InputTooLong(EmbeddingError):
    """An input longer than the bundle's context, not to be cut (the HTTP routes' ``context_length_exceeded``)."""


@dataclass(frozen=True)
class HiddenStatesProblem:
    """Why a backend cannot give the hidden states embeddings pool: ``cause`` ``backend`` (this backend has none:
    another backend of the same bundle may) or ``graph`` (the bundle's graph lacks the output: rebuild it)."""

    cause: str
    problem: str
    fix: str  # in the terms hidden_states_problem was asked for (the command line's, or the Python API's)


@dataclass(frozen=True)
class EmbeddingConfig:
    """How a sequence's hidden states become its embedding (llama.cpp's ``--pooling`` and ``--embd-normalize``)."""

    pooling: str = DEFAULT_POOLING
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


def bundle_pooling(manifest: dict, bundle: str | PathLike | None = None) -> str:
    """The pooling of a bundle's embeddings when none is asked for: its model's declared one, else
    :data:`DEFAULT_POOLING`. A declared value that is no pooling here (a manifest edited with its hashes) is a
    BundleError naming it and the bundle (``bundle``, its folder, where given)."""
    from edgesdk.errors import BundleError

    declared = ((manifest.get("model") or {}).get("before") or {}).get("pooling")
    if declared is None:
        return DEFAULT_POOLING
    if declared not in POOLINGS:
        where = "the bundle" if bundle is None else f"the bundle {fspath(bundle)}"
        raise BundleError(f"'model.before.pooling' is {declared!r} in the manifest of {where}; expected one of "
                          f"{', '.join(POOLINGS)}",
                          "rebuild the bundle with 'edgesdk build', or pass a pooling (--pooling, pooling=)")
    return declared


def pool(hidden: np.ndarray, pooling: str) -> np.ndarray:
    """(T, D) hidden states -> (D,) for ``mean`` / ``cls`` / ``last``, or (T, D) unchanged for ``none``. A pooled
    vector is an array of its own, not a view of ``hidden``: a view would keep every position's states alive for as
    long as the vector (T times its size; the requests that normalise it with -1 hold it as it is)."""
    if pooling == "mean":
        return hidden.mean(axis=0, dtype=np.float64).astype(np.float32)
    if pooling == "cls":
        return hidden[0].copy()  # (T, D) -> (D,)
    if pooling == "last":
        return hidden[-1].copy()  # (T, D) -> (D,)
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
    else:  # the p-norm, computed on the values over their largest magnitude so a large p neither overflows nor
        # underflows to 0 (common_embd_normalize sums pow(|x|, p) as it is, which gives zeros there)
        largest = magnitudes.max(axis=-1, keepdims=True)
        ratios = np.divide(magnitudes, largest, out=np.zeros_like(magnitudes), where=largest > 0)
        power = _exponent(norm)
        scale = largest * (ratios ** power).sum(axis=-1, keepdims=True) ** (1.0 / power)
    factor = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale > 0)
    return (values * factor).astype(np.float32)


def _exponent(norm: int) -> float:
    """The p of a p-norm as a float: a whole number past the float range (``embd_normalize`` 1e400 written out in a
    JSON body, ``--embd-normalize`` with 400 digits) is infinity, whose p-norm is the largest magnitude, the limit the
    p-norm of a large p reaches (a Python int that large made numpy raise OverflowError, a 500 on the server)."""
    try:
        return float(norm)
    except OverflowError:
        return float("inf")


def text_ids(tokenizer, text: str) -> tuple[list[int], int]:
    """(ids, end) of ``text`` tokenized with the model's special tokens (``tokenizer`` a
    :class:`~edgesdk.runtime.text.ChatTokenizer`): ``end`` is how many of the last ids the tokenizer's post-processor
    appended (an EOS or SEP, as the tokenizers of Qwen3-Embedding and of BERT-style embedding models add), which
    :func:`truncated` keeps. A text that is not UTF-8 (lone surrogates) is an EdgeSDKError naming it."""
    check_utf8(text, "the text to embed")
    encoding = tokenizer.tokenizer.encode(text, add_special_tokens=True)  # whole: load_tokenizer drops a cut
    added = encoding.special_tokens_mask  # 1 for the tokens the post-processor added, 0 for the text's own
    end = 0
    while end < len(added) and added[len(added) - 1 - end]:
        end += 1
    return list(encoding.ids), end


def truncated(ids: Sequence[int], limit: int, end: int = 0) -> list[int]:
    """``ids`` cut to ``limit``: their first tokens, and their last ``end`` (the special tokens the tokenizer
    appended, :func:`text_ids`) kept after them, as Ollama's ``/api/embed`` truncates (it cuts the text's tokens to
    the context less the BOS and EOS its runner adds, and tokenizes the cut text again with them)."""
    ids = list(ids)
    if len(ids) <= limit:
        return ids
    if not 0 < end < limit:
        return ids[:limit]
    return ids[:limit - end] + ids[len(ids) - end:]


def whole_ids(token_ids: Sequence[int]) -> list[int]:
    """``token_ids`` as Python ints (each what ``operator.index`` takes: an int, a numpy integer, a torch integer
    tensor of one element), or an EmbeddingError naming the first that is no whole number (a float, a bool, a string):
    ``int()`` cut 3.7 to the id 3 and read True as 1 and "5" as 5, so another text was embedded without a word, where
    a backend's ``hidden_states`` refuses such ids (:func:`edgesdk.runtime.backend.checked_token_ids`)."""
    ids = []
    for position, token in enumerate(token_ids):
        whole = None
        if not isinstance(token, (bool, np.bool_)) and str(getattr(token, "dtype", "")) not in ("bool", "torch.bool"):
            try:
                whole = operator.index(token)
            except TypeError:
                pass
        if whole is None:
            raise EmbeddingError(f"the input to embed holds {token!r:.40} ({type(token).__name__}) at position "
                                 f"{position}: expected a whole-number token id",
                                 "pass the integer ids the bundle's tokenizer gives, or the text itself")
        ids.append(whole)
    return ids


def fitted(token_ids: Sequence[int], limit: int, truncate: bool = False, end: int = 0,
           window: str = BUNDLE_CONTEXT, built: int | None = None, restart: bool = False,
           source: str = "-c") -> tuple[list[int], bool]:
    """(ids, cut): ``token_ids`` as they will run in a context of ``limit`` tokens, and whether they were cut. An empty
    input is an EmbeddingError, and so is one longer than ``limit`` unless ``truncate`` (then :func:`truncated`
    keeps its first tokens and its last ``end``), and one holding an id that is no whole number (:func:`whole_ids`).
    An input past the bundle's context is refused in OpenAI's words ("This model's maximum context length is ..."),
    which apps written for its API test for; past a smaller ``window`` a request asked for, that window is named.
    ``built``: the bundle's context where the run holds less (``-c N``): raising -c up to it is among the fixes
    (``restart``: of a server, restarted with it); ``source``: what held it (the backend's ``context_source``:
    LLAMA_ARG_CTX_SIZE, load()'s ``n_ctx``), raised in place of -c."""
    ids = whole_ids(token_ids)
    if not ids:
        raise EmbeddingError("the input to embed holds no tokens", "pass a non-empty text or token list")
    cut = len(ids) > limit
    if cut and not truncate:
        problem = (overflow_headline(len(ids), limit, "input") if window == BUNDLE_CONTEXT else
                   f"the input to embed is {len(ids)} tokens, more than {window} of {limit}")
        from edgesdk.bundle import capped_context, held_setting

        fix = "shorten the input or split it into passages"
        if window == BUNDLE_CONTEXT and capped_context(limit, built) is not None:
            setting, whole = held_setting(source)
            fix += (f", or {'restart the server with' if restart else 'raise'} {setting} up to the bundle's {built} "
                    f"({whole})")
        raise InputTooLong(problem, fix)
    return truncated(ids, limit, end), cut


def embed_tokens(backend, token_ids: Sequence[int], config: EmbeddingConfig = EmbeddingConfig(),
                 truncate: bool = False, end: int = 0, manifest: dict | None = None) -> Embedding:
    """The embedding of ``token_ids`` on ``backend``. A sequence longer than the bundle's context is refused, or
    with ``truncate`` cut to its first tokens and its last ``end`` (the special tokens its tokenizer appended:
    :func:`truncated`), ``max_context`` in all (Ollama's ``/api/embed``, ``truncate`` on). A backend without hidden
    states is refused with the fix for the bundle of ``manifest`` (:func:`hidden_states_problem`)."""
    ids, cut = fitted(token_ids, int(backend.max_context), truncate, end,
                      built=getattr(backend, "built_context", None), source=getattr(backend, "context_source", "-c"))
    problem = hidden_states_problem(backend, manifest)
    if problem is not None:
        raise RuntimeBackendError(problem.problem, problem.fix)
    # the ids as Python ints: an int64 array refused one past int64 with numpy's OverflowError, naming no id; the
    # backend names any id out of its vocabulary (checked_token_ids)
    hidden = backend.hidden_states(ids)  # (T, D)
    return Embedding(normalize(pool(hidden, config.pooling), config.normalize), len(ids), cut)


def hidden_states_source(manifest: dict) -> str | None:
    """Where a bundle's hidden states come from: ``graph`` (its graph has the output, on every ONNX Runtime backend),
    ``sparse`` (its block-sparse weights only, on the triton backend: the recipes jetson and jetson-sparse export
    the QDQ graph TensorRT builds from, which has no hidden-state output, beside them), or None: no backend embeds
    the bundle (an int8-qdq build's QDQ graph without block-sparse weights, or a graph exported before graphs gave
    the output)."""
    if "hidden" in ((manifest.get("graph") or {}).get("outputs") or {}):
        return "graph"
    if manifest.get("sparse"):
        return "sparse"
    return None


def no_hidden_states_why(manifest: dict) -> str:
    """Why no backend embeds a bundle whose :func:`hidden_states_source` is None: its QDQ graph (for TensorRT, by
    design, naming its recipe: not an old build, which a rebuild with the same recipe would not change) without
    block-sparse weights, or a graph exported before graphs gave the output."""
    from edgesdk.runtime.tensorrt_engine import QDQ_DTYPE

    if (manifest.get("graph") or {}).get("dtype") == QDQ_DTYPE:
        recipe = manifest.get("recipe")
        name = recipe.get("name") if isinstance(recipe, dict) else recipe
        name = name if isinstance(name, str) and name else "?"
        return (f"the QDQ graph (for TensorRT; recipe {name}) has no hidden-state output and the bundle has no "
                "block-sparse weights for the triton backend")
    return "the graph has no hidden-state output (built before graphs gave one)"


def hidden_states_fix(manifest: dict | None, terms: str = "cli") -> str:
    """What makes embeddings of the bundle of ``manifest``, in the command line's ``terms`` (``--backend``) or the
    Python API's (``python``: ``backend=``): the ONNX Runtime backend where its graph has the output, the triton
    backend where only its block-sparse weights give them (its other backends run the QDQ graph, without them), or
    a rebuild where neither does (no backend of an int8-qdq bundle embeds). A fix naming ``--backend ort-cpu`` for
    the QDQ graph's bundles sent the user to a backend that runs the same graph; with no manifest, each kind."""
    python = terms == "python"

    def backend(name: str) -> str:
        return f"backend={name!r}" if python else f"--backend {name}"

    if manifest is None:
        fix = NO_HIDDEN_STATES_FIX
        return fix.replace("--backend ort-cpu", backend("ort-cpu")).replace("--backend triton", backend("triton")) \
            if python else fix
    load = "load the bundle with" if python else "run the bundle with"
    source = hidden_states_source(manifest)
    if source == "graph":
        return f"{load} {backend('ort-cpu')}: its graph gives the hidden states on the ONNX Runtime backends"
    if source == "sparse":
        return (f"{load} {backend('triton')}, on a machine with an NVIDIA GPU: only its block-sparse weights give the "
                "hidden states (its other backends run its QDQ graph, which has no hidden-state output)")
    return (f"no backend embeds this bundle ({no_hidden_states_why(manifest)}): rebuild it with 'edgesdk build' and "
            f"{EMBEDDING_RECIPES}")


def hidden_states_problem(backend, manifest: dict | None = None, terms: str = "cli") -> HiddenStatesProblem | None:
    """Why ``backend`` cannot give the hidden states embeddings pool (None: it can): a backend without them, or an
    ONNX Runtime backend whose graph lacks the output. The fix is the one for the bundle of ``manifest``, the
    bundle the backend runs (:func:`hidden_states_fix`, in ``terms``): which backend embeds, if any, is the
    bundle's. A graph that lacks the output where its manifest says it has one is rebuilt."""
    if not callable(getattr(backend, "hidden_states", None)):
        return HiddenStatesProblem("backend", f"the {backend.name} backend gives no hidden states, so it cannot make "
                                   "embeddings", hidden_states_fix(manifest, terms))
    if not getattr(backend, "gives_hidden_states", True):
        if manifest is None:
            return HiddenStatesProblem("graph", NO_HIDDEN_STATES_OUTPUT, REBUILD_FOR_HIDDEN_STATES)
        fix = f"rebuild the bundle with 'edgesdk build' and {EMBEDDING_RECIPES}" \
            if hidden_states_source(manifest) == "graph" else hidden_states_fix(manifest, terms)
        return HiddenStatesProblem("graph", NO_HIDDEN_STATES_OUTPUT, fix)
    return None


__all__ = ["BUNDLE_CONTEXT", "EMBEDDING_RECIPES", "NORMALIZE_HELP", "NO_HIDDEN_STATES_FIX", "POOLINGS", "Embedding", "EmbeddingConfig", "EmbeddingError",
           "HiddenStatesProblem", "InputTooLong", "embed_tokens", "fitted", "hidden_states_fix", "hidden_states_problem",
           "hidden_states_source", "no_hidden_states_why", "normalize", "pool", "text_ids", "truncated", "whole_ids"]
