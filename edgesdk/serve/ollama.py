"""Ollama's native API on the same completer: ``/api/chat``, ``/api/generate``, ``/api/embed``, ``/api/embeddings``,
``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/version`` and the ``GET /`` liveness probe.

Home Assistant's Ollama integration, Open WebUI's Ollama connection, Continue and the ``ollama`` Python package
speak this API rather than OpenAI's. A request is translated into the chat (or, ``raw``, text) request it means
and checked there, so it renders the same prompt and gets the same answer as ``/v1/chat/completions``; an error
names the Ollama field. Shapes follow Ollama's API reference (docs/api.md in ollama/ollama, "Generate a
completion", "Generate a chat completion", "List Local Models", "Show Model Information", "List Running Models",
"Version"):

* ``POST /api/chat``: ``messages`` of ``system`` / ``user`` / ``assistant`` / ``tool`` turns, ``developer`` read as
  ``system`` (as the Responses route reads it) and any other role given to the chat template as it is, as Ollama's
  template is given every role (a template that refuses it is a 400 naming its own words) (``content``, an
  assistant's ``tool_calls`` with ``function.arguments`` an object, a tool turn's ``tool_name`` or ``tool_call_id``;
  an assistant's ``thinking`` is left out, as an earlier turn's reasoning is on the other routes; ``images`` are
  refused: the model reads text), ``tools``, ``format`` (``"json"`` or a JSON schema; in both, OpenAPI 3.0's
  ``nullable`` read as the chat route's tools read it, :func:`json_schema`; anything else Ollama's "invalid format: ...; expected "json" or a
  valid JSON Schema object", a 400 here where Ollama, finding it after loading the model, answers 500; on a model
  that thinks, with ``think`` not false, the thinking runs first unconstrained and the format holds the content
  after it, as Ollama's ChatHandler answers in two requests: :func:`thinking_first`), ``think`` (left out on a model that thinks: thinking on, as Ollama's ChatHandler and GenerateHandler set it, and not the
  chat template's own default), ``options``, ``stream`` (true unless false, as in Ollama), ``keep_alive`` (seconds
  or a Go duration, checked as Ollama checks it; a board serving one bundle keeps it loaded whatever it says, one
  serving several unloads the model once it has been idle that long, at once with zero, as Ollama does, /api/ps
  showing when: serve/model_pool.py; a request without it gets the server's, OLLAMA_KEEP_ALIVE's, else kept loaded),
  ``logprobs`` and ``top_logprobs`` (0-20; without ``logprobs`` true nothing is listed, as in Ollama).
  No messages: the model is loaded already, and the answer says so (``done_reason`` "load"), as Ollama answers;
  with ``keep_alive`` zero (``0``, ``"0"``, ``"0s"``), Ollama's unload answer (``done_reason`` "unload").
  A conversation past the context (or ``num_ctx``) loses its oldest messages until it fits, its system messages
  and its last message kept, as Ollama's ``chatPrompt`` keeps it (:func:`trimmed`); where the last message with
  the system messages is still past it, that prompt is cut as Ollama's runner cuts its input
  (:func:`_truncated_input`), not refused.
* ``truncate`` and ``shift`` (api/types.go, both requests; true where absent; anything but a boolean a 400 naming
  the field): ``truncate`` false keeps every message, and a prompt that leaves no room for an answer within the
  context (or ``num_ctx``) is Ollama's 400 "the input length exceeds the context length" (its runner refuses a
  prompt longer than the context); true, /api/generate's prompt (``context`` in front included) past the context
  (or ``num_ctx``) keeps its first ``options.num_keep`` tokens and its last ones, as Ollama's runner cuts its input
  (:func:`_truncated_input`), and /api/chat drops its oldest messages (:func:`trimmed`), its prompt then cut the
  same way where what is kept is still past the context. ``shift`` false: the
  answer stops when the context fills, done_reason "length", as Ollama's runner stops it; true (the default,
  whatever ``edgesdk serve --context-shift`` says), a full context keeps its first ``options.num_keep`` tokens
  (Ollama's default 4; -1: the prompt), drops half of what follows them and the answer goes on
  (runner/ollamarunner/cache.go ``ShiftCacheSlot``; edgesdk.runtime.generate.ContextShift), with a ``num_predict``
  of -1 or -2, or above ten times the context, run to ten times the context's tokens as llm/server.go limits it
  ("only allow maximum 10 context shifts"). A ``num_ctx`` below the bundle's context is the context the answer
  shifts within, as Ollama's runner shifts its ``num_ctx``-long cache (with ``shift`` false it stops there).
* ``POST /api/generate``: ``prompt`` with ``system`` through the chat template (on a bundle without one, the prompt
  as given, as Ollama's default template ``{{ .Prompt }}`` renders it), or ``raw`` as given (``system``
  or ``context`` with it refused, as Ollama's GenerateHandler refuses them); with ``suffix``, fill-in-the-middle: where Ollama renders the model's template with
  ``.Prompt`` and ``.Suffix`` (``system`` unused), the prompt is built as llama-server's ``/infill`` builds it with
  ``prompt`` as the prefix and ``suffix`` as the suffix (serve/infill.py), and ``raw`` leaves the suffix out, as
  Ollama's raw skips the template; a model without FIM tokens is refused as Ollama refuses a model without the
  insert capability (400 "does not support insert"). ``images`` and a ``template`` are refused by name (text only,
  the bundle's chat template is the one rendered). The deprecated ``context`` as Ollama's GenerateHandler
  (server/routes.go) has it: the last object of an answer that is not ``raw`` carries ``context``, the prompt's
  text and the answer's tokenized as one (this bundle's token ids), and a request's ``context`` is detokenized and
  its text put in front of the prompt rendered from ``prompt`` and ``system`` (an id outside the vocabulary is
  refused naming it; with ``raw`` it is refused, as Ollama refuses it). An empty prompt answers done with
  ``done_reason`` "load", as Ollama's does ("unload" with ``keep_alive`` zero).
* what the model cannot do is refused before anything runs, as Ollama refuses it and in its order (routes.go,
  before the model is loaded, so a load request too): ``think`` true where the chat template does not think
  (400 "does not support thinking"), then /api/chat and /api/generate of an embedding model, a bundle whose model
  declares its pooling, which /api/show lists as "embedding" in place of "completion" (400 ``"<model>" does not
  support chat`` or ``generate``; llama-server's and OpenAI's routes answer it all the same), then ``tools`` where
  the bundle has no chat template (400 ``<model> does not support tools``; any chat template renders tools here, in
  llama.cpp's generic tool-call form, so /api/show lists "tools" for every bundle with one, where Ollama lists it
  only for a template that reads ``.Tools``), then a ``suffix`` without FIM tokens.
* ``options``: ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``seed``, ``stop``, ``repeat_penalty``,
  ``repeat_last_n``, ``presence_penalty``, ``frequency_penalty``, ``num_predict`` (-1, any number below 0, -2 of
  Ollama's old docs' "fill context" too, or 0 as Ollama's runners read it: no limit; here all run until the answer
  ends or the context is full), ``num_ctx`` (the request's context
  window: above the bundle's it is the bundle's, as Ollama caps it at the model's trained context; below it, the
  prompt and answer together stay within it; below 4, 0 and any number below 0 included, it is 4, as Ollama's
  scheduler sets it). ``typical_p``, a sampler this runtime lacks, is refused where set below 1 (from 1 up it
  does nothing); load settings (``num_gpu``, ``num_thread``, ``num_batch``, ``use_mmap`` ...) change nothing here,
  though a load setting of the wrong type is refused as Ollama refuses it (``num_keep``: the tokens kept where the
  context shifts, below 0 the whole prompt); an option Ollama does not know is ignored, as Ollama ignores it
  (``Options.FromMap``: "invalid option provided", a warning), and so are the options Ollama dropped
  (``mirostat``, ``mirostat_tau``, ``mirostat_eta``, ``tfs_z``, ``penalize_newline``), whatever their value, each
  with that warning in the server's log naming it, as Ollama logs it, and a misspelt one the known option nearest
  its name (``num_predcit``: ``num_predict``; :func:`_warn_invalid`). A
  value of the wrong type is refused naming ``options.<name>``; a number is read as Ollama reads it, a float given
  for a whole-number option as its whole part (4096.0 and 4096.5 as 4096) and the sampler's values clamped as its
  sampler clamps them (:func:`_as_ollama_reads`).
* answers: ``model`` (as asked), ``created_at``, ``message`` (``content``, ``thinking`` where a thinking model's
  reasoning is split off, ``tool_calls``: one call, with its ``function.index``; streamed, once whole, in an object
  of its own, as Ollama's ChatHandler gives a call out where its tool parser finds it; a call ``num_predict`` or a
  stop string cuts short is none, its text the content, as Ollama's parser finds no call in it: :func:`_whole_calls`)
  or ``response``, never ending in a character the answer's end cut short (:func:`whole_text`),
  ``logprobs`` where asked for (api/types.go ``Logprob``:
  per token its ``token``, ``logprob``, ``bytes`` and ``top_logprobs``, left out when empty; a streamed object
  carries those of its own tokens; under ``tools`` the tokens of what the answer gives out, its thinking, its text
  and its call's JSON, never the JSON this server wraps a text in: :class:`_ToldTokens`), ``done``, ``done_reason``
  ("stop" or "length"),
  ``total_duration``, ``load_duration`` (the time the model took to be scheduled, loaded for the request where
  several bundles are served; 0 for one bundle, loaded at start), ``prompt_eval_count``, ``prompt_eval_duration``,
  ``eval_count``, ``eval_duration`` (nanoseconds). A stream is newline-delimited JSON (``application/x-ndjson``), one object per
  piece and a last one with ``done`` true; an error once it has begun is a last ``{"error": ...}`` line.
* Ollama's model management: ``POST /api/pull`` of a model served (its name matched as :func:`_model_name` matches
  it) answers Ollama's last pull status, ``{"status": "success"}`` (one line of a stream unless ``stream`` is
  false, as Ollama streams a pull), so that a client that pulls a model before it uses it (``ollama run``, Open
  WebUI's pull, scripts that pull first) goes on as with an Ollama that has the model already; nothing is fetched.
  A pull of another model, and ``/api/push``, ``/api/create``, ``/api/copy``, ``DELETE /api/delete`` and
  ``/api/blobs/{digest}``, are a 501 saying what to do instead (:func:`unmanaged`): a bundle is built on a host and
  copied to the board with edgesdk, not downloaded by the server. Under another method than Ollama's, a 405.
* errors: ``{"error": "..."}`` with the status; a model name that is not the served one is Ollama's 404 "model
  not found" (clients send the name ``/api/tags`` lists; with several bundles, Ollama's own words:
  :func:`model_not_found`).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone

from edgesdk.bundle import Bundle
from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.embedding import Embedding, EmbeddingConfig, normalize
from edgesdk.runtime.json_schema import openapi_nullable
from edgesdk.runtime.text import broken_end, pieces_text
from edgesdk.serve import infill
from edgesdk.serve.anthropic import call_input, too_deep_call
from edgesdk.serve.api import (
    MAX_TOP_LOGPROBS,
    UNTIL_THE_CONTEXT_FILLS,
    ApiError,
    CompletionRequest,
    _object,
    answered_call,
    finite_number,
    json_shown,
    parse_chat_request,
    parse_text_request,
    utf8_field,
    utf8_stops,
)
from edgesdk.serve.completion import SHIFTED_LIMIT_CONTEXTS, AnswerCut, Completer, Completion
from edgesdk.serve.embeddings import encoded
from edgesdk.serve.model_pool import ollama_key
from edgesdk.serve.reasoning import ReasoningSplitter, prompt_opens_thinking, split_answer, template_thinks
from edgesdk.serve.tools import AnswerStream, TokenSpans, ToolError, arguments_text, tool_result_text

LOG = logging.getLogger(__name__)
CHAT_ROUTE, GENERATE_ROUTE, SHOW_ROUTE = "/api/chat", "/api/generate", "/api/show"
EMBED_ROUTE, EMBEDDINGS_ROUTE = "/api/embed", "/api/embeddings"  # the second is Ollama's deprecated one
POST_ROUTES = (CHAT_ROUTE, GENERATE_ROUTE, SHOW_ROUTE, EMBED_ROUTE, EMBEDDINGS_ROUTE)
GET_ROUTES = ("/api/tags", "/api/version", "/api/ps")
ROUTES = POST_ROUTES + GET_ROUTES
PULL_ROUTE = "/api/pull"
# Ollama's model-management routes (server/routes.go) and the method each takes there: this server answers from the
# bundles it was started with, so it pulls (but the model it serves), pushes, creates, copies and deletes none
MANAGEMENT_ROUTES = {PULL_ROUTE: "POST", "/api/push": "POST", "/api/create": "POST", "/api/copy": "POST",
                     "/api/delete": "DELETE"}
BLOBS_ROUTE = "/api/blobs/"  # HEAD and POST /api/blobs/{digest}: ``ollama create`` uploading a model's files
# what a bundle comes from, said in every management refusal
BUNDLES_MADE = ("a model is built into a bundle on a host ('edgesdk build'), copied to the board ('edgesdk deploy') "
                "and served from the start (edgesdk serve BUNDLE..., or --models-dir)")
UNMANAGED = {
    "/api/push": "push models to a registry: " + BUNDLES_MADE,
    "/api/create": "create models: " + BUNDLES_MADE,
    "/api/copy": "copy models: a served model's other name is given at the start (edgesdk serve --alias NAME)",
    "/api/delete": "delete models: stop edgesdk serve and remove the bundle from the board (or from --models-dir)",
    BLOBS_ROUTE: "take a model's files: " + BUNDLES_MADE,
}
# The statuses Ollama's pull streams for a model it has already (server/images.go, PullModel): the manifest asked for,
# each layer found whole (a line per layer of Ollama's blobs, which a bundle has none of), the digests checked, the
# manifest written, then success; the last is the whole of a non-streamed pull's answer
PULL_STATUSES = ("pulling manifest", "verifying sha256 digest", "writing manifest", "success")
PULLED = {"status": PULL_STATUSES[-1]}
RUNNING = "Ollama is running"  # what Ollama answers GET / and HEAD / with, the probe clients send first
# The Ollama release whose API these routes follow (thinking, tool_name; logprobs came in 0.12.11): clients that
# check /api/version for a feature's minimum read this.
API_VERSION = "0.12.11"
CONTENT_TYPE = "application/x-ndjson"
ROLES = ("system", "user", "assistant", "tool")
# roles read as another, as the Responses route reads OpenAI's newer name for the system message
ROLE_ALIASES = {"developer": "system"}
# options read as the chat route's fields of the same name; any other option Ollama knows (num_gpu, num_thread ...)
# but num_keep (the context shift's) sets how a model is loaded or kept and changes nothing here, and one it does
# not know Ollama ignores
SAMPLING_OPTIONS = ("temperature", "top_p", "top_k", "min_p", "seed", "repeat_penalty", "repeat_last_n",
                    "presence_penalty", "frequency_penalty")
# the penalties the chat route takes in OpenAI's range [-2, 2] alone, which Ollama passes to its sampler whatever their
# finite value (api/types.go ``Options``: float32 fields, read unchecked)
UNBOUNDED_PENALTIES = ("presence_penalty", "frequency_penalty")
CHAT_ROUTE_MAX_PENALTY = 2.0
# Ollama's samplers this runtime lacks -> their off value
SAMPLERS_OFF = {"typical_p": 1.0}
# options Ollama has dropped (tfs_z, then the mirostat ones and penalize_newline; the version followed has none): its
# Options.FromMap answers the request and logs "invalid option provided" for each, whatever its value
DROPPED_OPTIONS = ("mirostat", "mirostat_tau", "mirostat_eta", "tfs_z", "penalize_newline")
# the chat route's field -> the Ollama field an error names
OLLAMA_FIELDS = {"max_tokens": "options.num_predict", "stop": "options.stop", "response_format": "format",
                 "json_schema": "format", "chat_template_kwargs": "think",
                 **{name: f"options.{name}" for name in SAMPLING_OPTIONS}}
THINK_LEVELS = ("high", "medium", "low")  # gpt-oss's levels; any is thinking on here
# where a JSON schema holds schemas: one, an array of them, or an object of them by name
ONE_SCHEMA = ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else")
SCHEMA_LISTS = ("items", "prefixItems", "anyOf", "oneOf", "allOf")
SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
# keep_alive as a string: Go's time.ParseDuration, which api/types.go's Duration.UnmarshalJSON calls: an optional sign,
# then "0" alone or one or more decimal numbers each with its unit
GO_DURATION = re.compile(r"([-+]?)(?:(0)|((?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:ns|us|\u00b5s|\u03bcs|ms|s|m|h))+))")
GO_DURATION_PART = re.compile(r"([0-9]+\.?[0-9]*|\.[0-9]+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
GO_UNIT_NS = {"ns": 1, "us": 1e3, "\u00b5s": 1e3, "\u03bcs": 1e3, "ms": 1e6, "s": 1e9, "m": 60e9, "h": 3600e9}
GO_LONGEST_DURATION_NS = 2**63 - 1  # time.Duration is an int64 of nanoseconds
# /api/ps's expires_at for a model kept loaded: Ollama's for keep_alive < 0 (now plus Go's longest time.Duration,
# about 292 years), as the board keeps its one model for as long as the server runs
KEPT_LOADED_UNTIL = "2318-01-01T00:00:00Z"
KEEP_ALIVE_ENV = "OLLAMA_KEEP_ALIVE"  # Ollama's default keep_alive for a request that gives none
NANOSECONDS_PER_MS = 1_000_000  # Ollama's durations are nanoseconds, the completer's timings milliseconds
CPU_BACKENDS = ("ort-cpu",)  # the backends (edgesdk.runtime.session) whose model is not in the GPU's memory
# the graph's float types as Ollama's quantization_level names them (ggml type names)
FLOAT_TYPE_NAMES = {"fp32": "F32", "float32": "F32", "fp16": "F16", "float16": "F16", "bf16": "BF16"}


# ------------------------------------------------------------------------------------------------ requests


@dataclass(frozen=True)
class Asked:
    """An Ollama request, checked: the model name as the client gave it (answers echo it), the request it means
    (None: nothing to generate, the model is only to be loaded), whether it came to /api/chat, its ``num_ctx``
    and its ``think`` (None where absent); for /api/chat, per message where a conversation cut there begins so that
    no tool result is kept without its call (:func:`cut_starts`)."""

    model: str
    request: CompletionRequest | None
    chat: bool
    num_ctx: int | None = None
    think: bool | None = None
    cuts: tuple[int, ...] = ()
    # Ollama's ``truncate`` (on unless false): /api/chat drops the oldest messages that do not fit; false refuses a
    # prompt past the context on both routes. ``shift`` (on unless false): a full context shifts and the answer goes
    # on; false, the answer stops there (done_reason "length")
    truncate: bool = True
    shift: bool = True
    num_keep: int = 4  # options.num_keep: the tokens kept where the context shifts (Ollama's DefaultOptions: 4)
    tools: bool = False  # /api/chat: ``tools`` given, which the model's chat template must render (Ollama's capability)
    unload: bool = False  # nothing to generate and ``keep_alive`` zero: Ollama's request to unload the model
    # /api/generate's ``suffix``: the model must have FIM tokens (Ollama's insert capability); ``infill``: the prompt is
    # the prefix of a fill-in-the-middle prompt (not ``raw``, which leaves the suffix out)
    suffix: str = ""
    infill: bool = False
    # /api/generate: ``raw`` (no template, and no ``context`` answered), and the ``context`` ids sent back, whose text
    # goes in front of the prompt (:func:`_with_context`)
    raw: bool = False
    context: tuple[int, ...] = ()


@dataclass(frozen=True)
class _Common:
    """The fields /api/chat and /api/generate share, checked: the body as an object, the model name, whether
    ``keep_alive`` is zero, the chat route's fields that ``stream``, ``format`` and ``options`` set, the stop
    strings, ``num_ctx``, ``think``, the number of ``top_logprobs`` (None: no log-probabilities), ``truncate`` and
    ``shift`` (api/types.go, ``*bool`` on both requests: true where absent, as routes.go reads them)."""

    body: dict
    model: str
    unload: bool
    fields: dict
    stops: tuple[str, ...]
    window: int | None
    think: bool | None
    top: int | None
    truncate: bool = True
    shift: bool = True
    num_keep: int = 4


# Ollama's options of Go's int type: its ``Options.FromMap`` (api/types.go) sets them from the JSON's numbers, which
# Go decodes as float64, with ``field.SetInt(int64(t))``: 4096.0 is 4096 there
WHOLE_OPTIONS = ("num_keep", "seed", "num_predict", "top_k", "repeat_last_n", "num_ctx", "num_batch", "num_gpu",
                 "main_gpu", "num_thread")
# Ollama's load options (api/types.go, ``Runner``), which change nothing here but which its ``Options.FromMap`` still
# refuses where a value is not of the field's type ("option %q must be of type integer" / "boolean")
LOAD_OPTIONS = {"num_batch": "integer", "num_gpu": "integer", "main_gpu": "integer", "num_thread": "integer",
                "use_mmap": "boolean"}
# every option Ollama knows (api/types.go: the JSON names of ``Options`` and of the ``Runner`` it embeds); its
# Options.FromMap logs "invalid option provided" for any other and answers the request without it
KNOWN_OPTIONS = (*SAMPLING_OPTIONS, *SAMPLERS_OFF, *LOAD_OPTIONS, "num_ctx", "num_keep", "num_predict", "stop")


def _as_ollama_reads(body: dict) -> dict:
    """``body`` with its ``options`` as Ollama reads them. Values of other types are left for the checks that name
    them; numbers are read as Ollama reads them before they reach its sampler:

    * an option of Go's int type given as a float is its whole part, as ``Options.FromMap`` sets it (``int64(t)``,
      which cuts a fraction off toward 0): 4096.0 (what Python and JavaScript clients send for a float variable) is
      4096, 4096.5 is 4096 and 0.5 is 0 (so ``num_ctx`` 0.5 is 4, below), before the clamps below read it;
    * ``top_k`` below 0 is 0, the top-k sampler off, as llama.cpp's sampler reads any k <= 0
      (``llama_sampler_top_k_impl``);
    * ``num_ctx`` below 4 is 4, as Ollama's scheduler reads it (server/sched.go ``GetRunner``: ``if opts.NumCtx < 4
      { opts.NumCtx = 4 }``), 0 and any number below 0 included;
    * ``num_predict`` below 0 is -1, no limit (llm/server.go: ``if req.Options.NumPredict < 0`` it runs to ten times
      the context), and ``num_keep`` below 0 is -1, the whole prompt (runner.go ``NewSequence``: ``if
      params.numKeep < 0 { params.numKeep = len(inputs) }``);
    * the sampler's ranges as Ollama's ``sample.NewSampler`` (sample/samplers.go) clamps them: ``temperature``
      below 0 is 0 (greedy), any other finite value sampled as given, as the chat route takes it,
      ``top_p`` above 1 is 1 (off) and at or below 0 keeps the likeliest token alone (its ``topP`` transform, like
      llama.cpp's ``llama_sampler_top_p``, keeps tokens until their sum passes p: here ``top_k`` 1), ``min_p``
      below 0 is 0 and above 1 is 1, and a ``repeat_penalty`` of 0 or less is 1 (off); a ``seed`` below -1 is a
      fixed seed, not a random one, as ``NewSampler`` seeds its generator with any seed but -1 (``uint64(seed)``:
      here the same number modulo 2**64)."""
    options = body.get("options")
    if not isinstance(options, dict):
        return body
    read = dict(options)

    def number(name: str) -> float | None:
        # an int is finite whatever its size (math.isfinite raised OverflowError on a JSON integer past a double)
        value = read.get(name)
        finite = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
        return value if finite and not isinstance(value, bool) else None

    for name in WHOLE_OPTIONS:
        value = number(name)
        if isinstance(value, float):
            read[name] = math.trunc(value)  # Go's int64(t): the fraction cut off toward 0
    clamps = {"top_k": (0, None), "num_ctx": (4, None), "num_predict": (-1, None), "num_keep": (-1, None),
              "temperature": (0, None), "top_p": (None, 1), "min_p": (0, 1)}
    for name, (low, high) in clamps.items():
        value = number(name)
        if value is not None and low is not None and value < low:
            read[name] = low
        elif value is not None and high is not None and value > high:
            read[name] = high
    penalty = number("repeat_penalty")
    if penalty is not None and penalty <= 0:
        read["repeat_penalty"] = 1.0
    top_p = number("top_p")
    if top_p is not None and top_p <= 0:  # the nucleus of p 0 is the likeliest token alone: top-k 1, top-p off
        read.update(top_p=1.0, top_k=1)
    seed = read.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and seed < -1:
        read["seed"] = seed % 2**64  # NewSampler: any seed but -1 is fixed, ``uint64(seed)``
    return {**body, "options": read}


def _common(body: object, served: str) -> _Common:
    """The fields of an /api/chat or /api/generate body that both routes read the same way."""
    body = _as_ollama_reads(_object(body))
    model = _model_name(body, served)
    unload = _check_keep_alive(body)
    fields = _stream_and_format(body)
    options, stops, window = _options(body)
    return _Common(body, model, unload, {**fields, **options}, stops, window, _think(body), _logprobs(body),
                   _bool_field(body, "truncate", True), _bool_field(body, "shift", True), _num_keep(body))


def parse_chat(body: object, served: str) -> Asked:
    """``POST /api/chat``: the chat request it means, or none (no messages: the model is to be loaded)."""
    common = _common(body, served)
    body, model = common.body, common.model
    messages = body.get("messages")
    tools = bool(body.get("tools"))
    if messages is None or messages == []:
        return Asked(model, None, chat=True, think=common.think, unload=common.unload, tools=tools)
    if not isinstance(messages, list):
        raise ApiError(400, f"'messages' must be an array of {{\"role\", \"content\"}} objects, got "
                       f"{json_shown(messages)}", param="messages")
    turns = _messages(messages)
    chat = {**common.fields, "messages": [turn if turn["role"] in ROLES else {**turn, "role": "user"} for turn in turns],
            **_logprobs_and_think(common.top, common.think)}
    if tools:
        chat["tools"] = _tools(body["tools"])  # Ollama's tools are OpenAI's ({"type": "function", "function": ...})
        # Ollama has no parallel flag: its tool parser takes every call an unconstrained model writes (tools/tools.go,
        # Parser.Add). Here the answer is constrained, and the list form lets a small model go on calling: SmolLM2-135M
        # added an unasked second call to every one of 5 requests and ran one to max_tokens with 10 calls, where the
        # one-call form gave one call each. So an answer makes one call, as on the chat route by default.
    request = _with_roles(_parsed(parse_chat_request, chat, common.stops), turns)
    return Asked(model, request, chat=True, num_ctx=common.window,
                 think=common.think, cuts=cut_starts(turns), truncate=common.truncate, shift=common.shift, num_keep=common.num_keep,
                 tools=tools)


def parse_generate(body: object, served: str) -> Asked:
    """``POST /api/generate``: ``prompt`` (with ``system``) as the chat request it means, or with ``raw`` the text
    request; an empty prompt asks for the model to be loaded, nothing generated. ``context`` is read as token ids
    here and checked against the vocabulary in :func:`windowed`; with ``raw`` it and ``system`` are refused, as
    Ollama's GenerateHandler refuses them ("raw mode does not support template, system, or context") after its
    unload answer, which comes first."""
    common = _common(body, served)
    body, model, think, top = common.body, common.model, common.think, common.top
    suffix = body.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise ApiError(400, f"'suffix' must be a string (the text after the insertion), got {json_shown(suffix)}",
                       param="suffix")
    _refuse_if_set(body, "images", "this model reads text only")
    _refuse_if_set(body, "template", "the prompt renders through the bundle's chat template (send 'raw': true with "
                   "a prompt already templated)")
    context = _context(body)
    raw = _bool_field(body, "raw", False)
    prompt, system = body.get("prompt"), body.get("system")
    if prompt is not None and not isinstance(prompt, str):
        raise ApiError(400, f"'prompt' must be a string, got {json_shown(prompt)}", param="prompt")
    if system is not None and not isinstance(system, str):
        raise ApiError(400, f"'system' must be a string, got {json_shown(system)}", param="system")
    if raw and (context or system) and (prompt or not common.unload):
        name = "context" if context else "system"
        raise ApiError(400, f"raw mode does not support template, system, or context: '{name}' cannot be sent with "
                       f"'raw': true, a raw prompt being sent as given; leave '{name}' out (put a system prompt in "
                       "the raw text), or send 'raw': false", param=name)
    if not prompt:
        return Asked(model, None, chat=False, think=think, unload=common.unload, suffix=suffix or "",
                     truncate=common.truncate, shift=common.shift, num_keep=common.num_keep)
    if raw or suffix:  # a suffix's prompt is built in windowed(), where the model's FIM tokens are known
        text = {**common.fields, "prompt": prompt, **({} if top is None else {"logprobs": top})}
        return Asked(model, _parsed(parse_text_request, text, common.stops), chat=False, num_ctx=common.window,
                     think=think, suffix=suffix or "", infill=bool(suffix) and not raw, raw=raw, context=context,
                     truncate=common.truncate, shift=common.shift, num_keep=common.num_keep)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    chat = {**common.fields, "messages": messages, **_logprobs_and_think(top, think)}
    try:
        request = _parsed(parse_chat_request, chat, common.stops)
    except ApiError as exc:
        if exc.param and exc.param.startswith("messages"):
            raise _in_generate_terms(exc, len(messages) - 1) from None
        raise
    return Asked(model, request, chat=False, num_ctx=common.window, think=think, context=context,
                 truncate=common.truncate, shift=common.shift, num_keep=common.num_keep)


def _in_generate_terms(exc: ApiError, prompt_index: int) -> ApiError:
    """The chat route's error on the messages /api/generate's ``prompt`` (message ``prompt_index``) and ``system``
    make, with the field the client sent named instead of a message it never wrote (its param and its text; the
    message is found in either, the prompt's check at render time naming it in its text alone)."""
    where = re.search(r"messages\[(\d+)\]", f"{exc.param} {exc.message}")
    field = "system" if where is not None and int(where.group(1)) != prompt_index else "prompt"
    exc.message = re.sub(r"'?messages\[\d+\](?:\.content)?'?", f"'{field}'", exc.message)
    exc.param = field
    return exc


def _context(body: dict) -> tuple[int, ...]:
    """``context``: the token ids an earlier /api/generate answer ended with (api/types.go,
    ``GenerateRequest.Context []int``); none where absent, null or empty. Anything but an array of whole numbers is
    refused, as Ollama's JSON decoding refuses it."""
    value = body.get("context")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(token, int) and not isinstance(token, bool)
                                              for token in value):
        raise ApiError(400, f"'context' must be an array of token ids (whole numbers: the 'context' an earlier "
                       f"/api/generate answer ended with), got {json_shown(value)}", param="context")
    return tuple(value)


def windowed(completer: Completer, asked: Asked) -> CompletionRequest:
    """The request to run: what the model cannot do refused first, in Ollama's order (:func:`check_capabilities`),
    ``think`` left out on a model that thinks rendered as thinking on (:func:`_thinking_by_default`), a conversation
    that outgrows the context kept to what fits (:func:`trimmed`) unless ``truncate`` is false (Ollama's routes.go:
    ``truncate := req.Truncate == nil || *req.Truncate``; false: a prompt past the context is Ollama's 400,
    :func:`_refuse_past_the_context`), ``context`` put in front of the prompt (:func:`_with_context`), a prompt
    still past the context (/api/generate's, or /api/chat's last message with the system messages, which
    ``chatPrompt`` keeps whatever their length) cut as Ollama's runner cuts its input (:func:`_truncated_input`) and a
    ``num_ctx`` below the bundle's context bounding prompt and answer. A ``suffix``, not raw, makes the prompt
    /infill's (serve/infill.py). On /api/generate an error about the messages its ``prompt`` and ``system`` make
    names those fields (:func:`_in_generate_terms`)."""
    try:
        return _fitted(completer, asked)
    except ApiError as exc:
        if asked.chat or asked.request is None or not (exc.param or "").startswith("messages"):
            raise
        raise _in_generate_terms(exc, len(asked.request.messages) - 1) from None


def _fitted(completer: Completer, asked: Asked) -> CompletionRequest:
    """The request to run, as :func:`windowed` describes it, its errors in the chat route's terms."""
    check_capabilities(completer, asked)
    request = _thinking_by_default(completer, asked, asked.request)
    if not asked.chat and request.chat and not completer.runtime.tokenizer.has_chat_template:
        request = _through_the_default_template(request)
    if asked.infill:
        ids = infill.prompt_ids(completer, infill.plain_ids(completer, request.prompt, "prompt"),
                                infill.plain_ids(completer, asked.suffix, "suffix"), [], [])
        request = replace(request, prompt_tokens=tuple(ids))
    limit = completer.runtime.backend.max_context
    window = limit if asked.num_ctx is None else min(asked.num_ctx, limit)
    if request.chat and asked.truncate:  # truncate false: a conversation that does not fit is refused whole
        request = trimmed(completer, request, window, asked.num_ctx, asked.cuts)
    if asked.context:  # after the cut, as Ollama fits the messages (chatPrompt) before the context goes in front
        request = _with_context(completer, asked, request)
    if not asked.truncate:
        _refuse_past_the_context(completer, asked, request, window)
    else:  # a prompt still past the context is cut as Ollama's runner cuts it, on both routes
        request = _truncated_input(completer, asked, request, window)
    return _within_num_ctx(completer, asked, _shifting(asked, request, window))


def _within_num_ctx(completer: Completer, asked: Asked, request: CompletionRequest) -> CompletionRequest:
    """The request with a ``num_ctx`` below the bundle's context bounding prompt and answer: a prompt that leaves no
    room in it is a 400 naming ``options.num_ctx``; the answer shifts within it (``shift``), or stops where it fills.
    A ``num_ctx`` at or above the run's context (``-c``, by default the bundle's) is capped there, as Ollama caps it
    at the model's."""
    limit = completer.runtime.backend.max_context
    if asked.num_ctx is None or asked.num_ctx >= limit:  # above the run's context it is capped there, as Ollama's
        return request
    ids = completer.prompt_ids(request)
    room = asked.num_ctx - len(ids)
    if room < 1:
        raise ApiError(400, f"the prompt has {len(ids)} tokens, leaving no room for an answer within "
                       f"'options.num_ctx' {asked.num_ctx}; raise num_ctx (this model's context holds {limit}) or "
                       "shorten the prompt", param="options.num_ctx", code="context_length_exceeded")
    if asked.shift:  # the answer shifts within num_ctx, as Ollama's runner shifts its num_ctx-long cache
        return replace(request, shift_window=asked.num_ctx)
    asked_for = completer.defaults.max_tokens if request.max_tokens is None else request.max_tokens
    return replace(request, max_tokens=min(asked_for, room))


def _through_the_default_template(request: CompletionRequest) -> CompletionRequest:
    """/api/generate's prompt on a bundle without a chat template, as Ollama renders it for a model without one:
    through its default template ``{{ .Prompt }}`` (template/template.go, ``DefaultTemplate``, which
    server/images.go ``GetModel`` gives a model whose files carry no template), the prompt as given and ``system``
    left out, as that template does not read ``.System``; tokenized as a raw prompt is, BOS in front where the
    tokenizer adds it, as Ollama's runner encodes it (``addSpecial``). The client's messages stay on the request
    for the request log; a text request reads only its prompt."""
    return replace(request, chat=False, prompt=request.messages[-1]["content"], template_kwargs=None,
                   continue_final=False)


def _shifting(asked: Asked, request: CompletionRequest, window: int) -> CompletionRequest:
    """The request with Ollama's context shift: ``shift`` (on unless false) and ``options.num_keep``, whatever the
    server's ``--context-shift``; shifting, a token limit above ten times the context is cut to it, as llm/server.go
    cuts ``num_predict`` (-1 and -2 are, in the completer: ``SHIFTED_LIMIT_CONTEXTS``)."""
    limit = request.max_tokens
    if asked.shift and limit is not None and limit < UNTIL_THE_CONTEXT_FILLS:
        limit = min(limit, SHIFTED_LIMIT_CONTEXTS * window)
    return replace(request, max_tokens=limit, context_shift=asked.shift, n_keep=asked.num_keep,
                   keep_param="options.num_keep")


def _thinking_by_default(completer: Completer, asked: Asked, request: CompletionRequest) -> CompletionRequest:
    """The request with its chat template rendered thinking on where ``think`` is left out and the model thinks (its
    chat template writes a <think> block, /api/show's "thinking"), as Ollama renders it: its ChatHandler and
    GenerateHandler (server/routes.go, newest read: commit 00188139) set ``req.Think = true`` when the model has the
    thinking capability and the request has no ``think``, so the template's ``.Think`` is true, not the template's
    own default; the ``ollama`` CLI does the same from /api/show's capabilities (cmd/cmd.go,
    ``inferThinkingOption``). Here that is the chat template's ``enable_thinking`` true, as ``think: true`` sets it.
    ``think`` false, a raw prompt or a suffix's is left as it is, and so is a server whose operator turned thinking
    off (``serve --reasoning-budget 0``) or set ``enable_thinking`` (``--chat-template-kwargs``): Ollama's default
    stands in for the client's choice, not the operator's."""
    tokenizer = completer.runtime.tokenizer
    if asked.think is not None or not request.chat or not template_thinks(tokenizer.template_source) or \
            completer.defaults.reasoning_budget == 0 or \
            "enable_thinking" in {**tokenizer.template_kwargs, **(request.template_kwargs or {})}:
        return request
    return replace(request, template_kwargs={**(request.template_kwargs or {}), "enable_thinking": True})


def _refuse_past_the_context(completer: Completer, asked: Asked, request: CompletionRequest, window: int) -> None:
    """``truncate`` false: a prompt that does not leave room for an answer in ``window`` tokens is refused with
    Ollama's 400 (its runner, runner/ollamarunner/runner.go ``NewSequence``: ``if !params.truncate { return nil,
    errorInputTooLong }``, "the input length exceeds the context length", answered with status 400 and passed on by
    routes.go). Ollama refuses only a prompt longer than the context; here a prompt of ``window`` tokens is refused
    too, as it leaves no room for one token of answer before a shift (and none within a ``num_ctx`` below the
    bundle's context, where no shift happens)."""
    count = len(_input_ids(completer, request))
    if count < window:
        return
    from edgesdk.bundle import capped_context, held_setting

    limit = completer.runtime.backend.max_context
    built = getattr(completer.runtime.backend, "built_context", None)  # -c N below the bundle's context
    source = getattr(completer.runtime.backend, "context_source", "-c")  # ... or LLAMA_ARG_CTX_SIZE that held it
    capped = capped_context(limit, built, source) if window >= limit else None
    setting, whole = held_setting(source)
    within = (f"'options.num_ctx' {window}" if window < limit else
              capped or f"this model's context of {window}")
    fixes = (["send 'truncate': true (or leave it out) to drop the oldest messages until the rest fits"]
             if asked.chat else []) + \
        ([f"raise num_ctx (this model's context holds {limit})"] if window < limit else []) + \
        [f"shorten the {'conversation' if asked.chat else 'prompt'}"] + \
        ([f"restart the server with {setting} up to the bundle's {built} ({whole})"] if capped else [])
    raise ApiError(400, f"the input length exceeds the context length: the prompt has {count} tokens, leaving no "
                   f"room for an answer within {within}, and 'truncate' is false, so nothing is cut; "
                   + ", or ".join(fixes), param="messages" if asked.chat else "prompt", code="context_length_exceeded")


def _input_ids(completer: Completer, request: CompletionRequest) -> list[int]:
    """The request's prompt as token ids, as the completer tokenizes it (:meth:`Completer.prompt_ids`), also where
    they are more than the model's context holds (counted here, not refused: the caller fits or refuses them)."""
    try:
        return completer.prompt_ids(request)
    except ApiError as exc:
        if exc.code != "context_length_exceeded":
            raise
    tokenizer = completer.runtime.tokenizer
    return list(request.prompt_tokens) if request.prompt_tokens else \
        tokenizer.chat_ids(completer.rendered_chat(request)) if request.chat else \
        tokenizer.prompt_ids(request.prompt, raw=True)


def _truncated_input(completer: Completer, asked: Asked, request: CompletionRequest, window: int) -> CompletionRequest:
    """The request with a prompt that leaves no room for an answer in ``window`` tokens (the context, or a
    ``num_ctx`` below it) cut as Ollama's runner cuts its input where ``truncate`` is true, its default
    (runner/ollamarunner/runner.go ``NewSequence``: ``numKeep = min(numKeep, numCtx-1)``, then the first
    ``numKeep`` tokens kept, the ``len(inputs) - numCtx`` tokens after them dropped and the rest kept: "truncating
    input prompt"). ``options.num_keep`` is Ollama's (default 4; -1: the whole prompt, up to the window); the prompt
    is cut to ``window - 1`` tokens where Ollama's fills the window, so the first token of the answer has its room
    before the context shifts (``shift``) or the answer stops there (``shift`` false: done_reason "length"). This is
    how an ever-growing ``context`` (the deprecated conversation memory a client sends back each turn, whose text
    Ollama's answer goes on returning whole) keeps being answered once it outgrows the context: its oldest turns
    after the first tokens are the ones dropped. On /api/chat it is the prompt of what :func:`trimmed` kept: Ollama's
    ``chatPrompt`` (server/prompt.go) always keeps the last message and the system messages, whatever their
    length, and passes the prompt to the runner, which cuts it here; only ``truncate`` false refuses it
    (:func:`_refuse_past_the_context`). So too the second pass of a ``format`` after thinking (:func:`second_pass`).
    A prompt that fits, and a window of one token, are left as they are (the latter is the 400 of
    :func:`_within_num_ctx`)."""
    ids = _input_ids(completer, request)
    target = window - 1
    if len(ids) <= target or target < 1:
        return request
    keep = min(len(ids) if asked.num_keep < 0 else asked.num_keep, target - 1)
    return replace(request, prompt_tokens=tuple(ids[:keep] + ids[len(ids) - (target - keep):]))


def check_capabilities(completer: Completer, asked: Asked) -> None:
    """Refuse what the model cannot do, in the order Ollama's GenerateHandler and ChatHandler check it (server/
    routes.go), before the model is scheduled and so before a load answer, raw or not: ``think`` true where the model
    does not think (its chat template writes no <think> block: 400 "does not support thinking"); then
    ``scheduleRunner``'s ``Model.CheckCapabilities``: completion, which an embedding model lacks (a bundle whose model
    declares its pooling, listed by /api/show as "embedding" in place of "completion", :func:`capabilities`: 400
    ``"<model>" does not support chat`` or ``generate``), then tools where /api/chat is given ``tools`` (Ollama: where
    the template reads ``.Tools``; here any chat template renders them, the tools described in the system message as
    llama.cpp's generic tool-call format does (serve/tools.py), so only a bundle without a chat template, which
    /api/show lists without "tools", is refused: 400 ``<model> does not support tools``, as images.go's
    ``errCapabilities`` reads, the name unquoted), then insert where a ``suffix`` is given (FIM tokens: 400 "does not
    support insert")."""
    if asked.think and not template_thinks(completer.runtime.tokenizer.template_source):
        raise ApiError(400, f"'think' is true but \"{asked.model}\" does not support thinking (its chat template "
                       "writes no <think> block); leave 'think' out or send false", param="think")
    pooling = _declared_pooling(completer)
    if pooling is not None:
        route = CHAT_ROUTE if asked.chat else GENERATE_ROUTE
        raise ApiError(400, f"\"{asked.model}\" does not support {'chat' if asked.chat else 'generate'}: it is an "
                       f"embedding model (its bundle declares {pooling} pooling, and /api/show lists its capability "
                       f"\"embedding\", not \"completion\"), which {route} cannot answer; send its texts to "
                       f"{EMBED_ROUTE}, or serve a generative model", param="model")
    if asked.tools and completer.runtime.tokenizer.template_source is None:
        raise ApiError(400, f"{asked.model} does not support tools: this bundle's model has no chat template to "
                       "render them and the messages through (/api/show lists no \"tools\"); send the request "
                       "without 'tools', or serve a bundle with a chat template", param="tools")
    if asked.suffix:
        infill.require_fim(completer, GENERATE_ROUTE, param="suffix", status=400, model=asked.model)


def _with_context(completer: Completer, asked: Asked, request: CompletionRequest) -> CompletionRequest:
    """/api/generate's request with the text of its ``context`` in front of the prompt, as Ollama's GenerateHandler
    builds it (server/routes.go: the ids detokenized, each token's piece joined with special tokens written out as
    its runner's ``Detokenize`` joins them, :func:`pieces_text`; then the prompt rendered from ``prompt`` and
    ``system`` written after them), tokenized as one text with special tokens read and BOS in front where the
    tokenizer adds it, as the chat route tokenizes a rendered prompt (``ChatTokenizer.chat_ids``; Ollama's runner
    encodes the prompt with ``addSpecial``). With a ``suffix``, the context's text comes before the
    fill-in-the-middle prompt's ids. An id outside the vocabulary is refused naming ``context``; a prompt the
    context pushes past the model's context is cut as Ollama's runner cuts it (:func:`_truncated_input`), or with
    ``truncate`` false refused (:func:`_refuse_past_the_context`)."""
    vocabulary = completer.token_id_limit()
    for index, token in enumerate(asked.context):
        if not 0 <= token < vocabulary:
            raise ApiError(400, f"'context[{index}]' is {token}, which is not a token id of this model: its "
                           f"vocabulary has {vocabulary} ids, 0 to {vocabulary - 1}; send back the 'context' an "
                           "answer of this server gave, or leave 'context' out", param="context")
    tokenizer = completer.runtime.tokenizer
    if asked.infill:
        ids = tokenizer.encode(pieces_text(tokenizer, list(asked.context)), add_special_tokens=False) + \
            list(request.prompt_tokens)
    else:  # the messages through the chat template, or the prompt through Ollama's default one
        ids = tokenizer.chat_ids(_prompt_text(completer, asked, request))
    return replace(request, prompt_tokens=tuple(ids))


def _prompt_text(completer: Completer, asked: Asked, request: CompletionRequest) -> str:
    """The prompt of a non-raw /api/generate request as text, ``context`` in front: the messages through the chat
    template, the prompt as given on a bundle without one (:func:`_through_the_default_template`), or the
    fill-in-the-middle prompt's ids joined as pieces."""
    tokenizer = completer.runtime.tokenizer
    if asked.infill:
        return pieces_text(tokenizer, list(request.prompt_tokens))
    return (pieces_text(tokenizer, list(asked.context)) if asked.context else "") + \
        (completer.rendered_chat(request) if request.chat else request.prompt)


def trimmed(completer: Completer, request: CompletionRequest, window: int, num_ctx: int | None,
            cuts: tuple[int, ...] = (), tail: str = "") -> CompletionRequest:
    """The chat request with its oldest messages dropped, one at a time, until its prompt and the answer's room fit
    in ``window`` tokens, as Ollama keeps a conversation that outgrows the context (server/prompt.go,
    ``chatPrompt``: "truncates any messages that exceed the context window of the model, making sure to always
    include 1) the latest message and 2) system messages"):

    * each try renders the chat template over the system messages of the dropped part, then the rest in order
      (``append(system, msgs[startIdx:]...)``), and counts its tokens as the chat route does
      (:meth:`Completer.prompt_ids`);
    * a tool result is never kept without the assistant turn whose call it answers: a cut that would land inside
      the results of a call keeps that turn and its results together (``toolBlockStartIndex``), so the last
      message, where it is a tool result, comes with its call. ``cuts`` holds, per message the client sent, where a
      cut there begins (:func:`cut_starts`): the request's messages are those as text, tool turns included, with
      the tools' description as a system message put first where there was none (``with_instructions``);
    * "fits": Ollama compares the prompt's tokens with ``num_ctx`` alone because its runner shifts the context when
      the answer reaches it; here the answer's room is kept too, so the kept conversation is answered before any
      shift (and within a ``num_ctx`` below the bundle's context, where no shift happens): the answer's limit
      (``num_predict``, else the server's ``--max-new-tokens``), or one token where ``num_predict`` is -1 or -2;
    * a try the chat template refuses (a template that wants the roles to alternate, where the kept part would
      begin with an assistant turn) is passed over, dropping one more, as it could not be answered;
    * where no try leaves the answer's room (a ``num_predict`` too long for any), the longest try that leaves one
      token is taken, as with ``num_predict`` -1 and as Ollama's ``chatPrompt`` keeps every message that fits
      ``num_ctx``: the answer shifts (or, ``shift`` false, stops where the context fills), rather than the whole
      conversation but its last message dropped for room no try can give;
    * where no try leaves even one token (the last message with the system messages, or with ``tail``, past the
      window), the one with the fewest tokens is taken and the caller cuts its prompt as Ollama's runner cuts its
      input (:func:`_truncated_input`), as Ollama's ``chatPrompt`` keeps that message whatever its length ("Must
      always include at least the last message") and its runner truncates what it is given where ``truncate`` is
      true (runner/ollamarunner/runner.go ``NewSequence``).

    Nothing is dropped where the whole conversation fits; its errors (a message that is not UTF-8, a template that
    refuses it) are the request's as before.

    ``tail``: text the prompt goes on with after the rendered messages (the thinking of a format's first pass,
    :func:`second_pass`), counted with each try; it is Ollama's last message there, always kept, so the client's
    last message may be dropped too (a last try of the system messages alone) where nothing else fits."""
    messages = request.messages
    sent = cuts or tuple(range(len(messages)))  # per message the client sent
    extra = len(messages) - len(sent)  # a system message of the tools' description, put first
    asked_for = completer.defaults.max_tokens if request.max_tokens is None else request.max_tokens
    room = 1 if asked_for >= UNTIL_THE_CONTEXT_FILLS else max(asked_for, 1)
    tried: list[dict] | None = None
    fewest: tuple[int, CompletionRequest] | None = None
    longest_fitting: CompletionRequest | None = None  # the first try that leaves one token, the room of -1
    starts = [extra + cut for cut in sent] + ([len(messages)] if tail else [])
    for index, start in enumerate(starts):
        kept = [message for message in messages[:start] if message["role"] == "system"] + list(messages[start:])
        if kept == tried:  # a system message dropped is kept in front: the same prompt as the last try
            continue
        tried = kept
        candidate = request if index == 0 else replace(request, messages=tuple(kept))
        try:
            count = len(completer.runtime.tokenizer.chat_ids(completer.rendered_chat(candidate) + tail))
        except ApiError:
            if index == 0:
                raise
            continue
        if count + room <= window:
            return candidate
        if longest_fitting is None and count + 1 <= window:
            longest_fitting = candidate
        if fewest is None or count < fewest[0]:
            fewest = (count, candidate)
    return longest_fitting or fewest[1]


def cut_starts(turns: list[dict]) -> tuple[int, ...]:
    """Per message, where a conversation cut there begins so that no tool result is kept without its call: a tool
    result's cut begins at the assistant turn whose calls it and the results before it answer, any other's at
    itself (Ollama's server/prompt.go, ``toolBlockStartIndex``)."""
    starts = []
    for index, turn in enumerate(turns):
        start = index
        if turn["role"] == "tool":
            while start > 0 and turns[start - 1]["role"] == "tool":
                start -= 1
            start = start - 1 if start > 0 and turns[start - 1].get("tool_calls") else index
        starts.append(start)
    return tuple(starts)


def _model_name(body: dict, served: str) -> str:
    """``model`` (older clients' ``name``, as /api/show and /api/delete took it, read where ``model`` is absent or
    empty as Ollama's ShowHandler reads it: ``if req.Model != "" {} else if req.Name != "" { req.Model = req.Name }``;
    a Go client filling the deprecated ``Name`` sends ``"model": ""`` beside it, the field having no omitempty),
    refused unless it is a name the served model answers to (:func:`served_names`, compared as Ollama compares
    names, :func:`~edgesdk.serve.model_pool.ollama_key`: case-folded, ``latest`` the default tag): Ollama's 404
    "model not found"."""
    name = body.get("model")
    if name is None or name == "":  # Go's clients send both fields, "model": "" beside the deprecated "name"
        name = body.get("name", name)
    if not isinstance(name, str) or not name:
        raise model_required(name, [served])
    if ollama_key(name) != ollama_key(served):  # Qwen finds qwen, and qwen:latest: Ollama's getExistingName
        raise ApiError(404, f"model '{name}' not found: this server serves '{served_names(served)[-1]}' "
                       "(GET /api/tags lists it)", param="model", code="model_not_found")
    return name


def management_methods(route: str) -> tuple[str, ...]:
    """The methods Ollama takes on ``route`` where it is one of its model-management routes, else none."""
    path = route.rstrip("/")
    if path.startswith(BLOBS_ROUTE) and len(path) > len(BLOBS_ROUTE):
        return ("HEAD", "POST")
    method = MANAGEMENT_ROUTES.get(path)
    return (method,) if method is not None else ()


# ------------------------------------------------------------------------------------------------ origins
#
# Ollama answers a browser's request on its routes only from the origins it allows (server/routes.go, its CORS
# middleware: gin-contrib/cors with envconfig.AllowedOrigins): the page's own host, local pages and apps, and those
# OLLAMA_ORIGINS adds; any other origin is a 403, so that a web page the user visits cannot drive the local model.
# llama-server's routes answer every origin (its pre-routing handler copies Origin back), and so do this server's.

# envconfig.AllowedOrigins: localhost, 127.0.0.1 and 0.0.0.0 over http and https on any port, and desktop apps' pages
LOCAL_ORIGINS = tuple(f"{scheme}://{host}{port}" for host in ("localhost", "127.0.0.1", "0.0.0.0")
                      for port in ("", ":*") for scheme in ("http", "https")) + \
    ("app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*")


def parse_origins(text: str | None) -> tuple[str, ...]:
    """The origins ``--ollama-origins`` (or OLLAMA_ORIGINS) adds, comma-separated as Ollama reads OLLAMA_ORIGINS:
    each a scheme and host (``https://example.com``) where one ``*`` stands for any text (``https://*.example.com``,
    ``chrome-extension://*``; ``*`` alone: every origin), as gin-contrib/cors matches them with AllowWildcard."""
    origins = tuple(item.strip() for item in (text or "").strip().strip("\"'").split(",") if item.strip())
    for origin in origins:
        if origin.count("*") > 1 or ("*" not in origin and "://" not in origin):
            raise EdgeSDKError(f"--ollama-origins (OLLAMA_ORIGINS) holds {origin!r}; expected an origin, a scheme and "
                               "host such as https://example.com, with at most one '*' for any text",
                               "give origins as https://example.com,https://*.example.com,chrome-extension://* "
                               "('*' alone allows every origin)")
    return origins


def origin_allowed(origin: str, host: str | None, added: Sequence[str] = ()) -> bool:
    """Whether a request from a page of ``origin`` (its Origin header) may use Ollama's routes: the server's own
    ``host`` (its Host header, the page's own server: no cross-origin request), :data:`LOCAL_ORIGINS` or one of
    ``added`` (:func:`parse_origins`), matched without regard to case."""
    origin = origin.lower()
    if host and origin in (f"http://{host.lower()}", f"https://{host.lower()}"):
        return True
    for pattern in (*LOCAL_ORIGINS, *added):
        head, star, tail = pattern.lower().partition("*")
        if origin == head if not star else \
                (len(origin) >= len(head) + len(tail) and origin.startswith(head) and origin.endswith(tail)):
            return True
    return False


def origin_refused(origin: str) -> ApiError:
    """The 403 of a request on Ollama's routes from an origin it does not allow (:func:`origin_allowed`)."""
    return ApiError(403, f"origin {origin!r} may not use Ollama's routes: they answer the server's own pages, local "
                    "origins (localhost, 127.0.0.1, app://, file://, ...) and those --ollama-origins adds",
                    code="forbidden", kind="forbidden_error")


def unmanaged(route: str) -> ApiError:
    """The 501 of a model-management route this server does not do (all but a pull of a model served), saying what
    edgesdk does instead."""
    path = route.rstrip("/")
    what = UNMANAGED[BLOBS_ROUTE if path.startswith(BLOBS_ROUTE) else path]
    return ApiError(501, f"edgesdk serve does not {what}", code="not_supported", kind="not_supported_error")


def parse_pull(body: object, served: Sequence[str]) -> bool:
    """Whether a pull's answer streams (``stream``: true unless false, as Ollama's PullHandler reads it), its model
    (``model``, or the older ``name``) checked to be one ``served``: another is the 501 that says edgesdk serve
    downloads no model and how a bundle of it comes to the board."""
    body = _object(body)
    stream = _bool_field(body, "stream", True)
    name = body.get("model")
    if name is None or name == "":
        name = body.get("name", name)
    if not isinstance(name, str) or not name:
        raise model_required(name, served)
    if not any(ollama_key(name) == ollama_key(model) for model in served):
        listed = ", ".join(repr(served_names(model)[-1]) for model in served)
        raise ApiError(501, f"edgesdk serve does not pull models: it serves {listed} (GET /api/tags lists "
                       f"{'it' if len(served) == 1 else 'them'}), not {name!r}; to serve {name!r}, {BUNDLES_MADE}",
                       param="model", code="not_supported", kind="not_supported_error")
    return stream


def keep_alive_zero(body: object) -> bool:
    """Whether a request's ``keep_alive`` is zero (a value that is not a duration is the 400 of
    :func:`_check_keep_alive`): Ollama unloads the model once such a request's answer is written."""
    return isinstance(body, dict) and _check_keep_alive(body)


def model_required(name: object, served: Sequence[str]) -> ApiError:
    """The 400 of a body without a model's name (``name``: what it gave instead: none, an empty one, or a value
    that is not a name, such as a number, which is named as what is wrong), naming the models ``served``."""
    wrong = "'model' is required" if name is None or name == "" else "'model' must be a string"
    if len(served) == 1:
        return ApiError(400, f"{wrong}: the model's name, {served_names(served[0])[-1]!r} here "
                        f"(GET /api/tags lists it), got {json_shown(name)}", param="model")
    listed = ", ".join(repr(served_names(model)[-1]) for model in served)
    return ApiError(400, f"{wrong}: the name of one of the models served here, {listed} (GET "
                    f"/api/tags lists them), got {json_shown(name)}", param="model")


def model_not_found(name: str, served: Sequence[str] = ()) -> ApiError:
    """Ollama's 404 for a model it does not have (server/routes.go: ``model %q not found, try pulling it first``),
    the models ``served`` named after Ollama's text (its clients read the status, 404, to offer a pull)."""
    listed = ", ".join(_go_quoted(served_names(model)[-1]) for model in served)
    after = f" (this server serves {listed}; GET /api/tags lists them)" if served else ""
    return ApiError(404, f"model {_go_quoted(name)} not found, try pulling it first{after}", param="model",
                    code="model_not_found")


def _check_keep_alive(body: dict) -> bool:
    """``keep_alive`` checked (:func:`keep_alive`), and whether it is zero: with nothing to generate, Ollama unloads
    the model then (:func:`loaded`)."""
    return keep_alive(body) == 0


def keep_alive(body: object) -> float | None:
    """A request's ``keep_alive`` in seconds (None: not given, the server's default holds; ``math.inf``: kept
    loaded), read as api/types.go's ``Duration.UnmarshalJSON`` reads it: a number of seconds (below 0: forever) or a
    Go duration string (``"5m"``, ``"1h30m"``, ``"0"``; a negative one: forever), anything else refused as Ollama
    refuses it. With several bundles served, the model goes once it has been idle that long (serve/model_pool.py);
    a board serving one bundle keeps its model loaded whatever it says."""
    keep = body.get("keep_alive") if isinstance(body, dict) else None
    if keep is None:
        return None
    if isinstance(keep, str):
        seconds = go_duration_s(keep)
        if seconds is None:  # ParseDuration: "invalid duration" (or its overflow)
            raise ApiError(400, f"'keep_alive' {json_shown(keep)} is not a duration: send a number of seconds (-1: keep "
                           "loaded) or a Go duration such as \"5m\", \"1h30m\" or \"0\" (units ns, us, ms, s, m, "
                           "h; at most 2562047h)", param="keep_alive")
        return seconds
    if isinstance(keep, bool) or not isinstance(keep, (int, float)) or math.isnan(keep):
        raise ApiError(400, f"'keep_alive' must be a duration (\"5m\", or seconds), got {json_shown(keep)}",
                       param="keep_alive")
    if keep < 0 or keep * 1e9 > GO_LONGEST_DURATION_NS:  # below 0 it is forever; past Go's longest, as good as
        return math.inf
    return _whole_ns(keep * 1e9)  # time.Duration(t * float64(time.Second)): 0 below a nanosecond


def go_duration_s(text: str) -> float | None:
    """Go's ``time.ParseDuration`` of ``text`` in seconds, as Ollama reads a ``keep_alive`` string: whole
    nanoseconds (Go's time.Duration counts them), ``math.inf`` where it is negative (kept loaded, as Ollama keeps
    it); None where it is no duration or past Go's longest."""
    whole = GO_DURATION.fullmatch(text)
    if whole is None:
        return None
    nanoseconds = 0.0 if whole.group(2) else \
        sum(float(number) * GO_UNIT_NS[unit] for number, unit in GO_DURATION_PART.findall(whole.group(3)))
    if nanoseconds > GO_LONGEST_DURATION_NS:
        return None
    seconds = _whole_ns(nanoseconds * (-1 if whole.group(1) == "-" else 1))
    return math.inf if seconds < 0 else seconds


def _whole_ns(nanoseconds: float) -> float:
    """Seconds of a time.Duration of ``nanoseconds``, cut to whole nanoseconds toward zero, as Go converts it."""
    return float(int(nanoseconds)) / 1e9 + 0.0  # + 0.0: -0.0 is 0


def keep_alive_from_env(text: str | None, name: str = KEEP_ALIVE_ENV) -> float | None:
    """The server's default ``keep_alive`` in seconds from Ollama's ``OLLAMA_KEEP_ALIVE`` (``text``; None or empty:
    not set, None back), read as Ollama's envconfig ``KeepAlive`` reads it: surrounding spaces and quotes (``"`` and
    ``'``) dropped, as its ``Var`` drops them (a unit file's ``Environment="OLLAMA_KEEP_ALIVE='10m'"``), then a Go
    duration (``"5m"``), else a whole number of seconds; negative: kept loaded (``math.inf``); 0: unloaded after each
    answer. Anything else is refused naming the variable, where Ollama falls back to its 5 minutes with a warning in
    its log that a board's service hides (the caller decides whether the value matters: with one bundle served it
    does not, cli_serve._idle_unload_s)."""
    if text is None:
        return None
    text = text.strip().strip("\"'")
    if not text:
        return None
    seconds = go_duration_s(text)
    if seconds is None and re.fullmatch(r"[-+]?[0-9]+", text):
        number = int(text)
        seconds = math.inf if number < 0 else float(number)
    if seconds is None:
        raise EdgeSDKError(f"{name}={text!r} is not a duration (Ollama would fall back to its default of 5m)",
                           f"set {name} to a Go duration such as 5m, 1h30m or 0 (units ns, us, ms, s, m, h), or a "
                           "whole number of seconds; -1 keeps the model loaded")
    return seconds


def _stream_and_format(body: dict) -> dict:
    """The chat route's fields that ``stream`` (true unless false, as in Ollama) and ``format`` (``"json"``: a JSON
    object; a JSON schema: an answer of that schema; null or ``""``: none) mean. Any other ``format`` (another string,
    a number, an array, a boolean) is refused with Ollama's message (llm/server.go, ``Completion``: ``invalid
    format: %q; expected "json" or a valid JSON Schema object``, the format's JSON quoted as Go's %q quotes it).
    Ollama finds it only once the model is loaded and answers it 500 (an error without a status, which routes.go
    answers 500); here it is the client's 400, found before anything runs."""
    fields: dict = {"stream": _bool_field(body, "stream", True)}
    form = body.get("format")
    if form == "json":
        fields["response_format"] = {"type": "json_object"}
    elif isinstance(form, dict):
        fields["response_format"] = {"type": "json_schema",
                                     "json_schema": {"name": "format", "schema": json_schema(form)}}
    elif form not in (None, ""):
        sent = json.dumps(form, ensure_ascii=False, separators=(",", ":"))
        raise ApiError(400, f"invalid format: {_go_quoted(sent)}; expected \"json\" or a valid JSON Schema object: "
                       f"'format' is {json_shown(form)}; send \"json\" for any JSON object, a JSON schema object "
                       "({\"type\": \"object\", \"properties\": {...}}) for an answer of that schema, or leave "
                       "'format' out", param="format")
    return fields


def _go_quoted(text: str) -> str:
    """JSON text as Go's ``%q`` (strconv.Quote) writes it: in double quotes, with ``\\`` and ``"`` escaped (JSON
    text writes its control characters escaped already)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _options(body: dict) -> tuple[dict, tuple[str, ...], int | None]:
    """``options``: (the chat route's fields they set, the stop strings, ``num_ctx``)."""
    options = body.get("options")
    if options is None:
        return {}, (), None
    if not isinstance(options, dict):
        raise ApiError(400, f"'options' must be an object of model parameters ({{\"temperature\": 0}}), got "
                       f"{json_shown(options)}", param="options")
    _warn_invalid(options)
    fields = {name: options[name] for name in SAMPLING_OPTIONS if options.get(name) is not None}
    for name, off in SAMPLERS_OFF.items():
        value = options.get(name)
        if value is not None and not finite_number(value):  # its type is what is wrong, not the sampler it sets
            raise ApiError(400, f"option \"{name}\" must be of type float32 (as Ollama's Options.FromMap reads it): "
                           f"'options.{name}' is {json_shown(value)}; send {off} (off: this server does not have that "
                           "sampler), or leave it out", param=f"options.{name}")
        # typical-p does nothing from 1 up (llama.cpp's sampler returns at once, as the chat route reads it:
        # serve.api.sampler_off)
        if value is not None and value < off:
            raise ApiError(400, f"'options.{name}' = {json_shown(value)} is not supported: this server does not have that "
                           f"sampler; leave it out or set it to {off}", param=f"options.{name}")
    for name, kind in LOAD_OPTIONS.items():
        value = options.get(name)
        if value is None or (isinstance(value, bool) if kind == "boolean" else
                             isinstance(value, int) and not isinstance(value, bool)):
            continue
        example = "true or false" if kind == "boolean" else "a whole number"
        raise ApiError(400, f"option \"{name}\" must be of type {kind} (as Ollama's Options.FromMap reads it): "
                       f"'options.{name}' is {json_shown(value)}; send {example}, or leave it out (it sets how Ollama "
                       "loads a model and changes nothing here)", param=f"options.{name}")
    predict = options.get("num_predict")
    if predict is not None:
        # every number below 0 is -1 by now (_as_ollama_reads): Ollama gives -2 no meaning of its own (llm/server.go
        # reads any ``NumPredict < 0`` as ten times the context; the "-2 = fill context" of its old docs is gone)
        if isinstance(predict, bool) or not isinstance(predict, int):
            raise ApiError(400, f"'options.num_predict' must be a whole number: the most tokens to generate (>= 1), "
                           f"or -1 (any number below 0, or 0) for no limit, got {json_shown(predict)}",
                           param="options.num_predict")
        # 0 is no limit too: Ollama's runners stop at num_predict only where it is > 0 (runner/ollamarunner/runner.go:
        # ``seq.numPredict > 0 && seq.numPredicted >= seq.numPredict``)
        fields["max_tokens"] = UNTIL_THE_CONTEXT_FILLS if predict <= 0 else predict
    stops = options.get("stop")
    if stops is None:
        stops = []
    if not isinstance(stops, list) or not all(isinstance(stop, str) for stop in stops):
        raise ApiError(400, f"'options.stop' must be an array of strings, got {json_shown(stops)}",
                       param="options.stop")
    utf8_stops(stops, "options.stop")
    return fields, tuple(stop for stop in stops if stop), _num_ctx(options)


def _warn_invalid(options: dict) -> None:
    """Log Ollama's warning for each of ``options`` that Ollama does not know (:data:`KNOWN_OPTIONS`), a misspelt
    one with the known option nearest its name, and for each that Ollama no longer has (:data:`DROPPED_OPTIONS`):
    the option is ignored, whatever its value, and the request answered, as Ollama's ``Options.FromMap`` does
    (``slog.Warn("invalid option provided", "option", key)``, for every request that sends it)."""
    for name in options:
        if name in KNOWN_OPTIONS:
            continue
        if name in DROPPED_OPTIONS:
            why = "Ollama no longer has it: ignored"
        else:
            nearest = difflib.get_close_matches(str(name), KNOWN_OPTIONS, n=1)
            why = "not an option Ollama knows: ignored" + (f"; did you mean {nearest[0]!r}?" if nearest else "")
        LOG.warning("edgesdk serve: invalid option provided option=%s (%s)", name if name.isprintable() else ascii(name),
                    why)


def _num_keep(body: dict) -> int:
    """``options.num_keep``: the prompt's tokens kept where the context shifts (-1: all of them); Ollama's default 4
    where absent or null."""
    options = body.get("options")
    value = options.get("num_keep") if isinstance(options, dict) else None
    if value is None:
        return 4
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise ApiError(400, f"'options.num_keep' must be the prompt's tokens kept when the context shifts (a whole "
                       f"number >= 0, or -1 for all of them), got {json_shown(value)}", param="options.num_keep")
    return value


def _num_ctx(options: dict) -> int | None:
    """``options.num_ctx``: the request's context window in tokens (a whole number of at least 4 by now, where it is
    a number: :func:`_as_ollama_reads`), None where it is not set; anything else (a string, a boolean, an array, an
    infinite number) is refused naming it."""
    window = options.get("num_ctx")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int)):
        raise ApiError(400, f"'options.num_ctx' must be the context window in tokens (a whole number; below 4 it is "
                       f"4), got {json_shown(window)}", param="options.num_ctx")
    return window


def _logprobs(body: dict) -> int | None:
    """``logprobs`` and ``top_logprobs``: how many alternatives to list per token (0-20), or None for no
    log-probabilities. ``top_logprobs`` outside 0-20 is Ollama's 400; without ``logprobs`` true it lists nothing, as
    Ollama's runner computes them only where ``logprobs`` is set (api/types.go, ``GenerateRequest`` and
    ``ChatRequest``)."""
    wanted = _bool_field(body, "logprobs", False)
    top = body.get("top_logprobs")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS):
        raise ApiError(400, f"'top_logprobs' must be between 0 and {MAX_TOP_LOGPROBS} (the most likely tokens listed "
                       f"beside each token), got {json_shown(top)}", param="top_logprobs")
    return (top or 0) if wanted else None


def _think(body: dict) -> bool | None:
    """``think``: true or false, or gpt-oss's "high" / "medium" / "low" (thinking on); None when absent."""
    value = body.get("think")
    if value is None or isinstance(value, bool):
        return value
    if value in THINK_LEVELS:
        return True
    raise ApiError(400, f"'think' must be true, false or one of {', '.join(THINK_LEVELS)}, got {json_shown(value)}",
                   param="think")


def _logprobs_and_think(top: int | None, think: bool | None) -> dict:
    """The chat route's fields for Ollama's ``logprobs`` / ``top_logprobs`` (:func:`_logprobs`) and ``think`` (the
    chat template's ``enable_thinking``, as llama-server's ``chat_template_kwargs`` sets it)."""
    fields: dict = {}
    if top is not None:
        fields.update(logprobs=True, top_logprobs=top)
    if think is not None:
        fields["chat_template_kwargs"] = {"enable_thinking": think}
    return fields


def _bool_field(body: dict, name: str, default: bool) -> bool:
    """The JSON boolean ``name``, ``default`` where it is absent or null."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false, got {json_shown(value)}", param=name)
    return value


def _refuse_if_set(body: dict, field: str, why: str) -> None:
    """Refuse ``field`` where it is set to anything but empty, saying ``why`` it cannot be honoured."""
    if body.get(field) not in (None, "", [], {}):
        raise ApiError(400, f"'{field}' is not supported: {why}; leave '{field}' out", param=field)


def _parsed(parse, fields: dict, stops: tuple[str, ...]) -> CompletionRequest:
    """``fields`` parsed by the chat or text route's ``parse``, its errors naming the Ollama field
    (:func:`_in_ollama_terms`), with log-probabilities listed per token and any number of ``stops``; ``seed`` read
    as Ollama's sampler reads it (every seed but -1 fixed, 4294967295 too: edgesdk.serve.api._seed); any finite
    ``temperature`` sampled as given, as the chat route takes it and Ollama's sampler does (sample/samplers.go
    ``NewSampler`` clamps it below 0 alone, :func:`_as_ollama_reads`), and so is a ``presence_penalty`` or
    ``frequency_penalty`` past OpenAI's [-2, 2], any finite number (NaN, an infinity or what is no number refused by
    name)."""
    beyond = {}  # a penalty past the chat route's range -> its value
    for name in UNBOUNDED_PENALTIES:
        value = fields.get(name)
        if value is None:
            continue
        if not finite_number(value):
            raise ApiError(400, f"'options.{name}' must be a finite number (Ollama takes any, e.g. 1.5), got "
                           f"{json_shown(value)}; send a number, or leave it out (0: off)", param=f"options.{name}")
        if abs(value) > CHAT_ROUTE_MAX_PENALTY:
            beyond[name] = float(value)
    # a stronger penalty is checked as the chat route's nearest, then set as given
    checked = {**fields, **{name: math.copysign(CHAT_ROUTE_MAX_PENALTY, value) for name, value in beyond.items()}}
    try:
        request = parse(checked, ollama_seed=True)
    except ApiError as exc:
        raise _in_ollama_terms(exc) from None
    if beyond:
        request = replace(request, **beyond)
    if request.logprobs is not None:  # listed as llama-server's completion_probabilities (_ollama_logprobs)
        request = replace(request, llama_probs=True)
    if request.json_schema is not None:  # a schema refused mid-answer names the field the client wrote: format
        request = replace(request, schema_param="format")
    return replace(request, stop=stops) if stops else request  # any number of stop strings, as Ollama takes


def _in_ollama_terms(exc: ApiError) -> ApiError:
    """The chat route's error with the Ollama field it came from named instead."""
    field = OLLAMA_FIELDS.get(exc.param or "")
    if field is not None:
        message = exc.message.replace(f"'{exc.param}'", f"'{field}'")
        # a JSON schema's own errors lead with the field ("response_format: $...")
        if message.startswith(f"{exc.param}:"):
            message = f"'{field}'" + message[len(exc.param):]
        exc.message, exc.param = message, field
    return exc


def _messages(messages: list) -> list[dict]:
    """Ollama's messages as OpenAI's: an assistant's calls keep the ``id`` a client sends back (the one this
    server's answer gave them) or get one, and a tool turn the id of the call it answers (its ``tool_call_id`` where
    that names a call, :func:`_call_of_id`, as Open WebUI sends it; else a call of its ``tool_name``,
    :func:`_call_of_tool`; else the next call not yet answered), so it renders as on the chat route, naming the tool
    and the call."""
    out: list[dict] = []
    calls: list[tuple[str, str]] = []  # (id, name) of the calls made so far, in order
    renamed: dict[str, str] = {}  # the id given to a call whose own id an earlier call had -> the id the client sent
    latest = 0  # where the calls of the latest assistant turn that made any begin in ``calls``
    answered: set[str] = set()
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        role, content = _role_and_content(message, where)
        turn: dict = {"role": role, "content": content}
        if message.get("tool_calls"):
            latest = len(calls)
            turn["tool_calls"] = _assistant_calls(message, role, index, calls, renamed)
        if role == "tool":
            turn = _tool_turn(message, where, turn, calls, answered, latest, renamed)
        out.append(turn)
    return out


def _with_roles(request: CompletionRequest, turns: list[dict]) -> CompletionRequest:
    """The chat request parsed from ``turns`` with each turn of a role the chat route does not take (parsed as a
    user's: its content is read as any text is) given its own role again, for the chat template: Ollama renders
    every message with the role its client gave (``ipython`` for Llama 3.1's tool results, a template's own names),
    and a template that does not know it raises its own error, the request's 400 (edgesdk/runtime/text.py,
    ``render_chat``). The parsed messages are the turns', one each, after the system message of the tools'
    description where one was put first."""
    offset = len(request.messages) - len(turns)
    if all(turn["role"] in ROLES for turn in turns) or offset < 0:
        return request
    messages = list(request.messages)
    for index, turn in enumerate(turns):
        if turn["role"] not in ROLES:
            messages[offset + index] = {**messages[offset + index], "role": turn["role"]}
    return replace(request, messages=tuple(messages))


def _role_and_content(message: object, where: str) -> tuple[str, str]:
    """A message's ``role`` (``developer`` as ``system``, :data:`ROLE_ALIASES`; any other name as given, which
    Ollama's template is given as it is: :func:`_with_roles`) and ``content`` (a string; null as empty); ``images``
    refused."""
    if not isinstance(message, dict):  # not a message at all: its role is not what is wrong
        raise ApiError(400, f"{where} must be an object with 'role' and 'content' ({{\"role\": \"user\", "
                       f"\"content\": \"...\"}}), got {json_shown(message)}", param=where)
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise ApiError(400, f"{where}.role must be the name of who speaks, a string ({', '.join(ROLES)}, or another "
                       f"role the model's chat template takes), got {json_shown(role)}", param=f"{where}.role")
    if message.get("images"):
        raise ApiError(400, f"{where}.images is not supported: this model reads text only; send the message "
                       "without images", param=f"{where}.images")
    role, content = ROLE_ALIASES.get(role, role), message.get("content")
    content = "" if content is None else content
    if not isinstance(content, str):
        raise ApiError(400, f"{where}.content must be a string, got {json_shown(content)}", param=f"{where}.content")
    return role, content


def _assistant_calls(message: dict, role: str, index: int, calls: list[tuple[str, str]],
                     renamed: dict[str, str]) -> list[dict]:
    """An assistant message's ``tool_calls`` as OpenAI's (``arguments`` a JSON string), each keeping the ``id`` it
    comes back with where that is new, else ``call_<message>_<call>``; each call's (id, name) is added to ``calls``,
    and where an id it came back with was taken already (a client that numbers each turn's calls from 0), the id
    given in its place -> that id to ``renamed``, so that its result, which sends the client's id, finds it."""
    where = f"messages[{index}]"
    if role != "assistant" or not isinstance(message["tool_calls"], list):
        raise ApiError(400, f"{where}.tool_calls must be an assistant message's array of calls "
                       "({\"function\": {\"name\", \"arguments\"}})", param=f"{where}.tool_calls")
    out = []
    for number, call in enumerate(message["tool_calls"]):
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or \
                not isinstance(arguments, (dict, str, type(None))):
            raise ApiError(400, f"{where}.tool_calls[{number}] must be {{\"function\": {{\"name\": ..., "
                           f"\"arguments\": {{...}}}}}}, got {json_shown(call)}", param=f"{where}.tool_calls[{number}]")
        given = call.get("id")
        ident = given if isinstance(given, str) and given and given not in dict(calls) else f"call_{index}_{number}"
        if isinstance(given, str) and given and ident != given:
            renamed[ident] = given
        calls.append((ident, function["name"]))
        if isinstance(arguments, str):
            text = arguments
        else:  # a value nested deeper than Python's JSON writes is refused naming it, as the chat route refuses it
            param = f"{where}.tool_calls[{number}].function.arguments"
            try:
                text = arguments_text(arguments or {}, param)
            except ToolError as exc:
                raise ApiError(400, exc.message, param=exc.param) from exc
            utf8_field(text, param)  # a lone surrogate from a JSON escape, named as the client sent it
        out.append({"id": ident, "type": "function", "function": {"name": function["name"], "arguments": text}})
    return out


def _tool_turn(message: dict, where: str, turn: dict, calls: list[tuple[str, str]], answered: set[str],
               latest: int, renamed: dict[str, str]) -> dict:
    """A tool message as the chat route's: with the ``tool_call_id`` of the call it answers (:func:`_messages`),
    or, where no call of its ``tool_name`` was made, a user turn whose text names the tool (and the ``tool_call_id``
    the message sends, where it sends one), as the chat route renders a tool result (edgesdk/serve/tools.py)."""
    name, wanted = message.get("tool_name"), message.get("tool_call_id")
    if name is not None and not isinstance(name, str):
        raise ApiError(400, f"{where}.tool_name must be the name of the tool whose result this is, got "
                       f"{json_shown(name)}", param=f"{where}.tool_name")
    if wanted is not None and not isinstance(wanted, str):
        raise ApiError(400, f"{where}.tool_call_id must be the string id of the call it answers, got "
                       f"{json_shown(wanted)}", param=f"{where}.tool_call_id")
    for field, text in (("tool_name", name), ("tool_call_id", wanted)):  # either may reach the prompt's text
        if text is not None:
            utf8_field(text, f"{where}.{field}")
    sent = None if wanted is None else _call_of_id(wanted, calls, renamed, answered, latest)
    if sent is not None:
        ident = sent
    elif name is not None:
        ident = _call_of_tool(name, calls, answered, latest)
    else:
        ident = next((i for i, _ in calls if i not in answered), None)
    if ident is None:  # it answers no call made here: rendered with the id it sends, as the chat route renders it
        if name is None:
            return turn if wanted is None else {**turn, "tool_call_id": wanted}
        return {"role": "user", "content": tool_result_text(name, turn["content"], wanted)}
    answered.add(ident)
    return {**turn, "tool_call_id": ident}


def _call_of_id(wanted: str, calls: list[tuple[str, str]], renamed: dict[str, str], answered: set[str],
                latest: int) -> str | None:
    """The call a result sending ``tool_call_id`` ``wanted`` answers: of the calls that id names (the call of that
    id, and those the client sent with it that were given another, :func:`_assistant_calls`), the first in the latest
    turn of calls (from ``latest`` on) that no result has answered yet, so that a client numbering each turn's calls
    from 0 answers the call it just received, not an earlier turn's of the same number; else the latest of them
    (None where no call has that id): :func:`edgesdk.serve.api.answered_call`, as the chat route reads an id."""
    named = [(place, ident) for place, (ident, _) in enumerate(calls) if wanted in (ident, renamed.get(ident))]
    return answered_call(named, latest, answered)


def _call_of_tool(name: str, calls: list[tuple[str, str]], answered: set[str], latest: int) -> str | None:
    """The call a result that names only its ``tool_name`` answers: the first call of that tool in the latest turn
    of calls (from ``latest`` on) that no result has answered yet, so that the results of parallel calls of one tool,
    sent in the order of the calls as Ollama's clients send them, answer one call each; else the latest call of that
    tool (None where it was never called)."""
    waiting = (ident for ident, called in calls[latest:] if called == name and ident not in answered)
    return next(waiting, None) or next((ident for ident, called in reversed(calls) if called == name), None)


def _tools(tools: object) -> object:
    """Ollama's tools (OpenAI's ``{"type": "function", "function": ...}``) with each ``parameters`` schema as
    :func:`json_schema` reads it; anything else is left for the chat route to refuse by name."""
    if not isinstance(tools, list):
        return tools
    out = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("parameters"), dict):
            tool = {**tool, "function": {**function, "parameters": json_schema(function["parameters"])}}
        out.append(tool)
    return out


def json_schema(schema: object) -> object:
    """An OpenAPI 3.0 schema (what Home Assistant's Ollama integration sends as ``format`` and as its tools'
    ``parameters``, written by voluptuous-openapi) as the JSON schema it means: each schema's ``"nullable"`` read as
    :func:`edgesdk.runtime.json_schema.openapi_nullable` reads it, the one reading the chat route's tools have too
    (edgesdk/serve/tools.py, through ``lenient_schema``), so a schema admits the same values on /api/chat as on
    /v1/chat/completions: ``null`` among the types beside a ``type``, and among the values beside an ``enum``
    (``{"type": "string", "enum": ["a", "b"], "nullable": true}`` admits ``null``), and as a branch beside ``anyOf`` /
    ``oneOf`` (voluptuous-openapi's ``vol.Any(None, ...)``); elsewhere it adds nothing (OpenAPI 3.0.3, Schema
    Object: null is added "only if type is explicitly defined within the same Schema Object"); ``false`` is left
    out. A JSON schema passes unchanged.

    Ollama itself passes ``format`` to llama.cpp's json-schema-to-grammar (llm/server.go, ``SchemaToGrammar``),
    which knows no ``nullable`` and skips it: there a nullable property never admits ``null``. Here it is read as
    OpenAPI means it, which only widens what the schema admits."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in ONE_SCHEMA:
        if isinstance(out.get(key), dict):
            out[key] = json_schema(out[key])
    for key in SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [json_schema(item) for item in out[key]]
    for key in SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: json_schema(item) for name, item in out[key].items()}
    return openapi_nullable(out)


# ------------------------------------------------------------------------------------------------ answers


def loaded(asked: Asked, completer: Completer | None) -> dict:
    """The answer to a request with nothing to generate: the model is loaded (docs/api.md, "Load a model"), or, with
    ``keep_alive`` zero, Ollama's answer to "Unload a model" (server/routes.go: ``done_reason`` "unload", the chat's
    ``message`` an empty assistant turn, the generate route's ``response`` empty). A server of one bundle keeps its
    model loaded (it serves no other, and loading it again would take the next request the time of a load), so
    /api/ps goes on listing it: it is what answers the next request; a server of several has unloaded it (its
    ``completer`` is then None: serve/model_pool.py).

    A load request is first checked as Ollama checks it before it loads the model
    (:func:`check_capabilities`: ``think`` true for a model that does not think, /api/chat or /api/generate of an
    embedding model, a ``suffix`` for a model without FIM tokens are 400s, not "load"); an unload request is not, as
    Ollama answers it before those checks."""
    if not asked.unload:
        check_capabilities(completer, asked)
    body = {"model": asked.model, "created_at": created_at(), "done": True,
            "done_reason": "unload" if asked.unload else "load"}
    if asked.chat:
        body["message"] = {"role": "assistant", "content": ""}
    else:
        body["response"] = ""
    return body


class Answer:
    """The bodies of one answer, whole or as the objects of its stream, for /api/chat or /api/generate."""

    def __init__(self, completer: Completer, asked: Asked, request: CompletionRequest, started_ns: int | None = None,
                 load_ns: int = 0):
        """``started_ns``: when the request began (``time.monotonic_ns()``, before its model was scheduled: Ollama's
        ``total_duration`` counts from there); ``load_ns``: its ``load_duration``, the time its model took to be
        scheduled (loaded, where it was not)."""
        self.asked, self.request = asked, request
        self.started = time.monotonic_ns() if started_ns is None else started_ns
        self.load_ns = load_ns
        self.tokenizer = completer.runtime.tokenizer
        # /api/generate not raw: the prompt as text, which the last object's ``context`` begins with
        self.prompt = None if asked.chat or asked.raw else _prompt_text(completer, asked, request)
        self.completer = completer
        # a thinking model's answer to a ``format``: first the thinking, unconstrained (:func:`thinking_first`)
        self.first = thinking_first(completer, asked, request)
        self.splitter = completer.reasoning_splitter(replace(self.first or request, stream=False)) \
            if not asked.raw else _raw_splitter(completer, asked, request)
        self.tools = (AnswerStream(request.tools.structured, completer.tools_think_opened(request))
                      if request.tools is not None and request.stream else None)
        # a stream's tokens under tools, their logprobs given out once known to be the answer's (not the wrapper's)
        self.told = _ToldTokens(self.tools) if self.tools is not None and request.logprobs is not None else None
        self.calls_sent = 0  # a stream's calls given out so far (each once whole)
        # the first pass: its text so far, its thinking, and where its content began (its text before that: the
        # thinking block, its tags and the whitespace after it), None until then
        self.seen, self.thinking, self.thought = "", "", None
        self.thought_through: Completion | None = None  # the first pass, once a second one gives the content
        self.thought_logprobs: list = []  # the first pass's logprobs given out (none of a token the second redoes)
        self.failed: ApiError | None = None  # the second pass refused (its prompt does not fit): the answer's error
        # a piece that ends in U+FFFD, held until text follows it, and its logprobs (:meth:`_held_back`)
        self.held, self.held_logprobs = "", []
        self.write: Callable[[dict], None] | None = None  # where the listener writes the stream's objects

    def listener(self, write: Callable[[dict], None] | None = None) -> Callable[[str, list | None], None] | None:
        """The ``on_text`` of the answer's first pass (:meth:`Completer.complete`): each piece's objects to ``write``
        (a stream's; None: a whole answer's, which writes nothing until its end). Where a thinking model answers a
        ``format`` (:func:`thinking_first`), the pass ends (:class:`AnswerCut`) once its content begins, for
        :meth:`formatted` to go on from. None for a whole answer with no such pass (nothing to listen to)."""
        if write is None and self.first is None:
            return None
        self.write = write

        def on_text(text: str, logprobs: list | None) -> None:
            cut = self.first is not None and self.thought is None
            for line in self.piece(*self._held_back(text, logprobs)):
                if write is not None:
                    write(line)
            if cut and self.thought is not None:
                raise AnswerCut

        return on_text

    def _held_back(self, text: str, logprobs: list | None) -> tuple[str, list | None]:
        """A piece's text and logprobs, or none where the text ends in U+FFFD: that piece is held, with its logprobs,
        until text follows it (then both go out with the next piece's) or the pass ends (:meth:`_released`). The
        bytes of a character the answer's end cut short (the token limit reached mid-character, which the decoder
        gives out as U+FFFD once the answer ends: edgesdk/runtime/text.py, ``StreamDecoder.flush``) or bytes that
        are no UTF-8 are never the last text given out, as Ollama's runner trims its pending text until it is valid
        UTF-8 before it sends it (runner/llamarunner/runner.go, ``flushPending``), so a cut answer never ends in a
        replacement character there; each object still lists the tokens of its own text."""
        text, entries = self.held + text, self.held_logprobs + list(logprobs or [])
        if text.endswith("\ufffd"):
            self.held, self.held_logprobs = text, entries
            return "", None
        self.held, self.held_logprobs = "", []
        return text, entries or None

    def _released(self, completion: Completion) -> list[dict]:
        """The objects of the piece held at the pass's end (:meth:`_held_back`), the end of ``completion``'s text:
        its text without the U+FFFD it ends with that stand for no whole character (:func:`whole_text`), with its
        tokens' logprobs, as Ollama's runner sends a trimmed piece's logprobs."""
        text, entries = whole_text(self.held, self._broken(completion)), self.held_logprobs
        self.held, self.held_logprobs = "", []
        return self.piece(text, entries or None) if text or entries else []

    def _broken(self, completion: Completion) -> int:
        """How many of the U+FFFD ``completion``'s text ends with stand for no whole character (a character its end
        cut short, a stray byte), told from its tokens' bytes (:func:`edgesdk.runtime.text.broken_end`): a U+FFFD the
        model wrote (EF BF BD) is valid UTF-8, which Ollama's runner keeps."""
        return broken_end(self.tokenizer, completion.tokens, completion.text)

    def formatted(self, completion: Completion) -> CompletionRequest | None:
        """After the first pass (``completion``), the second: where the thinking pass of a ``format``'s answer
        reached the content, the request held to the format whose prompt goes on from the thinking, as Ollama's
        ChatHandler renders it again with the thinking as the assistant's (server/routes.go, ``structuredOutputs
        State_Applying``); here the thinking as the model wrote it (its block, tags and the whitespace after them)
        after the prompt, tokenized as the chat route tokenizes a rendered prompt, and fitted to the context again
        (:func:`second_pass`). None: the first pass was the whole answer (its thinking ran to the token limit or the
        end, or no ``format`` waited), or the second cannot run: its refusal is then the answer's error, a whole
        answer's status (:meth:`whole` raises it) or an open stream's last line (:meth:`closing`), not a second
        response written into the stream."""
        if self.first is not None and self.thought is None:  # the pass ended: what it held goes out (its content too)
            for line in self._released(completion):
                if self.write is not None:
                    self.write(line)
        if self.first is None or self.thought is None:
            return None
        self.thought_through, self.splitter = completion, None  # the second pass's text is all content
        self.held, self.held_logprobs = "", []  # the first pass's text after the thinking is not the answer's
        try:
            return second_pass(self.completer, self.asked, self.first, self.request, self.thought)
        except ApiError as error:
            self.failed = error
            return None

    def _body(self, content: str, thinking: str = "", calls: list | None = None, logprobs: list | None = None) -> dict:
        """An object of the answer: ``message`` (/api/chat) or ``response`` (/api/generate), with what is given."""
        body: dict = {"model": self.asked.model, "created_at": created_at()}
        if self.asked.chat:
            message: dict = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            body["message"] = message
        else:
            body["response"] = content
            if thinking:
                body["thinking"] = thinking
        if logprobs:
            body["logprobs"] = _ollama_logprobs(logprobs)
        return body

    def _final(self, completion: Completion, content: str = "", thinking: str = "", calls: list | None = None) -> dict:
        """The object with ``done`` true: ``done_reason``, on /api/generate not raw the ``context`` (the prompt's
        text and the answer's, thinking included, tokenized as one with special tokens read and none added, as
        Ollama's GenerateHandler answers ``Tokenize(prompt + answer)`` in its last object: the answer as given out,
        a character its end cut short left out, :func:`whole_text`), and the counts and
        durations (docs/api.md, "Response"): ``prompt_eval_count`` every prompt token, those the KV cache held too
        (the runner's ``numPromptInputs``), ``eval_count`` every token sampled, the end-of-text token the answer
        stopped at included (its ``numDecoded``, bumped before the ``TokenIsEog`` check: runner/llamarunner/runner.go,
        :attr:`Completion.completion_tokens`)."""
        context = {} if self.prompt is None else \
            {"context": self.tokenizer.encode(self.prompt + whole_text(completion.text, self._broken(completion)),
                                              add_special_tokens=False)}
        return {**self._body(content, thinking, calls), "done": True, "done_reason": completion.finish_reason,
                **context, "total_duration": time.monotonic_ns() - self.started, "load_duration": self.load_ns,
                "prompt_eval_count": completion.prompt_tokens,
                "prompt_eval_duration": _nanoseconds(completion.prompt_ms),
                "eval_count": completion.completion_tokens, "eval_duration": _nanoseconds(completion.predicted_ms)}

    def whole(self, completion: Completion) -> dict:
        """The answer of a request with ``stream`` false (its error where the second pass was refused)."""
        if self.failed is not None:
            raise self.failed
        # its pieces held back as a stream's are (_held_back)
        thinking, text = "", whole_text(completion.text, self._broken(completion))
        if self.thought_through is not None:  # the thinking pass's thinking, the format's pass's content
            thinking = self.thinking
        elif self.first is not None:  # the thinking pass, its pieces split as they came, was the whole answer
            self._released(completion)  # (already, where formatted() saw the pass end)
            rest, text = self.splitter.flush()
            thinking = self.thinking + rest
        elif self.splitter is not None:
            thinking, text = split_answer(self.splitter, text)
        if self.request.tools is None:
            body = self._final(completion, text, thinking)
        else:
            stream = AnswerStream(self.request.tools.structured, self.completer.tools_think_opened(self.request))
            stream.push(text)  # read as answer_message reads it, which keeps no count of the calls that ended
            fields, finish = stream.finish(completion.finish_reason)[1:]
            content, calls = _whole_calls(stream, fields, finish)
            calls = _ollama_calls({"tool_calls": calls}, finish)  # a thinking model's block: its thinking
            body = self._final(completion, content, fields.get("reasoning_content") or "", calls)
        if self.request.logprobs is not None:  # both passes' tokens, as Ollama's whole answer gathers its objects'
            before = [] if self.thought_through is None else self.thought_logprobs  # those its stream gives out
            entries = completion.logprobs or []
            if self.request.tools is not None:  # those its stream gives out: not the wrapper's
                told = _ToldTokens(stream)
                told.add(text, entries)
                entries = told.settled(fields)
            body["logprobs"] = _ollama_logprobs(before + entries)
        return body

    def piece(self, text: str, logprobs: list | None = None) -> list[dict]:
        """The stream's objects that a settled piece of text gives; a token whose text is held back (a tag's or a
        call's possible start) still gives its logprobs, in an object with no text."""
        thinking, content, calls = "", text, None
        if self.tools is not None:
            deltas = self.tools.push(text)
            thinking, content = _joined(deltas, "reasoning_content"), _joined(deltas, "content")
            calls = self._settled_calls()
            if self.told is not None:
                self.told.add(text, logprobs)
                logprobs = self.told.settled() or None
        elif self.splitter is not None:
            if self.first is not None and self.thought is not None and self.thought_through is None:
                return []  # the thinking pass, cut where its content began: what comes after is not the answer's
            thinking, content = self.splitter.push(text)
            if self.first is not None and self.thought_through is None:
                self.seen += text
                self.thinking += thinking
                if content:  # Ollama gives out the piece's thinking, its content cleared, and ends the pass
                    self.thought = self.seen[:len(self.seen) - len(content)]
                    logprobs, content = _before_the_content(logprobs, content), ""
                self.thought_logprobs.extend(logprobs or [])
        if content or thinking or calls or logprobs:
            return [{**self._body(content, thinking, calls, logprobs=logprobs), "done": False}]
        return []

    def _settled_calls(self) -> list[dict]:
        """The stream's calls whose arguments have ended since the last object, each given out once whole, as
        Ollama's ChatHandler gives out a call in the object where its tool parser finds it (server/routes.go,
        ``toolParser.Add``), its ``function.index`` its place among the answer's calls."""
        settled = self.tools.calls[self.calls_sent:self.tools.settled]
        calls = _ollama_calls({"tool_calls": settled}, "tool_calls", first=self.calls_sent)
        self.calls_sent += len(calls)
        return calls

    def closing(self, completion: Completion) -> list[dict]:
        """The stream's last objects: what its end settles (a tool call once whole), then the one with ``done``; where
        the second pass was refused, the error line that ends the stream instead."""
        if self.failed is not None:
            return [error_body(self.failed)]
        pieces = self._released(completion)
        if self.tools is not None:
            deltas, fields, finish = self.tools.finish(completion.finish_reason)
            thinking, content = _joined(deltas, "reasoning_content"), _joined(deltas, "content")
            cut, whole = _whole_calls(self.tools, fields, finish)
            if len(whole) < len(fields.get("tool_calls") or []):  # a call the end cut short, none whole before it:
                content += cut  # its text (no content went out before; a text answer's went out as it came)
            rest = whole[self.calls_sent:]  # those not given out already
            calls = _ollama_calls({"tool_calls": rest}, finish, first=self.calls_sent)
            told = self.told.settled(fields) if self.told is not None else None
            if content or thinking or calls or told:
                pieces.append({**self._body(content, thinking, calls, logprobs=told), "done": False})
        elif self.splitter is not None:
            thinking, content = self.splitter.flush()
            if thinking or content:
                pieces.append({**self._body(content, thinking), "done": False})
        return pieces + [self._final(completion)]


class _ToldTokens:
    """The tokens of an answer under tools whose logprobs go out: those of what the answer gives out, not of the
    JSON this server wraps a text in. Ollama's ChatHandler lists the logprobs of every token the model wrote, those
    its tool parser holds back as a call's text included (server/routes.go: "Send logprobs while content is being
    buffered by the parser for tool calls"), so its tokens spell the thinking, the content and the call's text. Here
    a call's JSON (``{"tool_call": {"name": ..., "arguments": ...}}``, the form the prompt asks the model to call in)
    is that text: a call's tokens are listed, all of them, those of a call its token limit cut short (its text the
    content) too. A text answer's ``{"response": "...`` around the text is no text the model says, only the form this
    server holds it to (a model of Ollama's writes its text bare): its tokens are those of the text, as the chat route
    lists them (:meth:`AnswerStream.shown`), and a thinking model's reasoning before the JSON is listed as Ollama
    lists its thinking. Each token is placed where its UTF-8 bytes fall in the answer's text: a token holding the
    first bytes of a character reaches into it (it holds some of that character), so that a text beginning with a
    character of several tokens keeps them all; the bytes of a character the answer's end cut short (left out of
    the text, :func:`whole_text`) are read as the text's last, as Ollama's runner lists a trimmed piece's tokens."""

    def __init__(self, stream: AnswerStream):
        self.stream = stream
        self.spans = TokenSpans()  # where each token starts and ends in the answer's text, as the chat route places them
        self.pushed = 0  # how much of the answer's text the stream has read
        self.waiting: list[tuple[int, int, dict]] = []  # tokens not yet known to be the answer's or the wrapper's

    def add(self, text: str, entries: list | None) -> None:
        """The answer's next ``text`` (the stream has read it) and the ``entries`` of its tokens."""
        self.pushed += len(text)
        self.waiting.extend(self.spans(list(entries or [])))

    def settled(self, fields: dict | None = None) -> list:
        """The waiting tokens now known to be the answer's, in order (the wrapper's dropped), up to the first still
        unknown; ``fields``, the finished message's (:meth:`AnswerStream.finish`), settles every token."""
        kept = []
        while self.waiting:
            start, end, entry = self.waiting[0]
            told = self._told(start, end, fields)
            if told is None:
                break
            self.waiting.pop(0)
            if told:
                kept.append(entry)
        return kept

    def _told(self, start: int, end: int, fields: dict | None) -> bool | None:
        """Whether the token at ``start`` to ``end`` is the answer's (None: not known yet)."""
        if self.stream.kind in ("call", "calls"):
            return True
        if fields is not None and start >= self.pushed:  # past the text read: a character the end cut short
            # a value still open where the text ends holds it (the stream lists it as it comes, an empty text's too);
            # else it is read as the text's last character
            ending = self.stream.shown(start, end, self.pushed)
            if ending is not None:
                return ending
            start = max(self.pushed - 1, 0)
        return self.stream.shown(start, end, self.pushed, fields)


def _joined(deltas: list[dict], field: str) -> str:
    """The text of ``field`` (``content``, ``reasoning_content``) in an answer's deltas under tools."""
    return "".join(delta.get(field) or "" for delta in deltas)


def thinking_first(completer: Completer, asked: Asked, request: CompletionRequest) -> CompletionRequest | None:
    """The unconstrained first pass of a thinking model's /api/chat answer to a ``format``, or None where the format
    holds the answer from its first token.

    Ollama's ChatHandler (server/routes.go, its structured outputs in two requests: ``structuredOutputsState``) lets
    a model with the thinking capability think before the format applies: where ``format`` is set and its thinking
    parser runs (``think`` true, which a request without ``think`` is on such a model), the first request goes
    without the format, its thinking given out as it comes; once content follows thinking, that request is
    cancelled, the piece's thinking given out with its content cleared, and a second request, with the format,
    answers from a prompt rendered again with the thinking as the assistant's. Its content is the answer's; its
    counts are the last object's. Here the first pass is this request without its format (checked first: a
    constraint the request cannot have is its 400 before anything runs), cut where the reasoning splitter
    (serve/reasoning.py) finds the content (:meth:`Answer.listener`), and the second goes on from the thinking as
    the model wrote it (:meth:`Answer.formatted`), held to the format by the constraint the format makes
    (Completer.complete). Each pass may run to ``num_predict``, as each of Ollama's requests may.

    Unlike Ollama, content that begins with no thinking before it (the model skipped its block, or left it empty)
    is held to the format too, the second pass going on from what the model wrote before it: Ollama's condition
    (``tb.String() != ""``) leaves such an answer unconstrained, the format silently dropped, which its issues
    #14645, #14850 and #15260 report as a bug.

    None, the format holding the answer from its first token as before: /api/generate (Ollama's GenerateHandler
    passes ``Format`` to its one request), ``think`` false, a model whose chat template does not think (no thinking
    capability), a template rendered thinking off (``serve --reasoning-budget 0`` or ``enable_thinking`` false in
    ``--chat-template-kwargs``), ``tools`` (a thinking model's answer under tools thinks first in its one pass:
    serve/completion.py's ``ThinkingFirst`` leaves its block free, then holds the call to the tools' schema) and
    ``--reasoning-format none`` (no thinking is split off)."""
    if not asked.chat or asked.think is False or request.tools is not None or request.grammar is not None or \
            not (request.json_schema is not None or request.json_object) or \
            not template_thinks(completer.runtime.tokenizer.template_source):
        return None
    if completer.thinking_off(request):
        return None
    first = replace(request, json_schema=None, json_object=False)
    if completer.reasoning_splitter(replace(first, stream=False)) is None:
        return None
    completer.check_constraint(request)
    return first


def _before_the_content(logprobs: list | None, content: str) -> list | None:
    """The logprobs of the piece where the thinking pass is cut without those of its last tokens whose bytes all lie
    in ``content``, the piece's text after the thinking: the second pass writes that content again, each token with
    its own logprob, so the answer lists each of its tokens once and the tokens listed spell the thinking and the
    content as the answer gives them. A token that holds the end of the thinking too keeps its logprob (its
    thinking is in the second pass's prompt, not written again). Ollama's ChatHandler gives out the cut piece's
    logprobs whole (server/routes.go: the object of the thinking, its content cleared, keeps ``res.Logprobs``), so
    that its answer lists the first token of the content twice, once from each pass; here it is listed once."""
    if not logprobs:
        return logprobs
    room = len(content.encode("utf-8"))
    kept = list(logprobs)
    while kept and len(kept[-1]["bytes"]) <= room:
        room -= len(kept.pop()["bytes"])
    return kept


def second_pass(completer: Completer, asked: Asked, first: CompletionRequest, request: CompletionRequest,
                thought: str) -> CompletionRequest:
    """The request of the second pass of a thinking model's answer to a ``format`` (:func:`thinking_first`):
    ``request`` (held to the format) with its prompt the messages rendered as the first pass rendered them
    (``first``) and the ``thought`` after them, fitted to the context again as Ollama fits it: its ChatHandler
    renders its second prompt with ``chatPrompt`` over all the request's messages and the thinking as the last,
    assistant's, message (server/routes.go, ``structuredOutputsState_Applying``: ``msgs = append(msgs, msg)`` and
    ``chatPrompt(..., msgs, ..., truncate)``), so that where the thinking pushed the prompt past the context the
    oldest messages are dropped until it fits, the system messages and the thinking kept
    (server/prompt.go: the latest message, here the thinking, is always kept, so the client's last message too
    may go where nothing else fits: :func:`trimmed` with ``tail``), and what is kept, still past the context, is cut
    as Ollama's runner cuts its input (:func:`_truncated_input`). ``truncate`` false keeps every message and a
    prompt past the context (or ``num_ctx``) is Ollama's 400 (:func:`_refuse_past_the_context`); a ``num_ctx``
    below the bundle's context bounds the second prompt and its answer as it bounds the first
    (:func:`_within_num_ctx`)."""
    limit = completer.runtime.backend.max_context
    window = limit if asked.num_ctx is None else min(asked.num_ctx, limit)
    if asked.truncate and asked.request is not None:  # the client's messages, before windowed() cut them
        first = trimmed(completer, replace(first, messages=asked.request.messages), window, asked.num_ctx,
                        asked.cuts, tail=thought)
    ids = completer.runtime.tokenizer.chat_ids(completer.rendered_chat(first) + thought)
    second = replace(request, messages=first.messages, prompt_tokens=tuple(ids))
    if not asked.truncate:
        _refuse_past_the_context(completer, asked, second, window)
    else:
        second = _truncated_input(completer, asked, second, window)
    return _within_num_ctx(completer, asked, second)


def _raw_splitter(completer: Completer, asked: Asked, request: CompletionRequest) -> ReasoningSplitter | None:
    """A raw /api/generate prompt's answer split into ``thinking`` and ``response`` as Ollama's GenerateHandler
    splits it (server/routes.go): raw skips the template and the model's built-in parser, not the generic thinking
    parser, which runs where ``think`` is true (left out, it is true on a model that thinks, as for a templated
    prompt) and the template has thinking tags (``thinking.InferTags``: here its <think> block), opened where the
    prompt ends with the opening tag (``strings.HasSuffix(strings.TrimSpace(prompt), openingTag)``). None where
    ``think`` is false, the template writes no <think> block, the operator asked for no split (``--reasoning-format
    none``) or a constraint shapes the answer from its start (``format``), as on the other routes."""
    if asked.think is False or not template_thinks(completer.runtime.tokenizer.template_source) or \
            (request.reasoning_format or completer.defaults.reasoning_format) == "none" or \
            request.grammar is not None or request.json_schema is not None or request.json_object:
        return None
    return ReasoningSplitter(opened=prompt_opens_thinking(request.prompt))


def error_body(error: ApiError) -> dict:
    """Ollama's error: ``{"error": "..."}``."""
    return {"error": error.message}


def created_at() -> str:
    """The time now as Ollama writes it (RFC 3339, UTC)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _ollama_logprobs(entries: list) -> list[dict]:
    """llama-server's completion_probabilities entries (the same tokens and numbers as the chat route's
    ``logprobs.content``) as Ollama's ``logprobs``: ``token``, ``logprob``, ``bytes`` and ``top_logprobs`` in the same
    form, left out when empty as Ollama's ``omitempty`` leaves it (api/types.go, ``Logprob`` and ``TokenLogprob``)."""
    def token_fields(entry: dict) -> dict:
        return {"token": entry["token"], "logprob": entry["logprob"], "bytes": entry["bytes"]}

    return [{**token_fields(entry), **({"top_logprobs": [token_fields(t) for t in entry["top_logprobs"]]}
                                       if entry["top_logprobs"] else {})} for entry in entries]


def _whole_calls(stream: AnswerStream, fields: dict, finish: str) -> tuple[str, list[dict]]:
    """(the content, the calls) of an answer's message ``fields`` (``finish``: the reason :meth:`AnswerStream.finish`
    gave, ``stream`` the answer read) as Ollama gives them: only calls whose arguments ended. Ollama's tool parser
    gives out a call once its JSON parses whole (tools/tools.go, ``findArguments``), so an answer its token limit or
    a stop string cut inside a call's arguments carries no call for it, where the chat route keeps the partial call
    as llama-server does: a client of Ollama's API (LangChain's ChatOllama, the ``ollama`` package) runs the tools
    a message calls without reading ``done_reason`` first, and ran them with arguments missing or empty. The calls
    that ended before the cut are kept, and the content is then empty (``Parser.Content``: "" once a call was
    found); where none did, the content is the text the answer wrote for its call, as Ollama sends its tool
    parser's buffered text where it found no call. The message's own content otherwise."""
    calls = fields.get("tool_calls") or []
    if finish == "tool_calls" or len(calls) <= stream.settled:
        return fields.get("content") or "", calls
    whole = calls[:stream.settled]
    return ("" if whole else stream.text.lstrip()), whole


def _ollama_calls(fields: dict, finish: str, first: int = 0) -> list[dict]:
    """The OpenAI tool calls of an answer's message ``fields`` as Ollama's: ``function.arguments`` an object (where
    ``finish`` is not "tool_calls", read as far as its JSON goes: the answers give only calls whose arguments ended,
    :func:`_whole_calls`, which read so are read whole), ``function.index`` each call's
    place in the answer (``first``: the first one's). Arguments nested deeper than an object of the answer can hold
    (:func:`call_input`) are the answer's error (a whole answer's status, a stream's last line): the chat route
    gives them as their JSON text, which Ollama's object has no place for."""
    whole = finish == "tool_calls"
    calls = []
    for index, call in enumerate(fields.get("tool_calls") or [], start=first):
        name, arguments = call["function"]["name"], call["function"]["arguments"]
        value = call_input(arguments, whole)
        if value is None:
            raise too_deep_call(name, arguments, "Ollama's function.arguments, an object,",
                                "ask /v1/chat/completions, whose function.arguments is the call's JSON text")
        calls.append({"id": call["id"], "function": {"index": index, "name": name, "arguments": value}})
    return calls


def whole_text(text: str, broken: int) -> str:
    """An answer's ``text`` without the last ``broken`` U+FFFD it ends with (:meth:`Answer._broken`, at most those it
    ends with): a character its end cut short (the token limit reached mid-character, the held bytes decoded with
    ``errors="replace"`` as llama-server gives them) or bytes that are no UTF-8. Ollama's runner trims its text until
    it is valid UTF-8 before it sends it (runner/llamarunner/runner.go, ``flushPending``), so an answer of Ollama's
    routes never ends in bytes that are no character, and /api/generate's ``context`` (the prompt and the answer
    tokenized again) holds none; a U+FFFD the model wrote (EF BF BD, valid UTF-8) stays, as Ollama keeps it. The
    other routes keep them all, as llama-server does."""
    kept = max(len(text.rstrip("\ufffd")), len(text) - broken)
    return text[:kept]


def _nanoseconds(milliseconds: float) -> int:
    """A duration in milliseconds as Ollama's durations are written: whole nanoseconds."""
    return int(round(milliseconds * NANOSECONDS_PER_MS))


# ------------------------------------------------------------------------------------------------ embeddings
#
# ``POST /api/embed`` (docs/api.md, "Generate Embeddings"; server/routes.go, ``EmbedHandler``): ``input`` a text or an
# array of texts (nothing, or an empty text or array: the model is loaded and ``embeddings`` is empty); ``truncate``
# (true unless false) cuts an input past the context to its first tokens, false refuses it; ``dimensions`` keeps a
# vector's first N values where N is below its width; ``options.num_ctx`` narrows the context. Vectors are unit length
# (Ollama normalises them, and again after ``dimensions``). ``POST /api/embeddings`` (``EmbeddingsHandler``, deprecated):
# one ``prompt`` (empty: the model is loaded, ``embedding`` is empty), answered ``{"embedding": [...]}`` with the
# vector as the model gives it, not normalised, and no truncation. Both pool as the server was started (--pooling):
# ``none``, a vector per token, is neither answer's and is refused.


@dataclass(frozen=True)
class EmbedAsked:
    """An /api/embed or /api/embeddings request, checked: the model name as the client gave it (answers echo it), the
    texts (none: the model is only to be loaded), ``truncate``, ``dimensions`` (0: all), ``num_ctx`` and whether it
    came to the deprecated /api/embeddings (``legacy``: one ``prompt``, its vector not normalised)."""

    model: str
    texts: tuple[str, ...]
    truncate: bool = True
    dimensions: int = 0
    num_ctx: int | None = None
    legacy: bool = False

    @property
    def param(self) -> str:
        """The field the texts came in, which errors name."""
        return "prompt" if self.legacy else "input"


def parse_embed(body: object, served: str) -> EmbedAsked:
    """``POST /api/embed``'s body checked."""
    body = _object(body)
    model, window = _model_name(body, served), _embedding_options(body)
    value = body.get("input")
    if value is None or value == "":
        texts: tuple[str, ...] = ()
    elif isinstance(value, str):
        texts = (value,)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if not isinstance(item, str):
                raise ApiError(400, f"'input[{index}]' must be a string, got {json_shown(item)}: /api/embed takes a text "
                               "or an array of texts", param="input")
        texts = tuple(value)
    else:
        raise ApiError(400, f"'input' must be a string or an array of strings, got {json_shown(value)}", param="input")
    dimensions = body.get("dimensions")
    if dimensions is None:
        dimensions = 0
    if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 0:
        raise ApiError(400, f"'dimensions' must be the number of values to keep of each vector (a whole number >= 1; "
                       f"0 or none: all), got {json_shown(dimensions)}", param="dimensions")
    return EmbedAsked(model, texts, _bool_field(body, "truncate", True), dimensions, window)


def parse_embeddings(body: object, served: str) -> EmbedAsked:
    """``POST /api/embeddings``' (deprecated) body checked."""
    body = _object(body)
    model, window = _model_name(body, served), _embedding_options(body)
    prompt = body.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise ApiError(400, f"'prompt' must be a string, got {json_shown(prompt)}", param="prompt")
    return EmbedAsked(model, (prompt,) if prompt else (), truncate=False, num_ctx=window, legacy=True)


def _embedding_options(body: dict) -> int | None:
    """``keep_alive`` checked, and ``options``' ``num_ctx``: the other options change nothing in an embedding."""
    _check_keep_alive(body)
    options = _as_ollama_reads(body).get("options")
    if options is None:
        return None
    if not isinstance(options, dict):
        raise ApiError(400, f"'options' must be an object of model parameters ({{\"num_ctx\": 2048}}), got "
                       f"{json_shown(options)}", param="options")
    _warn_invalid(options)
    return _num_ctx(options)


def embed(completer: Completer, asked: EmbedAsked,
          client_gone: Callable[[], bool] | None = None) -> list[Embedding]:
    """The embeddings of ``asked``'s texts: pooled as the server pools (``none`` refused), unit length for /api/embed
    and as the model gives them for /api/embeddings. A ``num_ctx`` below the bundle's context is the window an input
    must fit in, cut to it with ``truncate`` (its first tokens and the end token its tokenizer appends, as Ollama's
    re-tokenized cut text keeps it)."""
    pooling = completer.defaults.pooling
    if pooling == "none":
        raise ApiError(400, "this server pools embeddings with 'none' (a vector per token), which Ollama's "
                       f"{EMBEDDINGS_ROUTE if asked.legacy else EMBED_ROUTE} cannot answer; start edgesdk serve with "
                       "--pooling last, mean or cls", param=asked.param)
    if not asked.texts:
        return []
    config = EmbeddingConfig(pooling=pooling, normalize=-1 if asked.legacy else 2)
    # a num_ctx at or above the model's context is capped there (the completer's own window)
    return completer.embed(asked.texts, config, truncate=asked.truncate, param=asked.param, client_gone=client_gone,
                           window=asked.num_ctx, window_name="'options.num_ctx'")


def embed_body(asked: EmbedAsked, embeddings: list[Embedding], started_ns: int, load_ns: int = 0) -> dict:
    """The answer: /api/embed's ``model``, ``embeddings`` (each cut to ``dimensions`` and normalised again where that
    is below its width, as Ollama does), durations (``load_ns``: the time the model took to be scheduled, Ollama's
    ``load_duration``) and ``prompt_eval_count``; /api/embeddings' ``embedding``. A request with no texts gets the
    empty answer Ollama loads the model with."""
    if asked.legacy:
        return {"embedding": encoded(embeddings[0].vectors, "float") if embeddings else []}
    if not embeddings:
        return {"model": asked.model, "embeddings": []}
    vectors = []
    for embedding in embeddings:
        vector = embedding.vectors
        if 0 < asked.dimensions < vector.shape[-1]:
            vector = normalize(vector[:asked.dimensions], 2)
        vectors.append(encoded(vector, "float"))
    return {"model": asked.model, "embeddings": vectors, "total_duration": time.monotonic_ns() - started_ns,
            "load_duration": load_ns, "prompt_eval_count": sum(embedding.tokens for embedding in embeddings)}


# ------------------------------------------------------------------------------------------------ the model


def tags(completer: Completer, served: str) -> dict:
    """``GET /api/tags``: the one model served."""
    return {"models": [_model_entry(completer, served)]}


def listed(models: list[tuple[Bundle, str]]) -> dict:
    """``GET /api/tags`` of a server with several bundles: each (bundle, served name), from its manifest, loaded or
    not."""
    return {"models": [_bundle_entry(bundle, served) for bundle, served in models]}


def running(completer: Completer, served: str) -> dict:
    """``GET /api/ps``: the loaded model and when it goes (``expires_at``). With several bundles served, the time the
    pool unloads it once idle (``completer.unload_at``, set by serve/model_pool.py: ``keep_alive`` after the last
    answer, or that long from now while a request holds it); a model kept loaded (one bundle served, which stays
    loaded while the server runs, also after a request to unload it, :func:`loaded`; or ``keep_alive`` below 0)
    shows Ollama's far-off time for ``keep_alive`` < 0. ``size_vram`` is the part of ``size`` in the GPU's memory:
    all of it on a GPU backend (TensorRT, ONNX Runtime's CUDA or TensorRT provider, Triton), none on the CPU, as
    ``ollama ps`` reads it ("100% GPU" where it equals ``size``, "100% CPU" where it is 0)."""
    entry = _model_entry(completer, served)
    del entry["modified_at"]
    backend = completer.runtime.backend
    device = getattr(getattr(backend, "decoder", None), "device", None)  # Triton's: its reference twin runs on the CPU
    on_gpu = backend.name not in CPU_BACKENDS and getattr(device, "type", "cuda") == "cuda"
    unload_at = getattr(completer, "unload_at", None)  # the pool's, on the completers it holds
    when = unload_at() if unload_at is not None else None
    expires = KEPT_LOADED_UNTIL if when is None else \
        datetime.fromtimestamp(when, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"models": [{**entry, "expires_at": expires, "size_vram": entry["size"] if on_gpu else 0,
                        "context_length": completer.runtime.backend.max_context}]}


def show(completer: Completer, served: str, body: object) -> dict:
    """``POST /api/show``: the model's details, template, parameters, ``model_info`` and capabilities."""
    _model_name(_object(body), served)
    facts, defaults = _model_facts(completer), completer.defaults
    family = str(facts.get("architecture", "model"))
    context = completer.runtime.backend.max_context
    # serve -n -1 (no limit but the context): Ollama's num_predict -1, "infinite generation"
    predict = -1 if defaults.max_tokens >= UNTIL_THE_CONTEXT_FILLS else defaults.max_tokens
    parameters = {"num_ctx": context, "num_predict": predict, "temperature": defaults.temperature,
                  "top_k": defaults.top_k, "top_p": defaults.top_p, "min_p": defaults.min_p,
                  "repeat_penalty": defaults.repeat_penalty, "repeat_last_n": defaults.repeat_last_n}
    text = "\n".join(f"{name:<30} {value}" for name, value in parameters.items())
    info = {"general.architecture": family, "general.parameter_count": int(facts.get("parameters") or 0),
            f"{family}.context_length": context, f"{family}.embedding_length": facts.get("hidden_size"),
            f"{family}.block_count": facts.get("layers"), f"{family}.attention.head_count": facts.get("attention_heads"),
            f"{family}.attention.head_count_kv": facts.get("kv_heads"), f"{family}.vocab_size": facts.get("vocab_size")}
    # where a suffix is answered, the template first writes the FIM prompt, as Ollama's code models' templates do
    template = infill.ollama_template(completer) + (completer.runtime.tokenizer.template_source or "")
    modelfile = f"FROM {served_names(served)[-1]}\n" + "".join(f"PARAMETER {k} {v}\n" for k, v in parameters.items())
    return {"license": "", "modelfile": modelfile, "parameters": text, "template": template,
            "details": details(completer), "model_info": {k: v for k, v in info.items() if v is not None},
            "capabilities": capabilities(completer), "modified_at": completer.runtime.bundle.manifest.get("created")}


def version() -> dict:
    """``GET /api/version``: the Ollama release whose API these routes follow (docs/api.md, "Version")."""
    return {"version": API_VERSION}


def details(completer: Completer) -> dict:
    """The model's ``details`` (family, parameter size, quantization level) from the bundle's manifest."""
    return _manifest_details(completer.runtime.bundle.manifest)


def _manifest_details(manifest: dict) -> dict:
    facts = manifest.get("model", {}).get("after", {})
    family = str(facts.get("architecture", ""))
    return {"parent_model": "", "format": "onnx", "family": family, "families": [family] if family else None,
            "parameter_size": _parameter_size(int(facts.get("parameters") or 0)),
            "quantization_level": _quantization(manifest)}


def capabilities(completer: Completer) -> list[str]:
    """What the model does, as /api/show lists it (server/images.go, ``Model.Capabilities``): "embedding" for a
    model that declares its pooling (the manifest's ``model.before.pooling``, from a GGUF's ``pooling_type`` or a
    sentence-transformers Pooling module; Ollama lists "embedding" in place of "completion" for a GGUF with
    ``pooling_type``), else "completion", not "embedding" too: Ollama lists a generative model (llama3.2) so, though
    its /api/embed answers for it; tools (through the chat template, so where there is one); insert where the
    vocabulary has the fill-in-the-middle tokens a ``suffix`` needs (Ollama: where the template reads ``.Suffix``);
    thinking where the template writes a <think> block. In Ollama's order."""
    tokenizer = completer.runtime.tokenizer
    source = tokenizer.template_source
    return (["completion" if _declared_pooling(completer) is None else "embedding"]
            + (["tools"] if source is not None else []) + (["insert"] if tokenizer.fim_tokens().can_infill else [])
            + (["thinking"] if template_thinks(source) else []))


def _declared_pooling(completer: Completer) -> str | None:
    """The pooling the bundle's model declares (the manifest's ``model.before.pooling``, read as
    edgesdk.runtime.embedding's ``bundle_pooling`` reads it): an embedding model's; None for a generative model."""
    manifest = completer.runtime.bundle.manifest
    return ((manifest.get("model") or {}).get("before") or {}).get("pooling")


def served_names(served: str) -> tuple[str, ...]:
    """The names the served model answers to: its own, and with Ollama's default tag (a name without a tag is
    ``name:latest``, docs/api.md "Model names")."""
    tagged = served.rfind(":") > served.rfind("/")  # a colon before the last '/' is a host's port, not a tag
    return (served,) if tagged else (served, f"{served}:latest")


def _model_entry(completer: Completer, served: str) -> dict:
    """The served model as /api/tags lists a model: its name, size (the bundle's files), digest (of the manifest,
    which names every file's hash) and details."""
    return _bundle_entry(completer.runtime.bundle, served)


def _bundle_entry(bundle: Bundle, served: str) -> dict:
    """A bundle as /api/tags lists a model (:func:`_model_entry`), from its manifest."""
    manifest_file = bundle.path / "manifest.json"
    digest = hashlib.sha256(manifest_file.read_bytes()).hexdigest() if manifest_file.is_file() else ""
    size = sum(int(entry.get("size", 0)) for entry in bundle.manifest.get("files", {}).values())
    name = served_names(served)[-1]
    return {"name": name, "model": name, "modified_at": bundle.manifest.get("created"), "size": size,
            "digest": digest, "details": _manifest_details(bundle.manifest)}


def _model_facts(completer: Completer) -> dict:
    """The model's facts as the bundle's manifest records them after the build (architecture, parameters, sizes)."""
    return completer.runtime.bundle.manifest.get("model", {}).get("after", {})


def _parameter_size(count: int) -> str:
    """A parameter count as Ollama writes it (format.HumanNumber: "135M", "1.5B", "88K")."""
    for size, unit, places in ((1e9, "B", 1), (1e6, "M", 2), (1e3, "K", 0)):
        if count >= size:
            number = count / size
            return f"{number:.0f}{unit}" if number == int(number) else f"{number:.{places}f}{unit}"
    return str(count)


def _quantization(manifest: dict) -> str:
    """The weights' precision: the fewest bits a quantization stage trained them to (``INT4``), else the graph's
    type as Ollama names float types (``F32``, ``F16``)."""
    bits = [stage.get("config", {}).get("weight_bits") for stage in manifest.get("stages", [])]
    bits = [b for b in bits if isinstance(b, int)]
    if bits:
        return f"INT{min(bits)}"
    dtype = str(manifest.get("graph", {}).get("dtype", "")).lower()
    return FLOAT_TYPE_NAMES.get(dtype, dtype.upper())
