"""Embedding requests and answers in OpenAI's shape (``POST /v1/embeddings``), shared by ``edgesdk serve`` and the
Python API's ``Model.create_embedding``, and in llama-server's own (``POST /embedding``, ``POST /embeddings``).

The request (OpenAI's API reference, "Create embeddings"): ``input`` is a string, an array of strings, an array
of token ids or an array of such arrays; ``encoding_format`` is ``float`` (the default) or ``base64`` (each
vector's little-endian float32 bytes, as OpenAI's client asks for by default and decodes itself);
``dimensions`` keeps a vector's first N values, normalised again (what OpenAI's text-embedding-3 models and
Ollama do). The answer: ``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
"usage": {"prompt_tokens", "total_tokens"}}``. Vectors are normalised to unit length (llama-server's
``/v1/embeddings``, ``embd_normalize`` 2), so a dot product is the cosine similarity, unless the request sets
llama-server's ``embd_normalize``, which its ``handle_embeddings_impl`` reads on ``/v1/embeddings`` as on
``/embedding`` (-1 leaves the vectors as the model gives them).

llama-server's native route (tools/server/server-context.cpp, ``handle_embeddings_impl`` with no OpenAI response
type) reads ``input``, or ``content`` where there is no ``input``, in the same forms, and ``embd_normalize``
(``common_embd_normalize``'s norm, 2 by default; not applied with pooling ``none``, whose vectors are every token's
as the model gives them). Its answer is a list with one ``{"index", "embedding"}`` per input, ``embedding`` a list of
vectors: one, the pooled vector, or with pooling ``none`` one per token (``server_task_result_embd::
to_json_non_oaicompat``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from edgesdk.runtime.embedding import NORMALIZE_HELP, Embedding, EmbeddingConfig, normalize
from edgesdk.serve.api import ApiError, _object, _shown, is_mixed_prompt, json_kind, json_shown

ENCODING_FORMATS = ("float", "base64")
# llama-server's refusal of /v1/embeddings on a server pooling with none, word for word (handle_embeddings_impl)
POOLING_NONE_REFUSAL = "Pooling type 'none' is not OAI compatible. Please use a different pooling type"


@dataclass(frozen=True)
class EmbeddingRequest:
    """One embeddings request, checked: its inputs (texts or token id lists), how to encode the vectors and the
    dimensions to keep (None: all)."""

    inputs: tuple[str | tuple[int, ...], ...]
    encoding_format: str = "float"
    dimensions: int | None = None
    normalize: int = 2  # llama-server's embd_normalize (common_embd_normalize's norm)


def embedding_inputs(value: object, param: str = "input") -> tuple[str | tuple[int | str, ...], ...]:
    """OpenAI's ``input`` as a tuple of texts and token id tuples, or a 400 naming what is wrong. As llama-server's
    ``tokenize_input_prompts`` (tools/server/utils.hpp) reads it, an array mixing token ids and strings
    (``[12, 34, "text"]``) is one input, and so is such an array among the inputs; its tuple keeps the strings, which
    the completer tokenizes (``Completer._embedding_ids``)."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and value and all(_is_token(item) for item in value):
        return (tuple(int(item) for item in value),)
    if is_mixed_prompt(value):
        return (_mixed(value, param),)
    _check_items(value, param)
    if isinstance(value, list) and value:
        items = []
        for index, item in enumerate(value):
            if isinstance(item, str):
                items.append(item)
            elif isinstance(item, list) and item and all(_is_token(token) for token in item):
                items.append(tuple(int(token) for token in item))
            elif is_mixed_prompt(item):
                items.append(_mixed(item, f"{param}[{index}]"))
            else:
                _check_items(item, f"{param}[{index}]")
                raise ApiError(400, f"'{param}[{index}]' must be a string or a non-empty array of token ids (or an "
                               f"array mixing token ids and strings), got {_kind(item)}", param=f"{param}[{index}]")
        return tuple(items)
    raise ApiError(400, f"'{param}' must be a string, an array of strings, an array of token ids, an array mixing "
                   f"token ids and strings, or an array of such arrays, got {_kind(value)}", param=param)


def _check_items(value: object, param: str) -> None:
    """A 400 naming the item that does not belong in an array of token ids (``[1, 2, true]``, ``[1, 2.5]``) or of
    token ids mixed with strings (``[12, 2.5, "text"]``, ``[12, "text", null]``): the item itself, not the array's
    first id, which is fine. An array that holds arrays too is a list of inputs, whose items are checked as such."""
    if not isinstance(value, list) or not any(_is_token(item) for item in value) \
            or any(isinstance(item, list) for item in value):
        return
    mixed = any(isinstance(item, str) for item in value)
    wrong = next(((index, item) for index, item in enumerate(value)
                  if not (_is_token(item) or mixed and isinstance(item, str))), None)
    if wrong is None:
        return
    index, item = wrong
    if mixed:
        raise ApiError(400, f"'{param}[{index}]' must be a token id (a whole number) or a string, got "
                       f"{json.dumps(item)[:60]}; '{param}' mixes token ids and strings; write the id as a whole "
                       "number, or put the text in a string", param=f"{param}[{index}]")
    raise ApiError(400, f"'{param}[{index}]' must be a token id (a whole number), got {json.dumps(item)[:60]}; "
                   f"'{param}' is an array of token ids; write each as a whole number, or send the text as a string",
                   param=f"{param}[{index}]")


def _mixed(value: list, param: str) -> tuple[int | str, ...]:
    """An input mixing token ids and strings, its ids checked to be whole numbers (not true or false)."""
    for index, item in enumerate(value):
        if isinstance(item, bool):
            raise ApiError(400, f"'{param}[{index}]' must be a token id or a string, got {json.dumps(item)}; write "
                           "the id as a whole number, or put the text in a string", param=f"{param}[{index}]")
    return tuple(value)


def parse_embedding_request(body: dict, served: Collection[str] = ()) -> EmbeddingRequest:
    """``POST /v1/embeddings``'s body checked (``model`` is repeated in the answer, as llama-server repeats it, and
    ``user`` taken and not used); llama-server's
    ``embd_normalize`` too, as its ``handle_embeddings_impl`` reads it on this route (2 unless given).

    Token ids sent with ``model`` naming one of OpenAI's embedding models (``text-embedding-ada-002``, ``-3-small``,
    ``-3-large``) are refused (:func:`_check_foreign_token_ids`): they are tiktoken's ids, which this model would read
    as other text; unless ``served`` (the names this server answers to, its aliases among them) holds that name."""
    body = _object(body)
    if "input" not in body:
        raise ApiError(400, "'input' is required: the text (or texts, or token ids) to embed", param="input")
    inputs = embedding_inputs(body["input"])
    _check_foreign_token_ids(inputs, body.get("model"), served)
    encoding = body.get("encoding_format", "float")
    if encoding is None:
        encoding = "float"
    if encoding not in ENCODING_FORMATS:
        raise ApiError(400, f"'encoding_format' must be float or base64, got {json_shown(encoding)}", param="encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (not _whole(dimensions) or dimensions < 1):
        raise ApiError(400, f"'dimensions' must be a whole number of at least 1, got {json_shown(dimensions)}",
                       param="dimensions")
    dimensions = None if dimensions is None else int(dimensions)
    return EmbeddingRequest(inputs, encoding, dimensions, _embd_normalize(body))


# what OpenAI's embedding models are called: only these names, not every "text-embedding-..." (LM Studio names local
# embedding models so, e.g. text-embedding-nomic-embed-text-v1.5, whose ids are their own)
OPENAI_EMBEDDING_MODELS = frozenset({"text-embedding-ada-002", "text-embedding-3-small", "text-embedding-3-large"})
FOREIGN_TOKEN_IDS = "token_ids_of_another_tokenizer"  # the refusal's code


def _check_foreign_token_ids(inputs: tuple[str | tuple[int | str, ...], ...], model: object,
                             served: Collection[str] = ()) -> None:
    """A 400 for token ids sent with ``model`` naming an OpenAI embedding model (in any case), where that name is
    none this server answers to (``served``: its model names and aliases). LangChain's ``OpenAIEmbeddings`` with
    its default ``check_embedding_ctx_length=True`` tokenizes each document with tiktoken (cl100k_base) and sends
    those ids with ``model`` ``text-embedding-ada-002``; read as ids of this bundle's vocabulary (any id below its
    size is one of its tokens) each document was embedded as other text, a vector that looks fine and retrieves
    wrongly. llama-server reads them so too.

    A refusal rather than a note on stderr and a header: nobody reads a server's stderr while a vector store fills,
    and silently wrong vectors are the worst outcome for retrieval; a refused first request is seen at once. What it
    costs: a client that deliberately sends this bundle's own ids (from ``POST /tokenize``) under such a model name
    is refused too; it gets its vectors by naming the served model (``GET /v1/models``) or leaving ``model`` out, as
    the refusal says. Texts with such a model name are embedded as ever: only ids are another tokenizer's.

    A served name is never refused: a model served as ``--alias text-embedding-3-small`` (so that OpenAI clients
    work unchanged) is named so by clients sending its own ids too, and the refusal's fix (name the served model)
    would name the same model again."""
    if not (isinstance(model, str) and model.casefold() in OPENAI_EMBEDDING_MODELS):
        return
    if model.casefold() in {name.casefold() for name in served}:
        return
    if all(isinstance(item, str) for item in inputs):
        return
    raise ApiError(400, f"'input' holds token ids and 'model' is {json_shown(model)}, one of OpenAI's embedding models: "
                   "such ids are tiktoken's (OpenAI's tokenizer), which this model would read as other tokens of its "
                   "own vocabulary and embed as other text", param="input", code=FOREIGN_TOKEN_IDS,
                   fix="send the texts instead (LangChain's OpenAIEmbeddings: check_embedding_ctx_length=False); to "
                       "send this model's own ids (POST /tokenize gives them), name the served model in 'model' "
                       "(GET /v1/models) or leave 'model' out")


def _whole(value: object) -> bool:
    """A JSON whole number: 2, or 2.0 as a client that writes every number as a float sends it (JSON has one number
    type; llama-server's nlohmann ``get<int>`` takes 2.0 as 2, and edgesdk's other integer fields take it too,
    serve/api.py ``_integer``); not true or false, not 2.5, inf or NaN."""
    return not isinstance(value, bool) and (isinstance(value, int) or (isinstance(value, float) and value.is_integer()))


def _embd_normalize(body: dict) -> int:
    """llama-server's ``embd_normalize``: 2 (Euclidean) where absent or null, else a whole number >= -1."""
    norm = body.get("embd_normalize", 2)
    if norm is None:
        return 2
    if not _whole(norm) or norm < -1:
        raise ApiError(400, f"'embd_normalize' must be a whole number of at least -1 ({NORMALIZE_HELP}), got "
                       f"{json_shown(norm)}", param="embd_normalize")
    return int(norm)


def embedding_width(manifest: dict) -> int:
    """The values of one of the bundle's embeddings: its model's hidden size (the manifest's model facts)."""
    model = manifest["model"]
    return int((model.get("after") or model["before"])["hidden_size"])


def check_dimensions(request: EmbeddingRequest, width: int) -> None:
    """A 400 for ``dimensions`` past the model's ``width``, before any input runs."""
    if request.dimensions is not None and request.dimensions > width:
        raise ApiError(400, f"'dimensions' is {request.dimensions}; this model's embeddings have {width} values: "
                       f"pass at most {width}, or leave 'dimensions' out for all of them", param="dimensions")


def shortened(vector: np.ndarray, dimensions: int | None, norm: int = 2) -> np.ndarray:
    """The first ``dimensions`` values of a vector (:func:`check_dimensions` has bounded them), all of it for None,
    normalised with ``norm`` (:func:`edgesdk.runtime.embedding.normalize`)."""
    if dimensions is not None:
        vector = vector[..., :dimensions]
    return normalize(vector, norm)


def openai_embeddings_body(embeddings: list[Embedding], model: str, request: EmbeddingRequest) -> dict:
    """The answer to ``request`` from its inputs' ``embeddings`` (pooled vectors, as the model gives them or
    normalised already: each norm but -1 gives the same vector for any positive multiple of it), normalised with the
    request's ``embd_normalize``."""
    data = []
    for index, embedding in enumerate(embeddings):
        check_dimensions(request, embedding.vectors.shape[-1])
        vector = shortened(embedding.vectors, request.dimensions, request.normalize)
        data.append({"object": "embedding", "index": index, "embedding": encoded(vector, request.encoding_format)})
    tokens = sum(embedding.tokens for embedding in embeddings)
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def encoded(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """A vector as a JSON list of floats, or base64 of its little-endian float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return [float(value) for value in vector]


def openai_embedding_config(pooling: str) -> EmbeddingConfig:
    """The pooling the server was started with, the vectors as the model gives them (:func:`openai_embeddings_body`
    normalises them as the request's ``embd_normalize`` says: OpenAI's unit vectors unless it is given); a 400 for
    ``none`` (one vector per token is not OpenAI's answer). llama-server refuses it too, as an
    ``invalid_request_error`` whose message is :data:`POOLING_NONE_REFUSAL` (tools/server/server-context.cpp,
    ``handle_embeddings_impl``), which clients of llama-server match on (the type, and the message or its start) to
    tell a server to be restarted with another pooling from a bad request: the answer keeps both."""
    if pooling == "none":
        raise ApiError(400, f"{POOLING_NONE_REFUSAL}: this server pools embeddings with 'none' (a vector per token), "
                       "which OpenAI's embeddings answer cannot carry; start edgesdk serve with --pooling last, mean "
                       "or cls", code="not_supported")
    return EmbeddingConfig(pooling=pooling, normalize=-1)


@dataclass(frozen=True)
class NativeEmbeddingRequest:
    """``POST /embedding``'s body, checked: its inputs, the field they came in (``input`` or ``content``: errors
    name it) and how the vectors are normalised."""

    inputs: tuple[str | tuple[int, ...], ...]
    param: str
    config: EmbeddingConfig


def parse_native_embedding_request(body: object, pooling: str) -> NativeEmbeddingRequest:
    """llama-server's ``POST /embedding`` (and ``/embeddings``) body checked for a server that pools with ``pooling``:
    ``input`` (or ``content``), ``embd_normalize`` (2 unless given; -1 with pooling ``none``, as llama-server
    normalises only pooled vectors) and ``encoding_format`` (checked as llama-server checks it; the answer is floats)."""
    body = _object(body)
    param = "input" if "input" in body else "content"
    if param not in body:
        raise ApiError(400, "'input' or 'content' is required: the text (or texts, or token ids) to embed",
                       param="input")
    encoding = body.get("encoding_format")
    if encoding is not None and encoding not in ENCODING_FORMATS:
        raise ApiError(400, f"'encoding_format' must be float or base64, got {json_shown(encoding)}", param="encoding_format")
    norm = _embd_normalize(body)
    config = EmbeddingConfig(pooling=pooling, normalize=-1 if pooling == "none" else norm)
    return NativeEmbeddingRequest(embedding_inputs(body[param], param), param, config)


def native_embeddings_body(embeddings: list[Embedding]) -> list[dict]:
    """llama-server's answer: per input its ``index`` and ``embedding``, a list of vectors (the pooled one, or with
    pooling ``none`` every token's)."""
    return [{"index": index, "embedding": [encoded(row, "float") for row in np.atleast_2d(embedding.vectors)]}
            for index, embedding in enumerate(embeddings)]


def _is_token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# json_kind's words where the value follows them
_KINDS_SHOWN = {"a number": "the number", "an array": "the array"}


def _kind(value: object) -> str:
    """What a refused ``input`` (or one of its items) is, in JSON's words and with its value: ``the number 1.5``,
    ``an object {"text": "hi"}``, ``the array [2.5]``, ``true``, ``null``; not Python's type name (``float``,
    ``dict``)."""
    if isinstance(value, list) and not value:
        return "an empty array"
    if value is None or isinstance(value, bool):
        return json_shown(value)
    kind = json_kind(value)
    if kind == type(value).__name__:  # no JSON value: what the Python API may be given (a tuple, a set)
        return f"{kind} {_shown(value)}"
    return f"{_KINDS_SHOWN.get(kind, kind)} {json_shown(value)}"


__all__ = ["ENCODING_FORMATS", "POOLING_NONE_REFUSAL", "EmbeddingRequest", "NativeEmbeddingRequest", "check_dimensions", "embedding_inputs",
           "embedding_width", "encoded", "native_embeddings_body", "openai_embedding_config", "openai_embeddings_body",
           "parse_embedding_request", "parse_native_embedding_request", "shortened"]
