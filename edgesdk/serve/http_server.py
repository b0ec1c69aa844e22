"""The HTTP side of ``edgesdk serve``: OpenAI-compatible routes on the standard library's server.

Routes (each also without the ``/v1`` prefix, as llama-server takes them):

* ``POST /v1/chat/completions``, ``POST /v1/completions``: answers, whole or streamed as
  server-sent events (``data: {chunk}`` lines, then ``data: [DONE]``; WHATWG HTML, "Server-sent
  events"). A streamed answer's connection closes at its end, which delimits the body (RFC 9112
  §6.3); a client that goes away mid-answer stops the generation. ``/v1/completions`` takes several prompts (an
  array of strings or of token-id arrays) and answers a choice per prompt, usage summed (``_prompt_requests``).
* ``GET /v1/models``: the one model served (with several bundles, each; serve/model_pool.py: a request's ``model``
  picks the one that answers, loaded in place of the idle one). ``GET /health``: liveness, whether a request is
  generating (or a model loading, named in ``loading``), and the thermal guard's level and temperature when it runs
  (between requests, the level the temperature now gives: :func:`thermal_health`; also ``GET /v1/health``, as
  llama-server takes it). ``GET /props``
  (llama-server's): the context, the default settings, the chat template and special tokens.
  ``GET /slots`` (llama-server's slot monitoring, on by default there too): the one slot, and the
  request it runs (``?fail_on_no_slot=1``, any value as in llama-server: 503 while it is busy); with several bundles
  ``?model=NAME`` that model's, a model not loaded described without loading it (a monitoring GET swaps nothing).
* ``GET /metrics`` (with ``--metrics``, as llama-server): Prometheus counters (serve/metrics.py); without it,
  llama-server's 501 ``not_supported_error`` ("This server does not support metrics endpoint").
* ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's Messages API, whole or
  streamed as named events, its errors in Anthropic's shape (serve/anthropic.py).
* ``POST /v1/responses``: OpenAI's Responses API, whole or streamed as named events (serve/responses.py);
  ``GET`` / ``DELETE /v1/responses/{id}`` and ``GET /v1/responses/{id}/input_items``: the responses it keeps in
  memory (``store``), as OpenAI's API answers them; ``POST /v1/responses/{id}/cancel`` refused (no response here is
  a background one); ``POST /v1/responses/input_tokens``: a Responses request's prompt tokens, nothing generated.
* Ollama's native API (serve/ollama.py): ``POST /api/chat`` and ``POST /api/generate``, whole or streamed as
  newline-delimited JSON, ``GET /api/tags``, ``POST /api/show``, ``GET /api/ps``, ``GET /api/version``, its errors in
  Ollama's shape; ``GET`` / ``HEAD /`` answers "Ollama is running", the probe Ollama's clients send first.
  Ollama's model management: ``POST /api/pull`` of the model served answers Ollama's ``success`` (nothing fetched);
  a pull of another model, ``/api/push``, ``/api/create``, ``/api/copy``, ``DELETE /api/delete`` and
  ``/api/blobs/{digest}`` are a 501 in Ollama's shape saying how edgesdk builds and deploys a bundle instead.
* ``POST /infill`` (llama-server's code infill): ``input_prefix``, ``input_suffix``, ``input_extra`` and ``prompt``
  built into the model's fill-in-the-middle prompt and answered as ``/completion`` (serve/infill.py).
* ``POST /tokenize``, ``POST /detokenize`` (llama-server's): a text's token ids (a text, or an array of token ids and
  texts, as llama-server's ``tokenize_mixed`` reads it; with ``with_pieces`` each token's text), and the text of
  token ids. They run beside an answer, without waiting for its turn.
* Embeddings (serve/embeddings.py), pooled as ``--pooling`` says, each request in one turn on the board beside the
  conversation in the KV cache, which stays: ``POST /v1/embeddings`` (OpenAI's; only with the prefix, as in
  llama-server, whose ``/embedding`` and ``/embeddings`` are its own route), ``POST /embedding`` and
  ``POST /embeddings`` (llama-server's: ``content`` or ``input``, ``embd_normalize``, every token's vector with pooling
  ``none``), and Ollama's ``POST /api/embed`` and ``POST /api/embeddings`` (serve/ollama.py).

With an API key every route but ``/health`` (``/v1/health``), ``/``, and the model list ``GET /v1/models``
(``/models``) wants ``Authorization: Bearer KEY`` or, as Anthropic's clients send it, ``x-api-key: KEY`` (those stay
open, as in llama-server, whose clients list the models before they send a key; a model's card under them does
not).

Browsers on another origin (llama.cpp's web UI served elsewhere, ``fetch()`` from a page) are answered
as llama-server answers them (tools/server/server-http.cpp, its pre-routing handler): every answer,
errors included, carries ``Access-Control-Allow-Origin`` with the request's ``Origin``, and ``OPTIONS``
on any path is a preflight's answer without the API key check (a browser sends no Authorization
there), allowing credentials, ``GET, POST`` and the headers the preflight asks for. Ollama's routes answer as
Ollama does (its CORS middleware, envconfig.AllowedOrigins): only the server's own pages, local origins and those
``ollama_origins`` adds (``--ollama-origins``, OLLAMA_ORIGINS); another origin is a 403 there, preflight included, so
that a web page the user visits cannot drive the model through them. Nothing here needs a package beyond the board
runtime's.
"""

from __future__ import annotations

import email.errors
import email.message
import hmac
import io
import json
import math
import re
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TypeVar
from urllib.parse import parse_qs, unquote

from edgesdk import __version__
from edgesdk.errors import EdgeSDKError
from edgesdk.serve import anthropic, infill, llama_native, ollama, response_events, response_store, responses
from edgesdk.serve.api import (
    ApiError,
    CompletionRequest,
    json_shown,
    parse_chat_request,
    parse_detokenize_request,
    parse_text_request,
    parse_tokenize_request,
    prompt_refusal,
)
from edgesdk.serve.completion import MIN_PREDICTED_MS, Completer, Completion
from edgesdk.serve.embeddings import (
    check_dimensions,
    embedding_width,
    native_embeddings_body,
    openai_embedding_config,
    openai_embeddings_body,
    parse_embedding_request,
    parse_native_embedding_request,
)
from edgesdk.serve.model_pool import Lease, ModelPool
from edgesdk.serve.openai_answer import StreamedAnswer, model_not_found, whole_answers
from edgesdk.serve.reasoning import split_answer
from edgesdk.thermal.guard import Level

T = TypeVar("T")  # what a request's check makes of its body (_checked_then_used)


def _stream_flag(body: object, name: str) -> bool:
    """A stream's ``timings_per_token`` or ``return_progress`` on /completion, /infill, /v1/completions or
    /v1/chat/completions (llama-server's ``params_from_json_cmpl``, which reads every completion route's body: false
    where absent); anything but true, false or null is refused naming it."""
    value = body.get(name) if isinstance(body, dict) else None
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false, got {json.dumps(value)[:80]}; send true to have each "
                       "streamed event carry it, or leave it out", param=name)
    return value


class _LiveTimings:
    """The timings and prompt progress of a stream's task as its events go out, for llama-server's
    ``timings_per_token`` (server-context.cpp ``send_partial_response``: every partial result carries the slot's
    ``timings``) and ``return_progress`` (a ``prompt_progress`` object: ``total``, ``cache``, ``processed``,
    ``time_ms``, server-task.cpp ``result_prompt_progress``), on /completion, /infill and the OpenAI routes alike (their
    partial results carry both: ``to_json_oaicompat``, ``to_json_oaicompat_chat``).

    They are measured as the answer's own (Completion's ``prompt_ms`` and ``predicted_ms``): from the request's turn
    to its first token, and from the first token to the latest, less the time the thermal guard held the steps back
    (ServeMetrics' ``thermal_wait_seconds``: the board runs one request at a time, so what it adds during the turn is
    this request's). Each step of the prompt's prefill is told by :meth:`stepped` (Completer.complete's
    ``on_prefill``: one step, or the thermal guard's steps), and a ``prompt_progress`` event goes out after each, as
    llama-server sends one after each batch of the prompt it decodes (update_slots); ``processed`` counts the tokens
    the KV cache held from the prompt cache too (slot.prompt.tokens.size()). llama-server also sends one at 0% before
    the first batch; a prompt prefilled in one step gets the one event here."""

    def __init__(self, completer: Completer, evaluated: int):
        self.completer, self.evaluated = completer, evaluated
        self.start = self.first = self.step = None
        self.waited_start = self.waited_first = self.waited_step = 0.0
        self.cached = 0
        self.processed: int | None = None  # the prompt's tokens held after the latest prefill step
        self.told = False  # a prompt_progress event went out

    def _waited(self) -> float:
        return self.completer.metrics.thermal_wait_seconds

    def started(self) -> None:
        """The request's turn came: its prefill starts."""
        self.start, self.waited_start = time.perf_counter(), self._waited()

    def stepped(self, processed: int, cached: int, total: int) -> None:
        """A step of the prompt's prefill ended: the prompt's tokens the KV cache holds now, those it took from the
        prompt cache, and the prompt's."""
        if self.start is None:
            self.started()
        self.step, self.waited_step = time.perf_counter(), self._waited()
        self.processed, self.cached, self.evaluated = processed, cached, total

    def prompt_done(self) -> bool:
        """Marks the prompt processed (the first token's event, or the end of an answer that has none); True the first
        time only."""
        if self.first is not None:
            return False
        if self.step is None:  # no step was told: the prompt was processed whole by now
            cache = self.completer.prompt_cache
            self.stepped(self.evaluated, cache.reused if cache is not None else 0, self.evaluated)
        self.first, self.waited_first = self.step, self.waited_step
        return True

    def progress(self) -> dict:
        """llama-server's ``prompt_progress``: the prompt's tokens, those the KV cache held, those processed so far
        (the cached ones too), and the milliseconds since its processing started."""
        self.told = True
        return {"total": self.evaluated, "cache": self.cached, "processed": self.processed,
                "time_ms": int((self.step - self.start) * 1e3)}

    def timings(self, decoded: int) -> dict:
        """The ``timings`` object up to now, as llama_native.timings makes the last event's (the prompt's time up to
        its latest step while it is being processed)."""
        first, waited = (self.first, self.waited_first) if self.first is not None else (self.step, self.waited_step)
        prompt_ms = max((first - self.start - (waited - self.waited_start)) * 1e3, 0.0)
        predicted_ms = (time.perf_counter() - first - (self._waited() - waited)) * 1e3
        predicted_ms = max(predicted_ms, MIN_PREDICTED_MS) if decoded else 0.0
        # the guard's waits in the turn so far (Completion's thermal_wait_ms), where a guard runs
        guarded = getattr(self.completer.hook, "guard", None) is not None
        return llama_native.timings(Completion("", "length", self.evaluated, decoded, self.cached,
                                               prompt_ms=prompt_ms, predicted_ms=predicted_ms,
                                               thermal_wait_ms=(self._waited() - self.waited_start) * 1e3
                                               if guarded else None))

# A busy refusal's Retry-After (seconds): the refusal costs the server nothing, so a client may ask again soon; its
# SDK (OpenAI's, Anthropic's) waits this long before its retry instead of its own backoff
BUSY_RETRY_AFTER_S = 1
# Anthropic's status for its overloaded_error: its SDK's OverloadedError, and the fallbacks that act on it, read 529
ANTHROPIC_OVERLOADED = 529
MAX_BODY_BYTES = 1 << 20  # a prompt for a 4k-token context is a few tens of kB
BODY_TOO_LARGE_FIX = "send a shorter request body (split its input over several requests)"  # a 413's fix
# a header line that is no field line: its 400's fix
FIELD_LINE_FIX = "send each as NAME: value, with no space in the name or before its colon (RFC 9112 §5.1)"
CHUNK_LINE_LIMIT = 4096  # a chunk-size line with its extensions, or one trailer field
CHUNK_TRAILER_LINES = 100
# The standard library's limits on a request's head, which its refusals name: the request line and each header line
# (http.server reads 65,537 bytes of the line and answers 414 past 65,536; http.client's _MAXLINE gives the 431), and
# the header fields (http.client's _MAXHEADERS gives the 431)
HEAD_LINE_LIMIT = 65536
HEADER_FIELDS_LIMIT = 100
# How long one read or write on a connection may wait on its client: a request line, header or body that
# stalls, an idle keep-alive connection, a stream nobody reads (which would hold the board's one turn)
# (llama-server's read/write timeout; waiting for a turn or a thermal pause writes nothing and is not limited).
# edgesdk serve's -to N / --timeout N (LLAMA_ARG_TIMEOUT) sets it, as llama-server's. Its default stays 60 s, not
# llama-server's 600: llama-server's slots answer other clients while one stalls, but a board answers one request at
# a time, so a stream whose client stopped reading held every other client for up to ten minutes.
CLIENT_TIMEOUT_S = 60.0
# How long a whole request (its head and body) may take to come, from its first byte: a client that trickles it
# a byte at a time, each within the client timeout, would hold its connection and thread for good (a slowloris).
# Node.js's http server's requestTimeout (300 s by default); the head alone must come within the client timeout
# of its first byte, as nginx's client_header_timeout and Node's headersTimeout (60 s) bound it. llama-server's
# cpp-httplib bounds each read alone (its --timeout). 300 s lets a 1 MiB body come at 3.5 kB/s. A server given a
# longer client timeout (--timeout 600, llama-server's default) lets a request take that long too: a client
# allowed 600 s of silence in one read was cut at 300 s in all.
REQUEST_TIMEOUT_S = 300.0
PARSERS = {"/chat/completions": parse_chat_request, "/completions": parse_text_request}
# llama-server's liveness route and its /v1 alias (tools/server/server.cpp: both public, no API key check)
HEALTH_ROUTES = ("/health", "/v1/health")
# the model list, open under an API key too (tools/server/server-http.cpp get_public_endpoints: "/models" and
# "/v1/models" as written, not a model's card under them): clients list the models before they send a key
PUBLIC_MODEL_LISTS = ("/models", "/v1/models")
# llama-server's router routes (tools/server/server.cpp, registered in router mode alone, with no /v1 form): a model
# loaded ahead of its requests, or unloaded, by the name a POST body's "model" gives
ROUTER_LOAD, ROUTER_UNLOAD = "/models/load", "/models/unload"
TOKEN_ROUTES = ("/tokenize", "/detokenize", "/apply-template")  # llama-server's, answered at once (no turn on the board)
# llama-server's route table (tools/server/server.cpp): /v1/embeddings is OpenAI's; /embedding (its legacy name) and
# /embeddings are its own, so these are told apart before the /v1 prefix is dropped
OPENAI_EMBEDDINGS_ROUTE = "/v1/embeddings"
NATIVE_EMBEDDINGS_ROUTES = ("/embedding", "/embeddings")
ROUTES = ("GET /health (and /v1/health), GET /v1/models, GET /v1/models/{id}, GET /props, GET /slots, POST /v1/chat/completions, POST /v1/completions, "
          "POST /completion, POST /infill, POST /v1/responses, POST /v1/responses/input_tokens, GET and DELETE /v1/responses/{id}, "
          "GET /v1/responses/{id}/input_items, POST /v1/responses/{id}/cancel, POST /v1/messages, "
          "POST /v1/messages/count_tokens, POST /tokenize, POST /detokenize, POST /apply-template, "
          "POST /v1/embeddings, POST /embedding, POST /embeddings, POST /api/embed, POST /api/embeddings, "
          "POST /api/chat, POST /api/generate, GET /api/tags, POST /api/show, GET /api/ps, GET /api/version, "
          "POST /api/pull (of the served model), POST /models/load and POST /models/unload (llama-server's router), GET / "
          "(GET /metrics with --metrics), OPTIONS on any path (a browser's CORS preflight)")
# llama-server's routes (tools/server/server.cpp) this server does not have, each with what it does instead: their
# 404 says so rather than listing every route here
LLAMA_SERVER_ONLY = (
    (re.compile(r"(/v1)?/rerank(ing)?"),
     "it is llama-server's reranking route, which edgesdk serve does not have (it serves no reranker): rank documents "
     "by the cosine similarity of their POST /v1/embeddings vectors to the query's"),
    (re.compile(r"/lora-adapters"),
     "it is llama-server's LoRA adapter route, which edgesdk serve does not have: a bundle carries its adapters merged "
     "into its weights at build ('edgesdk build --target T --model BASE --lora ADAPTER'), none is loaded or scaled "
     "while it serves; a bundle for each adapter can be served together (edgesdk serve BUNDLE..., a request's "
     "model picks one)"),
    (re.compile(r"/slots/[^/]*"),
     "it is llama-server's slot save, restore and erase route, which edgesdk serve does not have: no KV cache is "
     "written to or read from a file; the caches of recent conversations stay in memory (serve's --cache-ram), so a "
     "conversation sent again prefills only what is new, and a request with \"cache_prompt\": false prefills its "
     "prompt whole (GET /slots shows the slot)"),
    (re.compile(r"(/v1)?/audio/transcriptions"),
     "it is llama-server's speech-to-text route, which edgesdk serve does not have: it serves text models only"),
)
CORS_METHODS = "GET, POST"  # llama-server's Access-Control-Allow-Methods
# a kept response (``/responses/{id}``: GET, DELETE), its input items (GET) and its cancel (POST, refused), as
# :func:`_api_route` gives the path
KEPT_RESPONSE = re.compile(r"/responses/([^/]+)")
KEPT_ITEMS = re.compile(r"/responses/([^/]+)/input_items")
KEPT_CANCEL = re.compile(r"/responses/([^/]+)/cancel")
# an obs-fold in a field's value (RFC 9112 §5.2): a line break, then the spaces or tabs that go on with the value
OBS_FOLD = re.compile(r"[ \t]*\r?\n[ \t]*")
# a request-target in absolute-form (RFC 9112 §3.2.2): its scheme and authority, before the path and query
ABSOLUTE_FORM = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*")
# what a request log line escapes: the C0 and C1 control characters and DEL, and the backslash that starts an
# escape (the standard library's BaseHTTPRequestHandler._control_char_table, which only its own log_message uses)
LOGGED_REASON_CHARS = 300  # the most of a refusal's message the request log shows beside its status line
LOG_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))} | {ord("\\"): "\\\\"}


def listen_address(host: str, port: int) -> tuple[socket.AddressFamily, tuple[str, int]]:
    """The socket family and address the server binds for ``host:port``: an IPv6 family for a host holding ':' (``::``
    for every interface, ``[::1]``, its brackets dropped), else IPv4, the server's own family."""
    if ":" in host:
        return socket.AF_INET6, (host.strip("[]"), port)
    return socket.AF_INET, (host, port)


class ApiServer(ThreadingHTTPServer):
    """Holds what the handlers share: the completer, the model's name, the key (or keys: a request may send any of
    them), the thermal hook."""

    daemon_threads = True  # a client that stalls mid-request does not hold the process at exit
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], completer: Completer, model: str,
                 api_key: str | tuple[str, ...] | None = None,
                 log: bool = True, client_timeout_s: float = CLIENT_TIMEOUT_S, metrics: bool = False,
                 request_timeout_s: float | None = None, pool: ModelPool | None = None,
                 ollama_origins: tuple[str, ...] = ()):
        if request_timeout_s is None:  # REQUEST_TIMEOUT_S, or the client timeout where it is longer
            request_timeout_s = max(REQUEST_TIMEOUT_S, client_timeout_s or 0.0)
        if not request_timeout_s > 0:
            raise EdgeSDKError(f"the server's request timeout must be a number of seconds > 0, got {request_timeout_s!r}",
                               "give the seconds a whole request (its head and body) may take to come, e.g. "
                               f"{REQUEST_TIMEOUT_S:g}")
        self.address_family, address = listen_address(*address)
        # ``pool``: several bundles, one loaded at a time (serve/model_pool.py); ``completer`` and ``model`` are then
        # the first one's, loaded at start, and each request answers through the model it names (the pool holds the
        # loaded one's completer, so that nothing here keeps a model it unloads)
        self._completer = completer if pool is None else None
        self.model, self.api_key, self.log, self.pool = model, api_key, log, pool
        self.api_key_bytes = _key_bytes(api_key)
        self.client_timeout_s, self.request_timeout_s = client_timeout_s, request_timeout_s
        self.metrics = metrics  # GET /metrics, as llama-server's --metrics turns it on
        self.ollama_origins = ollama_origins  # the origins Ollama's routes answer beside local ones (ollama.parse_origins)
        defaults = completer.defaults  # the responses /v1/responses keeps (``store``), in memory
        self.responses = response_store.ResponseStore(defaults.responses_kept, defaults.responses_kept_bytes)
        self.started = int(time.time())
        self._answering = 0  # requests past their body: being answered, waiting for their turn or for their model
        self._answers_done = threading.Condition()
        self.stop_signal: int | None = None  # a stop signal taken while serving: see take_stop_signal
        super().__init__(address, ApiHandler)

    def take_stop_signal(self, signum: int, frame: object = None) -> None:
        """A signal handler for the serving loop's stops (Ctrl-C, a service manager's SIGTERM): the signal is noted,
        and :meth:`service_actions` ends ``serve_forever`` with it at the loop's next turn (within its 0.5 s poll).

        Raising from the handler itself, at whatever line the main thread was on, could land inside ``threading``'s
        own locking: while the loop started a connection's handler thread (``Thread.start`` waits on a condition),
        the exception broke the condition's lock, came out as ``RuntimeError: release unlocked lock``, and
        socketserver logged it as a request's error and went on serving: the stop was lost and the process ran on."""
        self.stop_signal = signum

    def service_actions(self) -> None:
        """Called by ``serve_forever`` between requests: a stop signal taken (:meth:`take_stop_signal`) ends it, as
        Ctrl-C (``KeyboardInterrupt``) or as ``sys.exit`` with the shell's 128 + the signal's number."""
        signum = self.stop_signal
        if signum is None:
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    @property
    def completer(self) -> Completer | None:
        """The served model's completer; with several bundles the loaded one's (None while none is)."""
        return self._completer if self.pool is None else self.pool.completer

    def answer_started(self) -> None:
        with self._answers_done:
            self._answering += 1

    def answer_ended(self) -> None:
        with self._answers_done:
            self._answering -= 1
            self._answers_done.notify_all()

    def stop_answers(self, timeout: float = 30.0) -> bool:
        """Stop the completer (the answer being generated ends at its next token, its client told why)
        and wait, at most ``timeout`` s, until every answer is written; False if some were not. Run
        before the thermal session closes: a handler thread still generating would step the guard,
        and cap the clock again, after the session gave it back."""
        if self.pool is not None:
            self.pool.stop()
        else:
            self.completer.stop()
        with self._answers_done:
            return self._answers_done.wait_for(lambda: self._answering == 0, timeout)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def _native_body(body: object) -> bool:
    """A ``/v1/embeddings`` body in llama-server's own form: ``content`` and no ``input``."""
    return isinstance(body, dict) and "input" not in body and "content" in body


def _key_bytes(api_key: str | tuple[str, ...] | None) -> tuple[bytes, ...]:
    """The API key (or keys) as the bytes a request's header must carry: each key's UTF-8, as llama-server holds its
    ``--api-key`` (the command line's bytes) and compares it with the header's bytes. A key with no UTF-8 form (a
    lone surrogate) is refused here, at start, rather than failing every request."""
    keys = () if api_key is None else (api_key,) if isinstance(api_key, str) else tuple(api_key)
    encoded = []
    for index, key in enumerate(keys):
        try:
            encoded.append(key.encode("utf-8"))
        except UnicodeEncodeError as exc:  # the key itself is not shown: it is a secret
            raise EdgeSDKError(f"API key {index + 1} of {len(keys)} has no UTF-8 form ({exc.reason} at character "
                               f"{exc.start + 1}), so no request's header can carry it", "pick another key, e.g. from: "
                               "python -c 'import secrets; print(secrets.token_urlsafe())'") from None
    return tuple(encoded)


LINGER_S = 5.0  # how long a connection closed on an unread body keeps reading it
LINGER_BYTES = 64 << 20


def json_bytes(body: object) -> bytes:
    """``body`` as UTF-8 JSON text. A lone UTF-16 surrogate, which a request may carry as a ``\\ud83d`` escape into a
    field the answer repeats (a Responses request's ``metadata``), has no UTF-8 form: then the whole text is written
    with ``\\u`` escapes, as JSON allows (RFC 8259 section 7), instead of the answer failing."""
    text = json.dumps(body, ensure_ascii=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(body).encode("ascii")


def linger(connection: socket.socket, seconds: float = LINGER_S, limit: int = LINGER_BYTES) -> None:
    """Close the sending side, then read and drop what the client still sends, for up to ``seconds`` or
    ``limit`` bytes, before the socket is closed (RFC 9112 §9.6, "Tear-down": a server that closes with
    unread data makes the kernel send a reset). A client still sending a body this server refused (a
    413, a 401) would otherwise fail its write with "connection reset" and never read the refusal."""
    drained, deadline = 0, time.monotonic() + seconds
    try:
        connection.shutdown(socket.SHUT_WR)
        while drained < limit and (left := deadline - time.monotonic()) > 0:
            connection.settimeout(left)
            chunk = connection.recv(1 << 16)
            if not chunk:
                return
            drained += len(chunk)
    except OSError:  # a reset, the timeout: nothing more to wait for
        pass


class RequestDeadline(TimeoutError):
    """The request being read did not come whole within its deadline."""


class DeadlineReader(io.RawIOBase):
    """A connection's reading side: each read waits at most ``timeout`` s for the client, and none past the
    deadline of the request being read (:meth:`expect`, :meth:`until`), where it raises :class:`RequestDeadline`.
    The socket keeps ``timeout`` for its writes."""

    def __init__(self, connection: socket.socket, timeout: float | None):
        self._connection, self._timeout = connection, timeout
        self.deadline: float | None = None  # time.monotonic() past which no read waits
        self.started: float | None = None  # when the request's first byte came
        self._span: float | None = None  # the deadline, in seconds from the request's first byte

    def readable(self) -> bool:
        return True

    def expect(self, seconds: float) -> None:
        """A request's head comes next: it must be whole within ``seconds`` of its first byte (the wait for that
        byte, an idle keep-alive connection, is the client timeout's)."""
        self.deadline, self.started, self._span = None, None, seconds

    def until(self, seconds: float) -> None:
        """The request's rest must come within ``seconds`` of its first byte (of now, where its bytes came before)."""
        self.deadline, self._span = (self.started or time.monotonic()) + seconds, None

    def settled(self) -> None:
        """The request is read: reads wait the client timeout alone."""
        self.deadline = self._span = None

    def readinto(self, buffer) -> int:
        wait, capped = self._timeout, False
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise RequestDeadline("the request did not come whole within its deadline")
            capped = wait is None or left < wait
            wait = left if capped else wait
        self._connection.settimeout(wait)
        try:
            count = self._connection.recv_into(buffer)
        except TimeoutError:
            if capped:
                raise RequestDeadline("the request did not come whole within its deadline") from None
            raise
        finally:
            self._connection.settimeout(self._timeout)
        if count and self.started is None:
            self.started = time.monotonic()
            if self._span is not None:
                self.deadline = self.started + self._span
        return count


class ApiHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive for whole answers; a streamed one closes its connection
    server_version = f"edgesdk/{__version__}"
    server: ApiServer

    def setup(self) -> None:
        self.timeout = self.server.client_timeout_s  # the socket's, set by StreamRequestHandler.setup
        super().setup()
        self.rfile.close()  # the reading side, read through the request deadline
        self._reader = DeadlineReader(self.connection, self.timeout)
        self.rfile = io.BufferedReader(self._reader)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            headers = getattr(self, "headers", None)
            # a head refused before its fields were read (a 414, 431, a request line's 400) may have a body too
            broken = getattr(self, "_broken_head", False)
            unread = broken if headers is None else self._carries_body() or broken
            if self.close_connection and unread and not getattr(self, "_body_read", False):
                linger(self.connection)

    # ------------------------------------------------------------------ routing
    def do_GET(self):  # noqa: N802 (BaseHTTPRequestHandler's naming)
        self._serve(lambda route: self._get(route))

    def do_HEAD(self):  # noqa: N802 (a GET's headers without its body, as llama-server answers HEAD)
        self._serve(lambda route: self._get(route))

    def do_POST(self):  # noqa: N802
        self._serve(lambda route: self._post(route))

    def do_DELETE(self):  # noqa: N802 (a kept response's removal)
        self._serve(lambda route: self._delete(route))

    def do_OPTIONS(self):  # noqa: N802 (a browser's CORS preflight, on any path and without the API key)
        self._serve(lambda route: self._preflight(route))

    def handle_one_request(self) -> None:
        self.headers = None  # a request refused on its request line has no headers (not the previous request's)
        self._broken_head = False  # a header line refused (its body, if any, unknown: read and dropped at the close)
        self._origin_refused = False  # set by _serve: an origin Ollama's routes do not answer gets no CORS header
        self._body_read = False  # not the previous request's: this one's body, if it has one, is unread so far
        self._reader.expect(self._head_deadline_s())
        try:
            super().handle_one_request()
        except ConnectionError:  # a reset while the request line or headers were read (a keep-alive client that left
            # with an answer unread): nobody to answer, and no traceback of socketserver's in the log
            self.close_connection = True

    def _head_deadline_s(self) -> float:
        """The seconds a request's head has from its first byte: the request's time, and no more than a client's
        silence is allowed."""
        server = self.server
        return min(server.request_timeout_s, server.client_timeout_s or server.request_timeout_s)

    def send_response(self, code: int, message: str | None = None) -> None:
        """The status line and the headers every answer carries: a browser on another origin may read any of
        them, an error too, as llama-server lets it (Access-Control-Allow-Origin with the request's Origin)."""
        super().send_response(code, message)
        origin = self.headers.get("Origin") if self.headers is not None else None
        if origin and not self._origin_refused:
            self.send_header("Access-Control-Allow-Origin", origin)
            self.send_header("Vary", "Origin")  # the answer depends on it: a cache keeps one per origin

    def _preflight(self, route: str) -> None:
        """``OPTIONS``: what a browser asks before a request that is not a simple one (JSON, an Authorization
        header). Allowed: credentials, GET and POST, and the headers asked for (``*`` is no wildcard for a
        request with credentials, and never covers Authorization: Fetch standard, CORS protocol).

        llama-server has no DELETE route and allows ``GET, POST`` alone; this server's ``DELETE /v1/responses/{id}``
        is allowed too where a preflight asks for it there: a browser sends a cross-origin request only with a
        method the preflight's ``Access-Control-Allow-Methods`` lists (Fetch standard, CORS-preflight fetch), so
        "GET, POST" alone made every such DELETE fail in the browser before it was sent."""
        asked = (self.headers.get("Access-Control-Request-Headers") or "").strip()
        method = (self.headers.get("Access-Control-Request-Method") or "").strip()
        methods = CORS_METHODS
        if method == "DELETE" and KEPT_RESPONSE.fullmatch(_api_route(route)) is not None:
            methods += ", DELETE"
        self.send_response(200)
        self.send_header("Access-Control-Allow-Credentials", "true")
        self.send_header("Access-Control-Allow-Methods", methods)
        self.send_header("Access-Control-Allow-Headers", asked or "*")
        self.send_header("Content-Length", "0")
        self._connection_header()
        self.end_headers()
        self.wfile.flush()

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The base class's own refusals (a malformed request line, a line or header past its limits, a
        method with no route) in OpenAI's error shape like every other error here, not an HTML page."""
        text = message or self.responses.get(code, ("error",))[0]
        self.close_connection = True  # (the refusal's reason is logged beside its status line: _send_refusal)
        if self.headers is None:
            # The head was refused before its fields were read (a request line too long or malformed, a header line
            # too long, too many fields): what the client still sends (the rest of the head, a body) is read and
            # dropped at the close (:func:`linger`), as after a 413, so that it reads this answer rather than a
            # reset that its write of the body fails with.
            self._broken_head = True
        if code == 414:
            text = (f"the request line is longer than {HEAD_LINE_LIMIT:,} bytes, the most this server reads: send a "
                    "shorter path and query (a request's data goes in a POST body)")
        elif code == 431:
            text = (f"a request header line is longer than {HEAD_LINE_LIMIT:,} bytes" if message == "Line too long"
                    else f"the request has more than {HEADER_FIELDS_LIMIT} header fields") + \
                ", the most this server reads: send fewer or shorter header fields"
        if self.request_version == "HTTP/0.9":
            # A request line refused before its version was taken (not three words, a version that is not
            # HTTP/1.x: the HTTP/2 preface 'PRI * HTTP/2.0' of a client with prior knowledge) leaves the base class's
            # HTTP/0.9 default, whose answers have no status line or headers: the client read a bare JSON text as
            # the response. An HTTP/1.1 server answers such a request with its status line (RFC 9112 §2.3, §3;
            # RFC 9110 §15.6.6 for the 505), as llama-server's cpp-httplib answers its 400.
            self.request_version = self.protocol_version
        if code == 501:
            text += f"; this server has {ROUTES}"
        elif code == 505:
            text += "; this server speaks HTTP/1.1 (and 1.0): send the request over HTTP/1.1, not HTTP/2"
        # A method with no route on one of the Messages API's or Ollama's routes (PUT /v1/messages) is refused in
        # that API's shape, as every other refusal there; a head refused before its route was read, in OpenAI's
        route = _route(self.path) if self.headers is not None and self.path else ""
        self._anthropic, self._ollama = _anthropic_route(route), bool(route) and _ollama_route(route)
        self._send_refusal(code, self._error_body(ApiError(code, text, code="unsupported_method" if code == 501
                                                           else None, kind="invalid_request_error")))

    def _serve(self, handle) -> None:
        route = _route(self.path)
        self._body_read = self._answering = False
        # once a stream's headers are out, how its route writes an error as the stream's event (None: none out yet)
        self._stream_error: Callable[[ApiError], None] | None = None
        # the model answering: the one served, or with several the one the request's lease holds (see _use)
        self._completer, self._model = (self.server.completer, self.server.model) if self.server.pool is None else \
            (None, None)
        self._lease: Lease | None = None
        self._unload_after = False  # Ollama's keep_alive 0 on an answer, with several bundles served
        self._keep_alive: float | None = None  # Ollama's keep_alive in seconds (several bundles): the idle unload's
        self._reader.until(self.server.request_timeout_s)  # the head is in: the body comes within the request's time
        # A Messages API route: its errors in Anthropic's shape (also a 401 or 405 under another method)
        self._anthropic = _anthropic_route(route)
        self._ollama = _ollama_route(route)  # an Ollama route: its errors in Ollama's shape
        if self.command != "POST" and self._carries_body():
            self.close_connection = True  # no GET reads its body: left unread, it would be taken for the next request
        origin = self.headers.get("Origin")
        # Ollama's routes answer the origins Ollama allows (ollama.origin_allowed), a preflight too; others a 403
        self._origin_refused = bool(origin) and self._ollama and \
            not ollama.origin_allowed(origin, self.headers.get("Host"), self.server.ollama_origins)
        if self._origin_refused:
            handle = self._refuse_origin
        elif ollama.management_methods(route) and self.command != "OPTIONS":
            handle = self._ollama_management  # Ollama's model management, under any method (a 405 under another)
        try:
            handle(route)
        except ApiError as exc:
            if self.command == "POST" and not self._body_read:
                self.close_connection = True  # an unread body would be taken for the next request
            self._refuse(exc)
        except (ConnectionError, TimeoutError):  # BrokenPipeError, ConnectionResetError, ClientGone; a stalled write
            self.close_connection = True  # the client went away (or stopped reading); nothing left to answer
        except Exception as exc:  # an edgesdk error (its problem and fix), or a fault of this server (traced in its log)
            self._refuse(self._server_error(exc))
        finally:
            if self._lease is not None:
                self.server.pool.release(self._lease, unload=self._unload_after, keep_alive=self._keep_alive)
            self._lease = self._completer = None  # a kept-alive connection holds no unloaded model
            if self._answering:
                self.server.answer_ended()

    def _refuse_origin(self, route: str) -> None:
        """A request on Ollama's routes from an origin they do not answer (see :meth:`_serve`)."""
        raise ollama.origin_refused(self.headers.get("Origin"))

    def _refuse(self, error: ApiError) -> None:
        """An error's answer: its status and body in the route's API's shape; once a stream's headers are out, the
        stream's own error event (as an error within the generation is, :meth:`_complete_streamed`), its last: the
        stream's connection closes after it, which ends its body (RFC 9112 §6.3). A second status line and headers
        written into the open stream were read by its client as an event (or a line) that is no JSON."""
        if self._stream_error is None:
            status, headers = error.status, None
            if error.code == "server_busy":  # the queue is full: the same request answers once it has room
                headers = {"Retry-After": str(BUSY_RETRY_AFTER_S)}
                status = ANTHROPIC_OVERLOADED if self._anthropic else status
            self._send_refusal(status, self._error_body(error), headers)
            return
        self.close_connection = True
        self.log_message('"%s" error in the stream: %s', self.requestline, logged_reason(error.message))
        try:
            self._stream_error(error)
        except (ConnectionError, TimeoutError):
            pass  # the client went away (or stopped reading): nothing left to tell it

    def _answer_started(self) -> None:
        """The request is counted among those a stopping server waits for (:meth:`ApiServer.stop_answers`), once:
        from its turn on, or, with several bundles, from when it enters the model pool, so that a stop during a
        swap waits for it and its client gets the 503 ``server_stopping``."""
        if not self._answering:
            self.server.answer_started()
            self._answering = True

    def _end_lease(self) -> None:
        """The answer is made and about to be written (several bundles served): the request's lease ends now, before
        its client reads the answer and can ask again. Held until the handler's end, the next request of a client
        that asks as soon as it has its answer found the model still leased: with ``--max-queue 0`` a 503 on a
        server with nothing left to do. Where the model is to be unloaded with the answer (Ollama's ``keep_alive``
        0), the unload is so decided against the requests there are before the client reads it, as Ollama has
        unloaded such a model once the answer is out."""
        lease = getattr(self, "_lease", None)  # none yet for a head refused before its route was taken
        if lease is not None:
            self._lease = None
            self.server.pool.release(lease, unload=self._unload_after, keep_alive=self._keep_alive)

    def _get(self, route: str) -> None:
        if route in HEALTH_ROUTES:
            self._send_json(200, self._health())
            return
        if route == "/":  # Ollama's liveness answer, which its clients probe before anything else (open, as /health)
            self._send_body(200, ollama.RUNNING.encode(), "text/plain; charset=utf-8")
            return
        if route not in PUBLIC_MODEL_LISTS:
            self._authorise()
        pool = self.server.pool
        if route == "/api/tags":
            self._send_json(200, ollama.tags(self.server.completer, self.server.model) if pool is None else
                            ollama.listed([(model.bundle, model.name) for model in pool.models.values()]))
        elif route == "/api/ps":
            self._send_ps()
        elif route == "/api/version":
            self._send_json(200, ollama.version())
        elif route == "/metrics":
            self._send_metrics()
        elif route == "/props":
            self._send_props()
        elif route == "/slots":
            self._send_slots()
        elif _api_route(route) == "/models":
            names = [self.server.model] if pool is None else list(pool.models)
            state = None if pool is None else pool.state
            cards = [self._model_card(name, state) for name in names]
            # OpenAI's list, with the page fields of Anthropic's (its SDK reads them): one page holds every model
            self._send_json(200, {"object": "list", "data": cards, "has_more": False,
                                  "first_id": cards[0]["id"] if cards else None,
                                  "last_id": cards[-1]["id"] if cards else None})
        elif _api_route(route).startswith("/models/"):
            self._send_model(_api_route(route)[len("/models/"):])
        elif match := KEPT_ITEMS.fullmatch(_api_route(route)):
            self._send_json(200, response_store.input_items_page(self._kept(match[1]), self._query()))
        elif match := KEPT_RESPONSE.fullmatch(_api_route(route)):
            self._send_json(200, response_store.retrieved(self._kept(match[1]), self._query()))
        else:
            self._not_found(route, self.command)

    def _delete(self, route: str) -> None:
        """``DELETE /v1/responses/{id}``: the kept response removed, answered as OpenAI answers it."""
        self._authorise()
        match = KEPT_RESPONSE.fullmatch(_api_route(route))
        if match is None:
            self._not_found(route, "DELETE")
        ident = unquote(match[1])
        if not self.server.responses.delete(ident):
            raise response_store.not_found(ident)
        self._send_json(200, {"id": ident, "object": "response", "deleted": True})

    def _kept(self, segment: str) -> response_store.Kept:
        """The kept response a path segment names (percent-encoded, as clients write it), or its 404."""
        ident = unquote(segment)
        kept = self.server.responses.get(ident)
        if kept is None:
            raise response_store.not_found(ident)
        return kept

    def _query(self) -> dict[str, list[str]]:
        return parse_qs(self.path.partition("?")[2], keep_blank_values=True)

    def _send_model(self, segment: str) -> None:
        """``GET /v1/models/{model}``: the served model's card. The id comes percent-encoded, as clients write a path
        segment (the OpenAI client's ``models.retrieve("org/name")`` asks for ``/v1/models/org%2Fname``); another
        model's id is OpenAI's 404 ``model_not_found``, naming the one served (with several bundles, OpenAI's own
        message)."""
        name = unquote(segment)
        if self.server.pool is not None:
            served = list(self.server.pool.models)
            self._send_json(200, self._model_card(self.server.pool.resolve(
                name, lambda missing: model_not_found(missing, served)) or name))
            return
        if name != self.server.model:
            raise ApiError(404, f"the model {name!r} is not served here: this server serves {self.server.model!r} "
                           "(GET /v1/models lists it)", param="model", code="model_not_found")
        self._send_json(200, self._model_card(name))

    # ------------------------------------------------------------------ the model a request names
    def _use(self, body: object) -> Completer:
        """The completer that answers a request whose JSON ``body`` is read: the served model's; with several
        bundles (serve/model_pool.py) the one the body's ``model`` names (Ollama's older ``name`` too), loaded if it
        is not, once the requests before it are answered; the loaded one where it names none. An unknown name is a
        404 in the route's API's words. The request holds its model until its answer is made: the lease ends as the
        answer (or a stream's last event) is about to be written (:meth:`_end_lease`), else at the handler's end
        (:meth:`_serve`)."""
        pool = self.server.pool
        if pool is None:
            return self._completer
        name = self._named_model(body)
        self._answer_started()  # a stop waits for a request waiting for its model, or loading it
        self._lease = pool.acquire(name, self._client_gone)
        self._completer, self._model = self._lease.completer, self._lease.name
        return self._completer

    def _asked_name(self, body: object) -> object:
        """The model's name as the request's body gives it (None: none), from the field :meth:`_name_field` picks."""
        return body.get(self._name_field(body)) if isinstance(body, dict) else None

    def _name_field(self, body: object) -> str:
        """The body's field that names the model: ``model``; on Ollama's routes the older ``name`` where ``model`` is
        absent or empty and ``name`` is given, as Ollama's ShowHandler reads it (server/routes.go: ``if req.Model !=
        "" {} else if req.Name != "" { req.Model = req.Name }``; a Go client filling the deprecated ``Name`` sends
        ``"model": ""`` beside it) and as ollama.py's parsers read it."""
        if self._ollama and isinstance(body, dict) and body.get("model") in (None, "") and "name" in body:
            return "name"  # older Ollama clients' field
        return "model"

    def _named_model(self, body: object) -> str | None:
        """The served name the request's body names (None: none), or the 404 of a name not served; a value that is
        no name is a 400 naming the field it came from."""
        name = self._asked_name(body)
        pool = self.server.pool
        served = list(pool.models)  # named in the 404, in the route's API's words
        not_found = ollama.model_not_found if self._ollama else \
            anthropic.model_not_found if self._anthropic else model_not_found
        return pool.resolve(name, lambda missing: not_found(missing, served), self._name_field(body))

    def _described(self, body: object) -> Completer:
        """The completer that describes the model a request names without running it (/api/show, a prompt's token
        count, /tokenize, /detokenize, /apply-template): the served model's; with several bundles the named one's
        tokenizer and settings (:meth:`ModelPool.described`), loaded or not (the loaded one where the request names
        none), with no turn in the queue and no swap."""
        pool = self.server.pool
        if pool is None:
            return self._completer
        name = self._named_model(body) or pool.loaded[0] or pool.default
        self._model = name
        return pool.described(name)

    def _checked_then_used(self, body: object, check: Callable[[Completer], T]) -> tuple[Completer, T]:
        """The completer that answers the request (:meth:`_use`) and what ``check`` makes of its body, checked first:
        with several bundles against the named model's description (:meth:`_described`: its tokenizer and settings,
        nothing loaded), so that a request refused whole (a 400 for its body; the 404 of a model not served comes
        first) swaps no model in and leaves the loaded one to the clients using it, as Ollama's handlers check a
        request before ``scheduleRunner`` loads its model (server/routes.go). Where the request names no model and
        another was loaded for its turn in the meantime, ``check`` runs again on the model that answers."""
        described = self._described(body)
        described_as = self._model
        checked = check(described)
        completer = self._use(body)
        if completer is not described and self._model != described_as:
            checked = check(completer)
        return completer, checked

    def _loaded_now(self) -> tuple[str | None, Completer | None]:
        """The loaded model's name and completer, read together (an unload between two reads would part them); with
        several bundles a None completer while none is loaded."""
        pool = self.server.pool
        return (self.server.model, self.server.completer) if pool is None else pool.loaded

    def _loaded(self) -> tuple[str, Completer]:
        """:meth:`_loaded_now` for /slots, which describes the model without a turn of its own: a 503 while none is
        loaded, as llama-server answers while it loads its model."""
        name, completer = self._loaded_now()
        if completer is None:
            raise ApiError(503, "no model is loaded now (one is being loaded, or the last was unloaded or failed to "
                           "load); a request naming a model loads it (GET /v1/models lists them)",
                           code="model_not_loaded", kind="unavailable_error")
        return name, completer

    def _send_props(self) -> None:
        """llama-server's ``GET /props``: the loaded model's; with several bundles ``?model=NAME`` asks for that
        model's (loaded for it where it is not, as llama-server's router forwards it to that model's server)."""
        pool, asked = self.server.pool, self._query_value("model")
        name, completer = self._loaded_now()
        if pool is not None and (asked or completer is None):
            completer = self._use({"model": asked})
            self._send_json(200, completer.props(self._model))
            return
        self._send_json(200, completer.props(name))

    def _send_ps(self) -> None:
        """Ollama's ``GET /api/ps``: the loaded model (none while none is, as Ollama lists none after an unload).
        The pool's model and completer are read together: an unload between two reads answered a 503."""
        name, completer = self._loaded_now()
        if completer is None:
            self._send_json(200, {"models": []})
            return
        self._send_json(200, ollama.running(completer, name))

    def _router_models(self, route: str) -> None:
        """llama-server's router routes, ``POST /models/load`` and ``POST /models/unload`` with ``{"model": NAME}``
        (tools/server/server-models.cpp ``post_router_models_load`` / ``_unload``): ``{"success": true}``, or, as
        there, a 400 for a load of a model loaded (or being loaded) and for an unload of one that is not. A load of a
        model loaded (or being loaded) whose unload is pending (an unload request, or Ollama's ``keep_alive`` 0, while
        an answer holds it or while it loads), or that an answer holds now (which may unload it as it ends: its
        ``keep_alive`` 0, or the server's default 0), keeps it, as a request for it would, and is answered
        ``{"success": true}``: refused, the model went once the answer holding it ended, though the client's last
        word was to load it. With the server's default ``keep_alive`` 0 (unload after each answer) a load is no
        answer: the model it loads or keeps stays for the next request, whose answer then decides. A router
        client loads a model ahead of its first request, or frees the board's memory, without sending a prompt.

        A load takes its turn in the pool's queue and swaps the model in as Ollama's load request (an empty prompt)
        does (:meth:`_use`); it is answered once the model is loaded, or with the 500 of a load that failed.
        llama-server answers at once and loads in the background, its client polling GET /models for the status:
        answered after the load, that client reads "loaded" at its first poll, and a script needs no poll. An unload
        is :meth:`ModelPool.unload`, Ollama's ``keep_alive`` 0: answered at once, the model gone now or once the
        answers holding it are written. An unknown name is OpenAI's 404 ``model_not_found``, as on every OpenAI-shaped
        route here (llama-server's load answers 404, its unload 400). With one bundle served, its model stays loaded
        while the server runs: its load is the 400 of a model loaded, and an unload is refused saying how to serve
        several."""
        self._authorise()
        body, pool = self._read_json(), self.server.pool
        served = [self.server.model] if pool is None else list(pool.models)
        asked = body.get("model") if isinstance(body, dict) else None
        if not isinstance(asked, str) or not asked:
            raise ApiError(400, f"{route} takes a JSON object naming the model, {{\"model\": NAME}} with NAME one of "
                           f"{', '.join(served)} (GET /v1/models lists them), got {json_shown(body)}", param="model")
        if pool is None:
            if asked != self.server.model:
                raise model_not_found(asked, served)
            name, loaded, loading = asked, asked, None
        else:
            name = pool.resolve(asked, lambda missing: model_not_found(missing, served))
            loaded, completer, loading = pool.state
            loaded = loaded if completer is not None else None
        unload = route == ROUTER_UNLOAD
        if unload and pool is None:
            raise ApiError(400, f"the model {name!r} stays loaded while this server runs: it serves one bundle; serve "
                           "several (edgesdk serve BUNDLE BUNDLE..., or --models-dir DIR) to load and unload them on "
                           "request", param="model", code="model_not_unloadable")
        # a model held by an answer is leased too, as a request for it would be: that answer's keep_alive 0 (or the
        # server's default 0) would otherwise unload it as it ends, after this load was answered 400 "already loaded"
        kept = pool is not None and (pool.unload_pending(name) or pool.held(name))
        if not unload and name in (loaded, loading) and not kept:
            raise ApiError(400, f"the model {name!r} is already {'loaded' if name == loaded else 'being loaded'}: a "
                           "request naming it is answered by it (GET /v1/models shows each model's status)",
                           param="model", code="model_already_loaded")
        if unload and name not in (loaded, loading):
            raise ApiError(400, f"the model {name!r} is not loaded ({f'{loaded!r} is' if loaded else 'none is'}): "
                           "nothing to unload (GET /v1/models shows each model's status)", param="model",
                           code="model_not_loaded")
        if unload:
            self._answer_started()  # a stop waits for it, as for a request waiting for its model
            pool.unload(name)
        else:  # a lease taken, as a request's: a pending unload of the model is undone by it (ModelPool._grant)
            self._use({"model": name})
            if pool.keep_alive_s == 0:  # the server's default unloads after each answer: a load is none, and the
                self._keep_alive = math.inf  # model it loads stays for the next request (whose answer then decides)
            self._end_lease()  # loaded: the model is the next request's at once
        self._send_json(200, {"success": True})

    def _error_body(self, error: ApiError) -> dict:
        if getattr(self, "_ollama", False):
            return ollama.error_body(error)
        return anthropic.error_body(error) if self._anthropic else error.body()

    def _post(self, route: str) -> None:
        path = _api_route(route)
        if route == OPENAI_EMBEDDINGS_ROUTE or route in NATIVE_EMBEDDINGS_ROUTES:
            self._embeddings(route)
            return
        if route in ollama.POST_ROUTES:
            self._ollama_post(route)
            return
        if path in anthropic.ROUTES:
            self._messages(path)
            return
        if path == responses.ROUTE:
            self._responses()
            return
        if path == responses.COUNT_ROUTE:
            self._response_input_tokens()
            return
        if route in (ROUTER_LOAD, ROUTER_UNLOAD):
            self._router_models(route)
            return
        if match := KEPT_CANCEL.fullmatch(path):
            self._authorise()
            self._body_read = not self._carries_body()  # the client's cancel has no body: nothing left to read
            raise response_store.not_cancelled(self._kept(match[1]))
        if path in TOKEN_ROUTES:
            self._authorise()
            body = self._read_json()
            completer = self._described(body)  # the tokenizer and template alone: no turn, no swap
            if path == "/tokenize":
                self._send_json(200, completer.tokenize(parse_tokenize_request(body)))
            elif path == "/apply-template":  # the prompt a chat request renders to, nothing generated
                self._send_json(200, {"prompt": completer.rendered_chat(parse_chat_request(body))})
            else:
                self._send_json(200, completer.detokenize(parse_detokenize_request(body)))
            return
        if path == llama_native.ROUTE:
            self._native_completion(llama_native.parse_completion_request, several=True)
            return
        if path == infill.ROUTE:  # the infill prompt's token ids, answered as /completion
            self._native_completion(infill.parse_infill_request)
            return
        parse = PARSERS.get(path)
        if parse is None:
            self._not_found(route, "POST")
        self._authorise()
        body = self._read_json()
        flags = _stream_flag(body, "timings_per_token"), _stream_flag(body, "return_progress")
        if parse is not parse_text_request:
            # With several bundles, a chat request refused whole swaps no model in: its model's name is checked (the
            # 404 first), then its body, and only then is its model loaded, as /v1/messages and Ollama's routes do
            # here and as Ollama's OpenAI middleware refuses a body before ChatHandler schedules the model
            # (middleware/openai.go ChatMiddleware, then server/routes.go ChatHandler's scheduleRunner). Its prompt
            # too, against the model's context (_before_swap).
            completer, requests = self._checked_then_used(body, lambda model: self._before_swap(model, [parse(body)]))
        else:
            # a suffix on /v1/completions builds its fill-in-the-middle prompt from the served model's FIM tokens;
            # several prompts are a task each, checked before any runs, and before the model is loaded
            completer, requests = self._checked_then_used(body, lambda model: self._before_swap(
                model, self._prompt_requests(body, lambda one: parse(one, completer=model), model)))
        self._answer_started()
        if requests[0].stream:
            self._stream(requests, *flags)
        else:
            completions = [completer.complete(request, client_gone=self._client_gone) for request in requests]
            self._send_json(200, whole_answers(completer, requests, self._model, completions))

    def _before_swap(self, completer: Completer, requests: list[CompletionRequest]) -> list[CompletionRequest]:
        """``requests``, their prompts checked first where several bundles are served, as
        :meth:`Completer.complete` checks them before a request's turn (its tokens against the vocabulary and the
        context, its sampling, its context shift; a grammar's or schema's constraint is left to it): ``completer``
        is then the named model's description (:meth:`_checked_then_used`), so that a prompt past the model's context
        (llama-server's exceed_context_size_error) is refused without swapping that model in. With one bundle
        :meth:`Completer.complete` alone checks them."""
        if self.server.pool is not None:
            for request in requests:
                completer.context_shift(request, completer.prompt_ids(request), completer.sampling(request))
        return requests

    @staticmethod
    def _prompt_requests(body: object, parse: Callable[[object], CompletionRequest],
                         completer: Completer) -> list[CompletionRequest]:
        """The requests of ``body``'s prompts, as llama-server's ``handle_completions_impl`` makes a task of each of
        the prompts ``tokenize_input_prompts`` finds (:func:`llama_native.prompts`: a string, token ids, ids mixed
        with strings, or an array of those) on ``/v1/completions`` and ``/completion``. Of several, every prompt is
        checked before any runs (its fields, its tokens against the vocabulary and the context, its context shift),
        and a refusal names the prompt (``'prompt[1]'``: :func:`prompt_refusal`)."""
        bodies = llama_native.prompts(body)
        if len(bodies) == 1:
            return [parse(bodies[0])]
        requests = []
        for index, one in enumerate(bodies):
            try:
                request = parse(one)
            except ApiError as exc:
                if exc.param != "prompt":  # a field all the prompts share: refused as it is
                    raise
                raise prompt_refusal(exc, index) from exc
            try:  # what Completer.complete checks before the turn, for this prompt
                completer.context_shift(request, completer.prompt_ids(request), completer.sampling(request))
            except ApiError as exc:
                raise prompt_refusal(exc, index) from exc
            requests.append(request)
        return requests

    def _embeddings(self, route: str) -> None:
        """OpenAI's ``POST /v1/embeddings`` or llama-server's ``POST /embedding`` (serve/embeddings.py).

        A ``/v1/embeddings`` body with llama-server's ``content`` and no ``input`` is answered as ``/embedding``
        answers it (its vectors normalised as ``embd_normalize`` says, in llama-server's shape), as llama-server's
        ``handle_embeddings_impl`` takes it ("content" field is not OAI compatible), after the same refusal of
        pooling ``none``."""
        self._authorise()
        body = self._read_json()

        def checked(completer: Completer) -> tuple:
            pooling = completer.defaults.pooling
            if route == OPENAI_EMBEDDINGS_ROUTE:  # pooling none refused first, as llama-server refuses it
                config = openai_embedding_config(pooling)
                if not _native_body(body):
                    served = [self.server.model] if self.server.pool is None else list(self.server.pool.models)
                    request = parse_embedding_request(body, served)  # a served name is never OpenAI's model
                    check_dimensions(request, embedding_width(completer.runtime.bundle.manifest))  # before any runs
                    return config, request, request.inputs, "input"
            native = parse_native_embedding_request(body, pooling)
            return native.config, None, native.inputs, native.param

        # the body checked before its model is loaded: a refused request swaps no model in
        completer, (config, request, inputs, param) = self._checked_then_used(body, checked)
        self._answer_started()
        embeddings = completer.embed(inputs, config, param=param, client_gone=self._client_gone)
        self._log_embedded(route, embeddings)
        if request is not None:
            # the request's model where it names one, as llama-server echoes it (json_value(request, "model", name))
            asked = body.get("model")
            self._send_json(200, openai_embeddings_body(embeddings, asked if isinstance(asked, str) else self._model,
                                                        request))
        else:
            self._send_json(200, native_embeddings_body(embeddings))

    def _log_embedded(self, route: str, embeddings: list) -> None:
        """The request log's line on an embedding: how many inputs, their tokens, and how many were cut to fit."""
        cut = sum(embedding.truncated for embedding in embeddings)
        self.log_message("%s: %d input(s) embedded, %d token(s)%s", route, len(embeddings),
                         sum(embedding.tokens for embedding in embeddings),
                         f", {cut} cut to the context" if cut else "")

    def _native_completion(self, parse: Callable[[object, Completer], CompletionRequest],
                           several: bool = False) -> None:
        """llama-server's ``POST /completion`` (edgesdk/serve/llama_native.py) or ``POST /infill``
        (edgesdk/serve/infill.py), as ``parse`` reads the body, whole or streamed.

        With ``several`` (/completion), a ``prompt`` of several prompts (``["a", "b"]``, llama_native.prompts) is a
        task each, as llama-server's
        ``handle_completions_impl`` makes them: every prompt is checked before any runs, the answers come whole as an
        array in the prompts' order, each with its ``index``; streamed, each prompt's events (its ``index`` in each)
        end with its own ``"stop": true`` event, the prompts one after another (the board answers one at a time).

        ``parse`` reads the body with the completer of the model named (llama-server's router reads ``model`` on
        /completion and /infill too); the body is checked whole before that model is loaded
        (:meth:`_checked_then_used`)."""
        self._authorise()
        body = self._read_json()

        def tasks_of(completer: Completer) -> list[tuple[CompletionRequest, str, dict, int]]:
            requests = self._prompt_requests(body, lambda one: parse(one, completer), completer) if several else \
                [parse(body, completer)]
            tasks = []
            for request in requests:
                # The answer's "prompt" is the prompt's tokens as text, special tokens written out (a text prompt's
                # BOS too), as llama-server gives it back (server.cpp: the task's tokens detokenized with special =
                # true); its token count is every streamed event's tokens_evaluated
                prompt_ids = completer.prompt_ids(request)
                prompt = completer.runtime.tokenizer.tokenizer.decode(prompt_ids, skip_special_tokens=False)
                tasks.append((request, prompt, llama_native.generation_settings(
                    request, completer.sampling(request), completer.defaults.n_keep, completer.defaults.max_tokens,
                    completer.shifts(request), completer.speculative_params(request)), len(prompt_ids)))
            return tasks

        if self.server.pool is not None:
            self._named_model(body)  # a model not served is the 404, before the body's own checks
        # a body that is no JSON object is the parser's 400 (``_checked_then_used``), not a fault reading these
        fields = llama_native.response_fields(body) if isinstance(body, dict) else ()
        ids = llama_native.return_tokens(body)
        per_token, progress = _stream_flag(body, "timings_per_token"), _stream_flag(body, "return_progress")
        completer, tasks = self._checked_then_used(body, tasks_of)
        requests = [request for request, _, _, _ in tasks]
        self._answer_started()
        if not requests[0].stream:
            answers = []
            for index, (request, prompt, settings, _) in enumerate(tasks):
                completion = completer.complete(request, client_gone=self._client_gone)
                answers.append(llama_native.only_fields(llama_native.final_body(
                    request, self._model, completion, settings, prompt=prompt, tokens=ids, index=index), fields))
            self._send_json(200, answers[0] if len(answers) == 1 else answers)
            return
        for index, (request, prompt, settings, evaluated) in enumerate(tasks):
            given: list[int] = []
            decoded = [0]  # the answer's tokens handed out so far, in this event's too
            live = _LiveTimings(completer, evaluated)

            def progress_event(index: int = index, evaluated: int = evaluated, live: _LiveTimings = live) -> None:
                """``return_progress``'s event: the prompt's progress, no text, no token yet."""
                event = self._partial_event("", None, [], index, 0, evaluated)
                if per_token:
                    event["timings"] = live.timings(0)
                event["prompt_progress"] = live.progress()
                self._event(event)

            def on_prefill(processed: int, cached: int, total: int, live: _LiveTimings = live,
                           progress_event: Callable[[], None] = progress_event) -> None:
                """A step of the prompt's prefill ended: its progress event, as llama-server's after each batch."""
                live.stepped(processed, cached, total)
                if progress:
                    progress_event()

            def prompt_processed(live: _LiveTimings = live, progress_event: Callable[[], None] = progress_event) -> None:
                """The prompt is processed: its progress event where no step told it."""
                if live.prompt_done() and progress and not live.told:
                    progress_event()

            def on_ids(tokens: list[int], given: list[int] = given) -> None:
                given[:] = tokens

            def on_text(text: str, probabilities: list | None, given: list[int] = given, index: int = index,
                        decoded: list[int] = decoded, evaluated: int = evaluated, live: _LiveTimings = live,
                        prompt_processed: Callable[[], None] = prompt_processed) -> None:
                if text or probabilities or given:  # a token that made no text still has its id and probabilities
                    prompt_processed()
                    decoded[0] += len(given)
                    event = self._partial_event(text, probabilities, given, index, decoded[0], evaluated)
                    if per_token:
                        event["timings"] = live.timings(decoded[0])
                    self._event(event)
                given.clear()

            completion = self._complete_streamed(request, on_text, live.started,
                                                 lambda error: self._event(error.body()), headers_out=index > 0,
                                                 on_ids=on_ids, on_prefill=on_prefill)
            if completion is None:
                return
            prompt_processed()  # an answer with no event of its own (n_predict 0) still tells its prompt's progress
            final = llama_native.only_fields(llama_native.final_body(
                request, self._model, completion, settings, content="", prompt=prompt, index=index), fields)
            if index == len(tasks) - 1:
                self._end_lease()  # the stream's last event: the model is free before its client reads it
            self._event(final)

    @staticmethod
    def _partial_event(text: str, probabilities: list | None, tokens: list[int], index: int, decoded: int,
                       evaluated: int) -> dict:
        """A /completion or /infill stream's event for a piece of the answer, with the counts every partial result
        of llama-server carries (server-task.cpp ``server_task_result_cmpl_partial::to_json_non_oaicompat``:
        ``tokens_predicted``, the answer's tokens sampled up to this event's, its ``n_decoded``; ``tokens_evaluated``,
        the prompt's tokens, its ``n_prompt_tokens``), as the stream's last event carries them."""
        event = llama_native.partial_body(text, probabilities, tokens, index)
        event.update(tokens_predicted=decoded, tokens_evaluated=evaluated)
        return event

    def _messages(self, path: str) -> None:
        """Anthropic's Messages API (edgesdk/serve/anthropic.py): an answer, or a prompt's token count."""
        self._authorise()
        body = self._read_json()
        if path == "/messages/count_tokens":  # no max_tokens there: the prompt alone is counted
            completer = self._described(body)
            request = anthropic.parse_messages_request({**body, "max_tokens": 1} if isinstance(body, dict) else body,
                                                       counting=True)
            try:
                counted = len(completer.prompt_ids(request))
            except ApiError as exc:
                if exc.code != "context_length_exceeded":
                    raise
                # A prompt past the context is counted too (what the route is asked for, as llama-server's
                # counts it): its text passed every other check, only its length is refused.
                counted = len(completer.runtime.tokenizer.chat_ids(completer.chat_text(request)))
            self._send_json(200, {"input_tokens": counted})
            return
        if self.server.pool is not None:
            self._named_model(body)  # a model not served is the 404, before the body's own checks
        # checked before the model is: a request refused whole swaps no model in (Ollama's handlers check theirs
        # before scheduleRunner, as /api/chat does here)
        request = anthropic.parse_messages_request(body)
        completer, _ = self._checked_then_used(body, lambda model: self._before_swap(model, [request]))
        self._answer_started()
        ident = anthropic.new_message_id()
        # a thinking model's reasoning as a thinking block (never inside the text, as deepseek-legacy streams it)
        splitter = completer.reasoning_splitter(replace(request, stream=False))
        if not request.stream:
            completion = completer.complete(request, client_gone=self._client_gone)
            reasoning, text = "", None
            if splitter is not None:
                closed = llama_native.ended_at_eos(completion)
                reasoning, text = split_answer(splitter, completion.text, closed=closed)
            self._send_json(200, anthropic.message_body(request, ident, self._model, completion, reasoning, text,
                                                        completer.tools_think_opened(request)))
            return
        # an answer under tools is JSON: its call's input or its text goes out as it settles (anthropic.ToolStream)
        answer = anthropic.ToolStream(completer.tools_think_opened(request)) if request.tools is not None else None
        blocks = anthropic.ThinkingStream() if splitter is not None else None
        ids = completer.prompt_ids(request)
        def opened() -> None:
            # in the request's turn, before its prefill: the tokens the prompt cache will serve are known, and
            # message_start splits the prompt into input_tokens and cache_read_input_tokens as the closing
            # message_delta does (llama-server's message_start carries the split too)
            cache = completer.prompt_cache
            cached = cache.reusable(ids, reuse=request.cache_prompt) if cache is not None else 0
            for name, data in anthropic.start_events(ident, self._model, len(ids), cached,
                                                     answer is None and blocks is None):
                self._named_event(name, data)

        def on_text(text: str, logprobs: dict | None) -> None:
            if answer is not None:
                events = answer.push(text)
            elif blocks is not None:
                events = blocks.pieces(*splitter.push(text))
            else:
                events = [anthropic.text_event(text)] if text else []
            for name, data in events:
                self._named_event(name, data)

        completion = self._complete_streamed(request, on_text, opened,
                                             lambda error: self._named_event("error", anthropic.error_body(error)))
        if completion is None:
            return
        closing, finish_reason = None, None
        if answer is not None:
            closing, finish_reason = answer.close(completion.finish_reason)
        elif blocks is not None:
            # a tag's start at the end stays in the thinking where the model ended the answer (the whole answer's
            # split, above)
            closing = blocks.pieces(*splitter.flush(closed=llama_native.ended_at_eos(completion))) + blocks.close()
        events = list(anthropic.end_events(request, completion, closing, finish_reason))
        self._end_lease()  # the answer is made: the model is free before the client reads the stream's end
        for name, data in events:
            self._named_event(name, data)

    def _ollama_post(self, path: str) -> None:
        """Ollama's ``/api/chat``, ``/api/generate`` (whole, or streamed as newline-delimited JSON: Ollama streams
        unless ``stream`` is false), ``/api/show``, ``/api/embed`` and ``/api/embeddings`` (edgesdk/serve/ollama.py)."""
        self._authorise()
        body, pool = self._read_json(), self.server.pool
        # with several bundles the name the body gives (checked by the parsers below), which every route needs
        served = self.server.model if pool is None else self._named_model(body)
        if served is None:
            if isinstance(body, dict):
                raise ollama.model_required(body.get("model", body.get("name")), list(pool.models))
            served = pool.loaded[0] or pool.default  # not an object: the parsers below refuse it
        # The parsers check the body's name against the one given them and answer with the body's (Ollama answers
        # with req.Model): with several bundles, the name as the request wrote it, which the pool matched to
        # ``served`` as Ollama matches a name (any case; name:latest for name, ModelPool.resolve).
        asked_as = self._asked_name(body) if pool is not None else served
        asked_as = asked_as if isinstance(asked_as, str) and asked_as else served
        if path == ollama.SHOW_ROUTE:  # the model's files described, nothing loaded (Ollama's show handler)
            self._send_json(200, ollama.show(self._described(body), served,
                                             {**body, "model": served} if pool is not None and isinstance(body, dict)
                                             else body))
            return
        # Ollama unloads a model once an answer with keep_alive 0 is written; a board serving one bundle keeps it
        self._unload_after = pool is not None and ollama.keep_alive_zero(body)
        self._keep_alive = ollama.keep_alive(body) if pool is not None else None  # the idle unload after this answer
        if path in (ollama.EMBED_ROUTE, ollama.EMBEDDINGS_ROUTE):
            started = time.monotonic_ns()
            to_embed = (ollama.parse_embed if path == ollama.EMBED_ROUTE else ollama.parse_embeddings)(body, asked_as)
            completer, load_ns = self._use_timed(body)
            self._answer_started()
            embeddings = ollama.embed(completer, to_embed, client_gone=self._client_gone)
            if embeddings:  # none: the model was only to be loaded
                self._log_embedded(path, embeddings)
            answered = ollama.embed_body(to_embed, embeddings, started, load_ns)
            self._end_lease()
            self._send_json(200, answered)
            return
        asked = (ollama.parse_chat if path == ollama.CHAT_ROUTE else ollama.parse_generate)(body, asked_as)
        if asked.request is None and asked.unload and pool is not None:  # Ollama's unload request: nothing is loaded
            self._answer_started()  # a stop waits for it, as for a request waiting for its model
            pool.unload(served)
            self._send_json(200, ollama.loaded(asked, None))
            return
        started = time.monotonic_ns()
        completer, load_ns = self._use_timed(body)
        if asked.request is None:  # nothing to generate: the model is loaded (with several bundles, loaded for it)
            self._send_json(200, ollama.loaded(asked, completer))
            return
        request = ollama.windowed(completer, asked)
        dropped = len(asked.request.messages) - len(request.messages)
        if dropped > 0:  # Ollama notes its truncation in its debug log; here the request log says it
            self.log_message("%s: %d oldest message(s) dropped to fit the context", path, dropped)
        self._answer_started()
        # a thinking model's answer to a format in two passes, as Ollama's ChatHandler gives it: the thinking
        # unconstrained, then the content held to the format (ollama.thinking_first); else the one request
        answer = ollama.Answer(completer, asked, request, started_ns=started, load_ns=load_ns)
        if not request.stream:
            completion = completer.complete(answer.first or request, on_text=answer.listener(),
                                            client_gone=self._client_gone)
            second = answer.formatted(completion)
            if second is not None:
                completion = completer.complete(second, client_gone=self._client_gone)
            answered = answer.whole(completion)
            self._end_lease()
            self._send_json(200, answered)
            return

        on_text = answer.listener(self._json_line)
        completion = self._complete_streamed(answer.first or request, on_text, lambda: None,
                                             lambda error: self._json_line(ollama.error_body(error)),
                                             content_type=ollama.CONTENT_TYPE)
        second = None if completion is None else answer.formatted(completion)
        if second is not None:  # the stream is open: an error now is its last line
            completion = self._complete_streamed(second, on_text, lambda: None,
                                                 lambda error: self._json_line(ollama.error_body(error)),
                                                 content_type=ollama.CONTENT_TYPE, headers_out=True)
        if completion is None:
            return
        lines = answer.closing(completion)
        self._end_lease()
        for line in lines:
            self._json_line(line)

    def _ollama_management(self, route: str) -> None:
        """Ollama's model-management routes (serve/ollama.py): a pull of a model served answers as Ollama's pull of a
        model it has (its statuses streamed unless ``stream`` is false, then its success alone), nothing fetched;
        the others are refused, saying what to do instead."""
        self._refuse_management(route)
        served = [self.server.model] if self.server.pool is None else list(self.server.pool.models)
        if ollama.parse_pull(self._read_json(), served):
            self._send_body(200, b"".join(json_bytes({"status": status}) + b"\n" for status in ollama.PULL_STATUSES),
                            ollama.CONTENT_TYPE)
        else:
            self._send_json(200, ollama.PULLED)

    def _refuse_management(self, route: str) -> None:
        """The refusal of an Ollama model-management request on its head alone: a 405 under another method than
        Ollama's, the API key's 401, the 501 of any route but a pull."""
        methods = ollama.management_methods(route)
        if self.command not in methods:
            self._allow = ", ".join(methods)
            raise ApiError(405, f"{route} takes {self._allow}, not {self.command}, as Ollama's API has it",
                           code="method_not_allowed")
        self._authorise()
        if route != ollama.PULL_ROUTE:
            raise ollama.unmanaged(route)

    def _use_timed(self, body: object) -> tuple[Completer, int]:
        """:meth:`_use`, and the nanoseconds it took where several bundles are served: Ollama's ``load_duration``,
        the time from the request's start until its model was scheduled (server/routes.go: ``checkpointLoaded.Sub(
        checkpointStart)`` around ``scheduleRunner``), the model's load and any wait for it included. A single
        bundle is loaded before the server starts: 0."""
        scheduled = time.monotonic_ns()
        completer = self._use(body)
        return completer, 0 if self.server.pool is None else time.monotonic_ns() - scheduled

    def _json_line(self, body: dict) -> None:
        """One object of a newline-delimited JSON stream (Ollama's streams)."""
        self.wfile.write(json_bytes(body) + b"\n")
        self.wfile.flush()

    def _responses(self) -> None:
        """OpenAI's Responses API (edgesdk/serve/responses.py): an answer, whole or streamed as named events."""
        self._authorise()
        kept = self.server.responses
        body = self._read_json()

        def checked(completer: Completer) -> tuple:
            asked = responses.parse_responses_request(body, kept)
            # a bad logit_bias id is the request's 400, before any stream opens
            sampling = completer.sampling(asked.request)
            try:  # truncation "auto": the oldest items dropped until it fits, before the context is checked
                request = responses.truncated(completer, asked)
                self._before_swap(completer, [request])
            except ApiError as exc:  # named as the Responses field, as an answer's refusal is
                raise responses.answering_error(exc, asked) from None
            return asked, request, sampling, completer.reasoning_splitter(replace(asked.request, stream=False))

        # the body checked before its model is loaded: a refused request swaps no model in
        completer, (asked, request, sampling, splitter) = self._checked_then_used(body, checked)
        dropped = len(asked.request.messages) - len(request.messages)
        if dropped > 0:  # as the Ollama routes say theirs
            self.log_message("%s: %d oldest message(s) dropped to fit the context (truncation auto)",
                             responses.ROUTE, dropped)
        tokenizer = completer.runtime.tokenizer
        output = response_events.Output(asked, self._model, sampling.temperature, sampling.top_p,
                                        # a thinking model's reasoning as a reasoning item (never inside the text)
                                        splitter=splitter,
                                        count_tokens=lambda text: len(tokenizer.encode(text, add_special_tokens=False)),
                                        think_opened=completer.tools_think_opened(request))
        self._answer_started()
        if not request.stream:
            try:
                completion = completer.complete(request, client_gone=self._client_gone)
            except ApiError as exc:  # named as the Responses field (the messages as a whole are 'input')
                raise responses.answering_error(exc, asked) from None
            answer = output.whole(completion)
            if asked.store:  # kept before it is sent: a client may ask for it as soon as it has it
                kept.put(answer, asked.items)
            self._send_json(200, answer)
            return

        def opened() -> None:
            events = output.start()
            if asked.store:  # kept in progress before its id goes out: a client may ask for it while it streams
                kept.begin(events[0][1]["response"], asked.items)
            for name, data in events:
                self._named_event(name, data)

        def on_text(text: str, logprobs: dict | None) -> None:
            for name, data in output.push(text, logprobs):
                self._named_event(name, data)

        def failed(error: ApiError) -> None:
            kept.abandon(output.ident)  # before the error event goes out, as the end is kept before its event
            self._named_event(*output.error(responses.answering_error(error, asked)))

        try:
            completion = self._complete_streamed(request, on_text, opened, failed)
        except ApiError as exc:  # refused before the stream opened
            kept.abandon(output.ident)
            raise responses.answering_error(exc, asked) from None
        except BaseException:  # the client gone, or a fault: the response never finishes
            kept.abandon(output.ident)
            raise
        if completion is None:
            return
        events = output.end(completion)
        if asked.store:  # the response the last event carries, kept before that event goes out
            kept.finish(events[-1][1]["response"], asked.items)
        self._end_lease()  # the answer is made: the model is free before the client reads the stream's end
        for name, data in events:
            self._named_event(name, data)

    def _response_input_tokens(self) -> None:
        """``POST /v1/responses/input_tokens``: the prompt tokens the same ``POST /v1/responses`` body would use (its
        ``usage.input_tokens``), nothing generated, answered at once. A prompt past the context is counted too, as
        ``/v1/messages/count_tokens`` counts it: its text passed every other check, only its length is refused."""
        self._authorise()
        body = self._read_json()
        completer = self._described(body)
        asked = responses.parse_responses_request(body, self.server.responses)
        request = asked.request
        try:  # with truncation "auto", the items the answer would keep (its usage.input_tokens)
            request = responses.truncated(completer, asked)
            counted = len(completer.prompt_ids(request))
        except ApiError as exc:
            if exc.code != "context_length_exceeded":
                raise responses.answering_error(exc, asked) from None
            counted = len(completer.runtime.tokenizer.chat_ids(completer.chat_text(request)))
        self._send_json(200, {"object": "response.input_tokens", "input_tokens": counted})

    def _not_found(self, route: str, method: str) -> None:
        """404, or 405 with the methods it takes where the route is this server's under another method."""
        path = _api_route(route)
        kept = KEPT_RESPONSE.fullmatch(path) is not None
        served_by_get = route in ("/", *HEALTH_ROUTES, "/metrics", "/props", "/slots") or path == "/models" or \
            route in ollama.GET_ROUTES or \
            path.startswith("/models/") or kept or KEPT_ITEMS.fullmatch(path) is not None
        allowed = [name for name, known in (("GET", served_by_get), ("HEAD", served_by_get), ("POST", _posted(route)),
                                            ("DELETE", kept)) if known]
        if allowed:
            self._allow = ", ".join(allowed)
            raise ApiError(405, f"{route} takes {self._allow}, not {method}: this server has {ROUTES}",
                           code="method_not_allowed")
        missing = _llama_server_only(route)
        if missing is not None:  # llama-server's route: said as such, with what to use instead, not every route here
            raise ApiError(404, f"no route {method} {route}: {missing}", code="not_found")
        raise ApiError(404, f"no route {method} {route}: this server has {ROUTES}", code="not_found")

    # ------------------------------------------------------------------ requests
    def _authorise(self) -> None:
        key = self.server.api_key
        if key is None:
            return
        given = self.headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer":  # Anthropic's clients send the key as x-api-key
            token = self.headers.get("x-api-key", "")
        # one key, or several (llama-server's --api-key KEY1,KEY2), any of which opens every route; each compared
        # in full, so that the time taken does not tell which one nearly matched. Compared as bytes, as llama-server
        # compares them: http.client reads a header's bytes as ISO-8859-1, so encoding the value back that way gives
        # the bytes the client sent (a UTF-8 key's own bytes; encoded as UTF-8 again, a non-ASCII key never matched)
        # HTTP's whitespace only (RFC 9110 §5.5): str.strip also takes \x85 and \xa0, the last UTF-8 byte of à, Å, х
        sent = token.strip(" \t").encode("latin-1")
        if not any([hmac.compare_digest(sent, one) for one in self.server.api_key_bytes]):
            raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer KEY' (or 'x-api-key: KEY') "
                           "with the key edgesdk serve was started with (--api-key or EDGESDK_API_KEY)",
                           code="invalid_api_key", kind="authentication_error")

    def _carries_body(self) -> bool:
        return bool(self.headers.get("Transfer-Encoding")) or \
            any(value != "0" for value in _length_values(self.headers.get_all("Content-Length", [])))

    def parse_request(self) -> bool:
        if not self._past_empty_lines():
            return False
        if not super().parse_request():
            return False
        broken = self._broken_head_problem()
        if broken is not None:
            self._broken_head = True
            self.send_error(400, broken)
            return False
        self._origin_form()
        self._unfold_fields()
        if "close" in self._connection_options():
            self.close_connection = True
        return True

    def _past_empty_lines(self) -> bool:
        """Skip the empty lines before the request line (RFC 9112 §2.2: a server that expects a request line SHOULD
        ignore at least one empty line before it, as nginx and Node.js's parser skip them): a client that ends a POST
        body with an extra CRLF (RFC 2616 §4.1 names such clients) had its connection closed without a word on that
        line, and a request it sent after it on the connection was lost. An empty line is no part of the request after
        it: the head's deadline counts from that request's first byte, so a keep-alive client that idles after its
        stray CRLF has the whole of it (counted from the CRLF, its next request was cut short by the time it idled).
        False where the connection ended after them (nothing to answer), or where the line after them is past the
        request line's limit (its 414 is sent)."""
        while self.raw_requestline in (b"\r\n", b"\n"):  # each waits the client timeout, as an idle connection does
            self._reader.expect(self._head_deadline_s())
            self.raw_requestline = self.rfile.readline(HEAD_LINE_LIMIT + 1)
        if not self.raw_requestline:
            self.close_connection = True
            return False
        if len(self.raw_requestline) > HEAD_LINE_LIMIT:  # as the base class refuses a first line past it
            self.requestline, self.request_version, self.command = "", "", ""
            self.send_error(414)
            return False
        return True

    def _connection_options(self) -> set[str]:
        """The request's connection options, lowercased: every ``Connection`` field's comma-separated tokens (RFC 9110
        §7.6.1). The standard library takes the connection for closed only where the first field's whole value is
        ``close``, so a client sending ``Connection: TE, close`` (Perl's LWP) had its connection kept open, where RFC
        9112 §9.6 says a server MUST close it after the answer."""
        fields = self.headers.get_all("Connection", [])
        return {token.strip().lower() for field in fields for token in field.split(",") if token.strip()}

    def _broken_head_problem(self) -> str | None:
        """Why the request's header section cannot be read as its fields (its 400's message), or None: a line that is
        no field line (:meth:`_broken_field_line`), or a line with no field name before its colon (``: value``),
        which the standard library's parser reports only as a defect whose text ("Missing header name.") is no line
        of the request."""
        line = self._broken_field_line()
        if line is not None:
            return f"the request's header line {line[:80]!r} is not a header field: {FIELD_LINE_FIX}"
        if any(isinstance(defect, email.errors.InvalidHeaderDefect) for defect in self.headers.defects):
            return ("a request header line has no field name before its colon, so it is not a header field: "
                    f"{FIELD_LINE_FIX}")
        return None

    def _unfold_fields(self) -> None:
        """Each field folded onto next lines (obs-fold: a line break, then spaces or tabs) on one line, each fold one
        space, as RFC 9112 §5.2 has a server do before it reads the value (or else refuse the request). The standard
        library's parser kept the line break in the value: ``Authorization: Bearer`` folded before its key was a 401,
        and a folded ``Origin`` went back out in ``Access-Control-Allow-Origin`` as a folded response line, which
        §5.2 forbids a sender to generate."""
        fields = self.headers.items()
        if not any("\n" in value or "\r" in value for _, value in fields):
            return
        for name in {name.lower() for name, _ in fields}:
            del self.headers[name]  # every field of that name; all are added back below, in their order
        for name, value in fields:
            self.headers[name] = OBS_FOLD.sub(" ", value)

    def _broken_field_line(self) -> str | None:
        """The first header line that is no field line (``Content-Length : 5``, a name with a space, no colon), or
        None. The standard library's parser ends the header section there without a word, so every field after it
        was dropped: a Content-Length (a 411), an Authorization (a 401), a ``Connection: close``, a
        ``Transfer-Encoding`` beside a Content-Length read before it (the body framed otherwise than the client
        framed it). A first line ``From x`` it keeps aside as a mailbox's envelope line (its "unixfrom"), and a later
        one it drops with a defect: both are dropped fields too. RFC 9112 §5.1: a server MUST reject whitespace
        between a field name and its colon with a 400; a line before the fields that starts with whitespace is
        dropped, as §2.2 lets a recipient do."""
        return _non_field_line(self.headers)

    def _origin_form(self) -> None:
        """A request-target in absolute-form (``GET http://host:8080/v1/models HTTP/1.1``, as a client sends it
        through a proxy that passes it on as is) as its path and query: RFC 9112 §3.2.2, "a server MUST accept the
        absolute-form in requests". It was taken for a path: a 404 for every route (and a 401 for /health under an
        API key)."""
        match = ABSOLUTE_FORM.match(self.path)
        if match is not None:
            rest = self.path[match.end():]
            self.path = rest if rest.startswith("/") else "/" + rest

    def handle_expect_100(self) -> bool:
        """``Expect: 100-continue`` (curl sends it with a large body and waits for the 100 before sending
        it): a request refused on its headers alone (no such route, no API key, a body too large) gets
        its final answer instead of a 100 that has the client send a body nobody reads (RFC 9110 §10.1.1)."""
        if self._broken_head_problem() is not None:  # refused with its 400 once parse_request returns: no 100
            return True
        self._origin_form()  # asked from within parse_request, before it returns
        self._unfold_fields()
        if self.command == "POST":
            route = _route(self.path)
            try:
                if ollama.management_methods(route):
                    self._refuse_management(route)  # a pull alone reads its body
                elif not _posted(route):
                    self._not_found(route, "POST")
                self._authorise()
                self._body_size()
            except ApiError as exc:
                self.close_connection = True
                self._anthropic = _anthropic_route(route)
                self._ollama = _ollama_route(route)
                self._send_refusal(exc.status, self._error_body(exc))
                return False
        return super().handle_expect_100()

    def _body_size(self) -> int | None:
        """The request body's size from its headers (None for a chunked body, whose size its chunks
        tell), or the ApiError that refuses it unread."""
        fields = self.headers.get_all("Transfer-Encoding", [])
        # empty list elements (', chunked') name no coding (RFC 9110 §5.6.1)
        codings = [c.strip().lower() for v in fields for c in v.split(",") if c.strip()]
        if fields:
            # RFC 9112 §6.1: Transfer-Encoding overrides a Content-Length sent beside it, and the connection
            # closes after the answer; §6.3: a coding other than chunked alone leaves the body's end unknown.
            # §6.1 too: in an HTTP/1.0 message it is faulty framing, and the connection closes after the message
            if self.headers.get("Content-Length") is not None or self.request_version == "HTTP/1.0":
                self.close_connection = True
            if codings != ["chunked"]:
                self.close_connection = True
                if codings.count("chunked") != 1 or codings[-1] != "chunked":  # §6.3: a 400, as its end is unknown
                    raise ApiError(400, f"the request body's Transfer-Encoding is {', '.join(codings)!r}: a body's "
                                   "end is known only where chunked is its last coding, named once (RFC 9112 §6.3); "
                                   "send the body chunked (Transfer-Encoding: chunked) or plain with a Content-Length")
                raise ApiError(501, f"the request body's Transfer-Encoding is {', '.join(codings)!r}; this server "
                               "reads 'chunked' alone: send the body plain (with a Content-Length) or chunked")
            return None
        fields = [value.strip() for value in self.headers.get_all("Content-Length", [])]
        if not fields:
            self.close_connection = True
            raise ApiError(411, "a request body needs a Content-Length header, got none (and no Transfer-Encoding): "
                           "send the body's size in bytes as Content-Length, or send it with Transfer-Encoding: chunked")
        lengths = _length_values(fields)
        # RFC 9112 §6.3: a Content-Length that is not one decimal number (two that differ, a sign, a
        # non-ASCII digit such as '²') leaves the body's end unknown; the connection cannot go on.
        if len(set(lengths)) != 1 or not all(value.isascii() and value.isdigit() for value in lengths):
            self.close_connection = True
            raise ApiError(400, f"the Content-Length header must be one whole number of bytes, got "
                           f"{', '.join(map(repr, fields))}")
        digits = lengths[0].lstrip("0") or "0"
        # more digits than the limit has is past it, unread: int() refuses a text past 4300 digits (CPython's
        # int_max_str_digits, a ValueError that was a 500)
        too_long = len(digits) > len(str(MAX_BODY_BYTES))
        size = MAX_BODY_BYTES + 1 if too_long else int(digits)
        if size > MAX_BODY_BYTES:
            self.close_connection = True  # the body is left unread: this connection cannot carry another request
            said = f"a {len(digits):,}-digit number of" if too_long else f"{size:,}"
            raise ApiError(413, f"the request body has {said} bytes; this server reads at most {MAX_BODY_BYTES:,}: "
                           f"{BODY_TOO_LARGE_FIX}")
        return size

    def _read_chunked(self) -> bytes:
        """A chunked body (RFC 9112 §7.1): chunks of hexadecimal size, extensions ignored, up to the
        last chunk and its trailer fields, which are read and dropped. Refused past ``MAX_BODY_BYTES``."""
        body = bytearray()
        while True:
            line = self.rfile.readline(CHUNK_LINE_LIMIT)
            if not line.endswith(b"\n"):
                raise self._broken_chunk("ended" if len(line) < CHUNK_LINE_LIMIT else "has a chunk-size line "
                                         f"longer than {CHUNK_LINE_LIMIT} bytes", body)
            digits = line.split(b";", 1)[0].strip()
            if not digits or any(c not in b"0123456789abcdefABCDEF" for c in digits):
                raise self._broken_chunk(f"has a chunk size that is not hexadecimal: {digits[:40]!r}", body)
            size = int(digits, 16)
            if size == 0:
                break
            if len(body) + size > MAX_BODY_BYTES:
                self.close_connection = True
                raise ApiError(413, f"the chunked request body has more than {MAX_BODY_BYTES:,} bytes, the most "
                               f"this server reads: {BODY_TOO_LARGE_FIX}")
            chunk = self.rfile.read(size)
            body += chunk
            end = self.rfile.read(1)
            if end == b"\r":
                end += self.rfile.read(1)
            if len(chunk) < size or end in (b"", b"\r"):  # the body ended inside the chunk, or before its CRLF
                raise self._broken_chunk("ended inside a chunk" if len(chunk) < size else
                                         "ended after a chunk's data, before the CRLF that closes it", body)
            if end not in (b"\r\n", b"\n"):  # CRLF, or a bare LF (RFC 9112 §2.2)
                raise self._broken_chunk("has a chunk longer than its size", body)
        for _ in range(CHUNK_TRAILER_LINES):  # trailer fields, then the empty line that ends the message
            line = self.rfile.readline(CHUNK_LINE_LIMIT)
            if line in (b"\r\n", b"\n"):
                return bytes(body)
            if not line.endswith(b"\n"):
                raise self._broken_chunk("ended in its trailer fields" if len(line) < CHUNK_LINE_LIMIT else
                                         f"has a trailer field longer than {CHUNK_LINE_LIMIT} bytes", body)
        raise self._broken_chunk(f"has more than {CHUNK_TRAILER_LINES} trailer fields", body)

    def _broken_chunk(self, what: str, body: bytearray) -> ApiError:
        self.close_connection = True  # the body's end is unknown: this connection cannot carry another request
        return ApiError(400, f"the chunked request body {what} after {len(body):,} bytes: send chunks as RFC 9112 "
                        "§7.1 frames them (hexadecimal size, CRLF, data, CRLF), ending with a 0-size chunk")

    def _read_json(self) -> object:
        size = self._body_size()
        try:
            raw = self._read_chunked() if size is None else self.rfile.read(size)
        except RequestDeadline:
            self.close_connection = True
            raise ApiError(408, f"the request took too long to come: its body had not all come "
                           f"{self.server.request_timeout_s:g} s after its first byte; send the whole request at "
                           "once", code="request_timeout") from None
        except TimeoutError:
            self.close_connection = True
            total = "" if size is None else f"its {size:,} bytes "
            raise ApiError(408, f"the request body stalled: {total}had not all come when none came for "
                           f"{self.server.client_timeout_s:g} s; send the whole body at once") from None
        finally:
            self._reader.settled()
        if size is not None and len(raw) < size:
            self.close_connection = True
            raise ApiError(400, f"the request body ended after {len(raw):,} of the {size:,} bytes its Content-Length "
                           "announced")
        self._body_read = True
        if not raw.strip():  # json.loads' "Expecting value: line 1 column 1 (char 0)" did not say the body is empty
            raise ApiError(400, f"the request body is empty ({len(raw):,} bytes): send the request as a JSON object "
                           "(Content-Type: application/json)")
        try:
            # A UTF-8 byte order mark before the text (a file saved by Windows Notepad or PowerShell 5, sent with
            # curl -d @file) is skipped, as RFC 8259 §8.1 lets a parser do and llama-server's JSON parser does
            # (nlohmann's lexer, skip_bom); json.loads refused it ("Unexpected UTF-8 BOM") with a 400.
            return json.loads(raw.decode("utf-8-sig"))
        except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, an integer past 4,300 digits, deep nesting
            raise ApiError(400, f"the request body is not JSON in UTF-8: {exc}") from exc

    # ------------------------------------------------------------------ answers
    def _stream(self, requests: list[CompletionRequest], per_token: bool = False, progress: bool = False) -> None:
        """Server-sent events; the headers go out when the request's turn comes, so a refused request
        (busy, prompt too long) still gets a plain JSON error with its status.

        Several prompts (``requests``: one each) are answered one after another (the board answers one at a time;
        llama-server runs them in parallel slots, its chunks interleaved) in one stream under one id, each chunk
        with its prompt's choice ``index`` and each prompt's last chunk its ``finish_reason``; the usage chunk
        ``stream_options.include_usage`` asks for comes once, summed, then the one ``data: [DONE]``.

        ``per_token`` (llama-server's ``timings_per_token``) puts the timings so far on the last chunk of each piece,
        and ``progress`` (``return_progress``) sends a chunk with ``prompt_progress`` after each step of the prompt's
        prefill, as llama-server's partial results carry them on these routes too (server-task.cpp
        ``to_json_oaicompat``, ``to_json_oaicompat_chat``: the chat's with the assistant's role delta)."""
        ident, completions = None, []
        completer = self._completer

        def send(chunks: list[dict]) -> None:
            for body in chunks:
                self._event(body)

        for index, request in enumerate(requests):
            answer = StreamedAnswer(completer, request, self._model, index=index, ident=ident)
            ident = answer.ident
            live = _LiveTimings(completer, 0)

            def on_prefill(processed: int, cached: int, total: int, answer: StreamedAnswer = answer,
                           live: _LiveTimings = live) -> None:
                live.stepped(processed, cached, total)
                if progress:
                    send(answer.progress(live.progress(), live.timings(0) if per_token else None))

            def on_text(text: str, logprobs: dict | None, answer: StreamedAnswer = answer,
                        live: _LiveTimings = live) -> None:
                chunks = answer.piece(text, logprobs)
                if per_token and chunks:  # the slot's tokens decoded so far, as llama-server's n_decoded
                    live.prompt_done()
                    decoded = completer.slot.decoded if completer.slot is not None else 0
                    chunks[-1] = {**chunks[-1], "timings": live.timings(decoded)}
                send(chunks)

            # an error once the headers are out is in the stream, as llama-server does
            completion = self._complete_streamed(
                request, on_text, lambda answer=answer, live=live: (live.started(), send(answer.opening())),
                lambda error: self._event(error.body()),
                headers_out=index > 0, on_prefill=on_prefill if per_token or progress else None)
            if completion is None:
                return
            completions.append(completion)
            send(answer.closing(completion, with_usage=len(requests) == 1))
        self._end_lease()  # the answers are made: the model is free before the client reads the stream's end
        if len(requests) > 1:
            send(answer.usage_chunk(completions))
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _complete_streamed(self, request: CompletionRequest, on_text: Callable[[str, dict | None], None],
                           opened: Callable[[], None], error_event: Callable[[ApiError], None],
                           content_type: str = "text/event-stream", headers_out: bool = False,
                           on_ids: Callable[[list[int]], None] | None = None,
                           on_prefill: Callable[[int, int, int], None] | None = None) -> Completion | None:
        """Generate ``request`` as a stream: its headers go out when its turn comes (then ``opened`` writes the
        route's first events), each piece of text goes to ``on_text``. An error before that is raised (the client
        gets a plain error with its status); after it, ``error_event`` writes it as the stream's last event and
        None comes back. ``content_type``: the stream's (Ollama's streams are newline-delimited JSON); ``headers_out``:
        the stream is open already (a later prompt of several on /completion), so any error is its last event.
        ``on_ids``: the ids of each piece's tokens, ``on_prefill``: each step of the prompt's prefill
        (Completer.complete)."""
        started = headers_out

        def on_start() -> None:
            nonlocal started
            if not headers_out:
                self._open_stream(content_type)
            started = True
            self._stream_error = error_event  # what fails after the generation (its closing events) is told so too
            opened()

        try:
            return self._completer.complete(request, on_text=on_text, on_start=on_start,
                                                  client_gone=self._client_gone, on_ids=on_ids, on_prefill=on_prefill)
        except (ConnectionError, TimeoutError):
            raise
        except Exception as exc:
            if not started:
                raise
            error_event(self._server_error(exc))
            return None

    def _client_gone(self) -> bool:
        """Whether the client closed its end (end of file or a reset), without waiting: bytes it sent
        ahead (a next request on a keep-alive connection) mean it is still there."""
        try:
            poller = select.poll()  # not recv(MSG_DONTWAIT): a socket with a timeout waits for data first
            poller.register(self.connection, select.POLLIN)
            if not poller.poll(0):
                return False  # nothing to read: connected
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True  # reset, or the socket is closed

    def _open_stream(self, content_type: str = "text/event-stream") -> None:
        """The headers of a stream, server-sent events unless ``content_type`` says otherwise (sent when the
        request's turn comes)."""
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    @staticmethod
    def _server_error(exc: Exception) -> ApiError:
        """An error raised while answering, as the ApiError the 500 (or, once a stream's headers are out, its last
        event) carries: an EdgeSDKError's problem with its fix, as the project's errors give both; any other
        exception is a fault of this server, named as an internal error and traced in the log."""
        if isinstance(exc, ApiError):  # the request's own answer (the server stopping, a refusal): no fault to trace
            return exc
        if not isinstance(exc, EdgeSDKError):
            traceback.print_exc(file=sys.stderr)
        if isinstance(exc, EdgeSDKError):
            return ApiError(500, exc.problem if exc.fix is None else f"{exc.problem}; {exc.fix}", kind="server_error")
        return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", kind="server_error")

    def _named_event(self, name: str, body: dict) -> None:
        """A server-sent event with its name (Anthropic's streams name each event)."""
        self.wfile.write(f"event: {name}\ndata: ".encode() + json_bytes(body) + b"\n\n")
        self.wfile.flush()

    def _event(self, body: dict) -> None:
        self.wfile.write(b"data: " + json_bytes(body) + b"\n\n")
        self.wfile.flush()

    def _send_refusal(self, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
        """An error's answer. A client that went away before it was written (a queued request's client that left
        before the stop's 503) or stopped reading is let go, as after a failed write of an answer, rather than
        the write's error reaching socketserver, which prints its traceback to the log. Its message goes into the
        request log beside the status line (:meth:`log_request`): a bare ``"POST ..." 400 -`` told the operator
        that a client failed, never why (llama-server logs a request's error at its default verbosity too)."""
        self._refusal_reason = refusal_message(body)
        try:
            self._send_body(status, json_bytes(body), "application/json", headers)
        except (ConnectionError, TimeoutError):
            self.close_connection = True
        finally:
            self._refusal_reason = None

    def _send_json(self, status: int, body: dict | list) -> None:
        self._send_body(status, json_bytes(body), "application/json")

    def _send_body(self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        """A whole response with its length (and ``headers``); HEAD gets the headers alone. The answer is made: the
        request's lease on its model ends first (:meth:`_end_lease`)."""
        self._end_lease()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if status == 401:
            self.send_header("WWW-Authenticate", "Bearer")
        if status == 405:
            self.send_header("Allow", self._allow)  # RFC 9110 §15.5.6
        self._connection_header()
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self.wfile.flush()

    def _connection_header(self) -> None:
        """The ``Connection`` field of a whole answer: ``close`` where the connection ends after it; ``keep-alive``
        where an HTTP/1.0 client asked to keep it (``Connection: keep-alive``, as ``ab -k`` sends) and it is kept.
        An HTTP/1.0 client takes its connection for persistent only where the answer carries that token back (RFC
        2068 §19.7.1, the mechanism RFC 9112 §9.3 and Appendix C.2.2 name; llama-server's cpp-httplib and nginx
        answer it so): without it the client waited for the close, which came only at the client timeout, for
        every request."""
        if self.close_connection:
            self.send_header("Connection", "close")
        elif self.request_version == "HTTP/1.0":
            self.send_header("Connection", "keep-alive")

    def _send_slots(self) -> None:
        """llama-server's ``GET /slots``; with ``?fail_on_no_slot=1`` a 503 while the one slot is busy, as there: its
        error typed ``unavailable_error`` as llama-server's (server-context.cpp: ``format_error_response("no slot
        available", ERROR_TYPE_UNAVAILABLE)``), which a balancer probing for a free slot reads, not a server fault's
        ``server_error``.

        With several bundles, ``?model=NAME`` asks for that model's slot: the loaded model's as above; a model not
        loaded is described without loading it (its bundle's context and settings, ``is_processing`` false, and
        ``status``, as GET /v1/models words it: ``{"value": "unloaded"}``, or ``"loading"`` while a swap loads it),
        and nothing is swapped for a monitoring GET. llama-server's router forwards the request to that model's
        server, loading it; here a swap waited for the answer generating and the requests queued before it, then
        unloaded the model they were using: a balancer's probe hung for a whole generation and evicted the model
        being used. With ``fail_on_no_slot``, a model not loaded has no free slot while the board answers another
        request, loads a model or has requests waiting (a request for it would wait for them, then swap it in): the
        503 at once. Each query parameter is read from its first value, as llama-server's ``get_param`` reads it."""
        asked, pool = self._query_value("model"), self.server.pool
        if pool is None or not asked:
            self._send_slot_list(llama_native.slots(self._loaded()[1]))
            return
        served = list(pool.models)
        name = pool.resolve(asked, lambda missing: model_not_found(missing, served))
        loaded, completer, loading = pool.state
        if name == loaded and completer is not None:
            self._send_slot_list(llama_native.slots(completer))
            return
        queued = pool.queued
        busy = f"the model '{loading}' is being loaded" if loading is not None else \
            f"the one slot is answering a request for the model '{loaded}'" if completer is not None and \
            (completer.busy or completer.waiting) else f"{queued} request(s) wait for their model" if queued else ""
        if busy and self._fails_on_no_slot():
            raise ApiError(503, f"no slot available for the model '{name}': {busy}, and a request for '{name}' would "
                           f"wait for it, then load '{name}' in its place (GET /slots?model={name} without "
                           "fail_on_no_slot describes it)", code="no_slot_available", kind="unavailable_error")
        status = {"value": "loading" if name == loading else "unloaded"}
        self._send_json(200, [{**slot, "status": status} for slot in llama_native.slots(pool.described(name))])

    def _send_slot_list(self, slots: list[dict]) -> None:
        """The slots of the loaded model, or the 503 of ``fail_on_no_slot`` while its one slot is busy."""
        if self._fails_on_no_slot() and slots[0]["is_processing"]:
            raise ApiError(503, "no slot available: the one slot is answering a request (GET /slots without "
                           "fail_on_no_slot shows it)", code="no_slot_available", kind="unavailable_error")
        self._send_json(200, slots)

    def _query_value(self, name: str) -> str:
        """Query parameter ``name``'s first value ("" where absent), as llama-server's ``req.get_param`` reads a
        parameter given several times: ``/slots?model=A&model=B`` is A's, as its ``fail_on_no_slot`` is read."""
        return self._query().get(name, [""])[0]

    def _fails_on_no_slot(self) -> bool:
        """Whether ``/slots`` asks for the 503 while the slot is busy: llama-server reads ``fail_on_no_slot`` as on
        wherever it has a value, whatever that value is (``!req.get_param("fail_on_no_slot").empty()``, the
        parameter's first value): ``=1``, ``=true``, ``=0`` and ``=false`` alike; ``?fail_on_no_slot`` without one,
        or ``=``, leaves it off."""
        return self._query_value("fail_on_no_slot") != ""

    def _send_metrics(self) -> None:
        if not self.server.metrics:  # llama-server's answer with its endpoint off: 501 not_supported_error
            raise ApiError(501, "This server does not support metrics endpoint: GET /metrics is off; start edgesdk "
                           "serve with --metrics to turn it on", code="not_supported", kind="not_supported_error")
        completer, pool = self.server.completer, self.server.pool
        if pool is None:
            text = completer.metrics.render(int(completer.busy), completer.waiting, self._health().get("thermal"))
        else:  # one set of counters for every model; the requests waiting for their model to load are deferred too
            busy, waiting = (completer.busy, completer.waiting) if completer is not None else (False, 0)
            text = pool.metrics.render(int(busy), waiting + pool.queued, self._health().get("thermal"))
        # llama-server sends Process-Start-Time-Unix with /metrics (server_routes' get_metrics in
        # tools/server/server-context.cpp), so a scraper can tell a restart from counters going down; its value there
        # is ggml_time_us() at start, a monotonic clock's microseconds. Here it is what the name says and what
        # Prometheus' client_golang sends: the server's start in whole seconds since the Unix epoch.
        self._send_body(200, text.encode("utf-8"), "text/plain; version=0.0.4; charset=utf-8",
                        {"Process-Start-Time-Unix": str(self.server.started)})

    def _model_card(self, name: str, state: tuple | None = None) -> dict:
        """A model as ``GET /v1/models`` lists it, with llama-server's ``meta`` of its bundle (:func:`model_meta`):
        OpenAI's fields, and Anthropic's ModelInfo's beside them (``type``, ``display_name``, ``created_at``), which
        its SDK reads from the same route. With several bundles, llama-server's router ``status`` too, ``{"value":
        "loaded" | "loading" | "unloaded"}`` (tools/server/server-models.cpp ``get_router_models``), which router
        clients (its web UI among them) read of every entry to tell which model answers at once; ``state``: the
        pool's :attr:`~ModelPool.state`, read once for the whole list, so that no swap falls between two entries."""
        pool = self.server.pool
        served = pool.models.get(name) if pool is not None else None  # with several bundles: the one named, loaded or not
        bundle = self.server.completer.runtime.bundle if pool is None else served.bundle if served else None
        card = {"id": name, "object": "model", "created": self.server.started, "owned_by": "edgesdk",
                "type": "model", "display_name": name, "created_at": created_at(bundle, self.server.started)}
        if pool is not None:
            loaded, completer, loading = state if state is not None else pool.state
            card["status"] = {"value": "loaded" if name == loaded and completer is not None else
                              "loading" if name == loading else "unloaded"}
        return card if bundle is None else {**card, "meta": model_meta(bundle.manifest)}

    def _health(self) -> dict:
        pool = self.server.pool
        # with several bundles the loaded model and the one a swap loads, read together: read one after the other, a
        # swap that ended between the two reads was told as no model loaded and none loading
        name, completer, loading = (self.server.model, self.server.completer, None) if pool is None else pool.state
        # bundle_id: the build answering (the manifest's), which a redeploy or rollback changes under the same name
        body = {"status": "ok", "model": name, "bundle_id": completer.runtime.bundle.bundle_id if completer else None,
                "backend": completer.runtime.backend.name if completer else None,
                "busy": bool(completer and completer.busy)}
        if loading is not None:  # a swap: no model answers until it is loaded, and a request waits for it
            body["loading"], body["busy"] = loading, True
        hook = completer.hook if completer is not None else pool.hook
        if hook is not None and hasattr(hook, "reading"):
            body["thermal"] = thermal_health(hook, bool(completer and completer.busy))
        backend = completer.runtime.backend if completer is not None else None
        if hasattr(backend, "configure"):  # a power-gated bundle: its gates, and the budget in force (the guard's too)
            controller = backend.controller
            body["power"] = {"gating": bool(backend.gating),
                             "compute_budget": controller.budget if backend.gating else None,
                             "entropy_target": controller.config.entropy_target if backend.gating else None}
        return body

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """The request log's status line, with a refusal's message after it (:meth:`_send_refusal`): one line, cut
        to :data:`LOGGED_REASON_CHARS` characters. The body itself is not logged, but the message may quote a short
        piece of the field it refuses, as the client sees it (a refusal must never quote a credential: see
        serve/anthropic.py's refusal of mcp_servers)."""
        code = getattr(code, "value", code)  # an HTTPStatus, as the base class logs it
        reason = getattr(self, "_refusal_reason", None)
        if reason:
            self.log_message('"%s" %s %s: %s', self.requestline, str(code), str(size), logged_reason(reason))
        else:
            self.log_message('"%s" %s %s', self.requestline, str(code), str(size))

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base class's signature)
        """A line of the request log, its control characters escaped (``\\x1b``), as the standard library's own
        log_message escapes them (gh-100001): a request line is the client's text, and one carrying a terminal's
        escape sequences (clear the screen, set the window's title, hide the lines after it) or a CR wrote them
        raw to the terminal or journal that shows the log."""
        if self.server.log:
            line = (format % args).translate(LOG_ESCAPES)
            sys.stderr.write(f"edgesdk serve: {self.address_string()} {line}\n")


def thermal_health(hook, generating: bool) -> dict:
    """``/health``'s ``thermal`` (and ``/metrics``' thermal gauges): the sensor's reading now (not the last request's),
    and the guard's level and pause beside it.

    The guard observes only while a request's steps run. While one generates (``generating``), its level and pause are
    the guard's own, moved by every step (``level_source`` ``"request"``). Between requests its level stood where the
    last request left it, beside a temperature read since: an idle board at 95 °C above a 90 °C hard limit was shown
    "hot" and not paused, and still "hot" once it had cooled to 50 °C. There the level is the one the guard's
    thresholds give the reading now, from the level the guard holds (:meth:`~edgesdk.thermal.guard.Guard.level_for`:
    a rise at once, a fall past the hysteresis and the dwell, a pause ended only below the resume point), the one a
    request starting now starts at, and ``paused`` says whether that request would wait for the board to cool
    (``level_source`` ``"reading"``). With no data from the sensor the guard's own level and pause stand
    (``"request"``): a reading that has none gives no level."""
    reading = hook.current() if hasattr(hook, "current") else hook.reading
    temperature = None if reading is None or reading.max_c is None else reading.max_c
    guard = getattr(hook, "guard", None)
    if guard is None:  # watched with no guard (--no-guard, --telemetry alone): a temperature, no level, no pause
        return {"level": "unguarded", "temperature_c": None if temperature is None else round(temperature, 2),
                "paused": False}
    level, paused, source = guard.level, guard.paused, "request"
    if not generating and temperature is not None:
        clock = getattr(hook, "clock", None)
        level = guard.level_for(temperature, clock.now() if clock is not None else None)
        paused, source = level is Level.CRITICAL, "reading"
    return {"level": level.value, "temperature_c": None if temperature is None else round(temperature, 2),
            "paused": bool(paused), "level_source": source}


def refusal_message(body: object) -> str | None:
    """The message of an error's body in any of the routes' shapes: OpenAI's and Anthropic's ``{"error": {"message":
    ...}}``, Ollama's ``{"error": "..."}``; None for another."""
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    return message if isinstance(message, str) else None


def logged_reason(message: str) -> str:
    """``message`` as the request log shows it: one line (its white space runs made one space), cut to
    :data:`LOGGED_REASON_CHARS` characters with an ellipsis, so that a long refusal stays one readable line."""
    line = " ".join(message.split())
    return line if len(line) <= LOGGED_REASON_CHARS else line[:LOGGED_REASON_CHARS - 3] + "..."


def created_at(bundle, started: int) -> str:
    """Anthropic's ``created_at`` of a model (RFC 3339, UTC): its bundle's build time (the manifest's ``created``),
    else its directory's modification time, else the server's start."""
    when = None
    created = bundle.manifest.get("created") if bundle is not None else None
    if isinstance(created, str):
        try:
            when = datetime.fromisoformat(created)
        except ValueError:
            when = None
    if when is None and bundle is not None:
        try:
            when = datetime.fromtimestamp(bundle.path.stat().st_mtime, timezone.utc)
        except OSError:
            when = None
    if when is None:
        when = datetime.fromtimestamp(started, timezone.utc)
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def model_meta(manifest: dict) -> dict:
    """llama-server's ``meta`` of a model on ``/v1/models`` (tools/server: ``model_meta``), from a bundle's manifest:
    ``n_vocab`` (the graph's vocabulary), ``n_ctx_train`` (the model's trained context, its
    max_position_embeddings; the bundle's own context is /props' ``n_ctx``), ``n_embd`` (the hidden size),
    ``n_params`` (the parameters after the build) and ``size`` (the bytes of the bundle's files, as /api/tags gives
    it; llama-server's is the weights' bytes). A fact the manifest does not record is left out, as is llama.cpp's
    ``vocab_type``, a llama.cpp tokenizer kind a bundle's tokenizer.json is not."""
    facts = (manifest.get("model") or {}).get("after") or {}
    graph = manifest.get("graph") or {}
    found = {"n_vocab": graph.get("vocab_size", facts.get("vocab_size")),
             "n_ctx_train": facts.get("max_position_embeddings"), "n_embd": facts.get("hidden_size"),
             "n_params": facts.get("parameters")}
    meta = {key: value for key, value in found.items() if isinstance(value, int) and not isinstance(value, bool)}
    files = manifest.get("files")
    if isinstance(files, dict) and files:
        meta["size"] = sum(int(entry.get("size", 0)) for entry in files.values() if isinstance(entry, dict))
    return meta


def _llama_server_only(route: str) -> str | None:
    """Why ``route`` (as :func:`_route` gives it), one of llama-server's routes this server does not have
    (:data:`LLAMA_SERVER_ONLY`), is missing and what to use instead; None for another path."""
    return next((why for pattern, why in LLAMA_SERVER_ONLY if pattern.fullmatch(route)), None)


def _posted(route: str) -> bool:
    """Whether ``route`` (a request's path without its query) is a POST route of this server."""
    path = _api_route(route)
    if path in NATIVE_EMBEDDINGS_ROUTES:  # /embedding has no /v1 form; /v1/embeddings is OpenAI's route
        return route in (OPENAI_EMBEDDINGS_ROUTE, *NATIVE_EMBEDDINGS_ROUTES)
    # Ollama's routes have no /v1 form (its /v1 is OpenAI's API): /v1/api/chat is no route, as :meth:`_post` routes it
    return path in PARSERS or path in TOKEN_ROUTES or path in anthropic.ROUTES or path == llama_native.ROUTE \
        or path == infill.ROUTE or route in ollama.POST_ROUTES or route in (ROUTER_LOAD, ROUTER_UNLOAD) \
        or path in (responses.ROUTE, responses.COUNT_ROUTE) or KEPT_CANCEL.fullmatch(path) is not None


def _length_values(fields: list[str]) -> list[str]:
    """The values of a request's Content-Length fields, each field read as a comma-separated list (RFC 9110 §5.6.1,
    empty elements dropped): RFC 9112 §6.3 has a recipient take ``Content-Length: 42, 42`` (what a proxy that joins
    repeated fields into one, as RFC 9110 §5.3 lets it, makes of two ``Content-Length: 42``) as the one value 42, as
    it takes the two fields; it was a 400. Values that differ, or an empty field, are left for the caller to refuse."""
    values = [item.strip() for field in fields for item in field.split(",") if item.strip()]
    return values if values or not fields else [""]


def _non_field_line(message: email.message.Message) -> str | None:
    """The first line of a parsed header section that the email parser did not take for a field (see
    ApiHandler._broken_field_line), or None. Past that line it parsed the rest as the body the Content-Type names: text
    (a string), or under ``message/*`` a message of its own (a list of one), whose own first line is then the one.
    Multipart's defects (a ``multipart/form-data`` Content-Type without its body) are about that body, not a line."""
    payload = message.get_payload()
    if isinstance(payload, list):
        nested = (line for part in payload if (line := _non_field_line(part)) is not None)
        if (line := next(nested, None)) is not None:
            return line
    elif payload:
        return payload.split("\r\n", 1)[0].split("\n", 1)[0]
    envelope = message.get_unixfrom()
    if envelope:
        return envelope
    for defect in message.defects:
        if isinstance(defect, email.errors.MisplacedEnvelopeHeaderDefect):  # the defect's text is the line
            return str(defect).rstrip("\r\n")
    return None


def _ollama_route(route: str) -> bool:
    """Whether ``route`` (as :func:`_route` gives it) is one of Ollama's (its errors then in Ollama's shape): those
    answered, its model-management routes, refused in its words, and any other path under ``/api/``, which only an
    Ollama client asks for (a route of a newer Ollama): its 404 is ``{"error": "..."}`` as its clients read an error
    (the ollama package's ResponseError and Open WebUI take ``error`` as the message; in OpenAI's shape they showed
    the whole ``{'message': ..., 'type': ...}`` object)."""
    return route in ollama.ROUTES or bool(ollama.management_methods(route)) or route == "/api" or \
        route.startswith("/api/")


def _anthropic_route(route: str) -> bool:
    """Whether ``route`` (as :func:`_route` gives it) is the Messages API's (its errors then in Anthropic's shape):
    its routes, and any other path under ``/v1/messages/``, which only an Anthropic client asks for (the Message
    Batches API's ``/v1/messages/batches``): its 404 Anthropic's ``not_found_error``."""
    path = _api_route(route)
    return path in anthropic.ROUTES or path.startswith("/messages/")


def _route(target: str) -> str:
    """The route a request's path names: its query dropped and its trailing slashes, so that ``/health/`` is
    ``/health`` as ``/v1/models/`` is ``/v1/models`` on every route, under an API key too (``/health/`` as open as
    ``/health``). Ollama's gin router sends a path with a trailing slash to the route without it
    (RedirectTrailingSlash: a 301 for a GET, a 307 otherwise), whose answer its clients then read; this server gives
    that answer at once. llama-server's cpp-httplib matches its routes exactly (a 404 there), so no llama.cpp client
    sends one."""
    return target.split("?", 1)[0].rstrip("/") or "/"


def _api_route(route: str) -> str:
    """``/v1/chat/completions`` and ``/chat/completions`` are the same route (``route`` as :func:`_route` gives it)."""
    return route[3:] if route.startswith("/v1/") else route
