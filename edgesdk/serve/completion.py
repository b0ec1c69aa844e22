"""One answer at a time on the board: a request's prompt, sampling and stop strings through
:func:`edgesdk.runtime.generate.generate`, with the thermal guard's hook around every step.

A board decodes one sequence at a time (batch 1 is what its memory bandwidth pays for), so
requests take turns in the order they came (:class:`FairTurn`, as llama-server hands its deferred
tasks to a freed slot first in, first out: tools/server/server-queue.cpp, pop_deferred_task); at
most ``max_waiting`` wait, the rest get a 503 at once rather than a connection that hangs. The
guard's state lives across requests: the board's temperature does not start over with each answer.
"""

from __future__ import annotations

import math
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from edgesdk import __version__
from edgesdk.errors import BundleError, EdgeSDKError
from edgesdk.runtime.backend import close_backend
from edgesdk.runtime.cache_store import CacheStore
from edgesdk.runtime.embedding import (
    BUNDLE_CONTEXT,
    Embedding,
    EmbeddingConfig,
    EmbeddingError,
    InputTooLong,
    bundle_pooling,
    embed_tokens,
    fitted,
    hidden_states_problem,
    text_ids,
)
from edgesdk.runtime.fim import DEFAULT_BATCH
from edgesdk.runtime.gbnf import GrammarError
from edgesdk.runtime.generate import (
    DEFAULT_SAMPLERS,
    ContextShift,
    GenerationStats,
    LogitBiasError,
    SamplingConfig,
    StepHook,
    TokenConstraint,
    _prefill,
    can_draft,
    generate,
    starts_with_added_bos,
)
from edgesdk.runtime.grammar import GrammarConstraint
from edgesdk.runtime.hooked_pass import hooked_pass
from edgesdk.runtime.json_mode import JsonConstraint
from edgesdk.runtime.json_schema import SchemaConstraint
from edgesdk.runtime.logprobs import LogprobRecorder
from edgesdk.runtime.lookup import MAX_DRAFT, LookupConfig
from edgesdk.runtime.prompt_cache import PromptCache
from edgesdk.runtime.session import Runtime
from edgesdk.runtime.speculative import DraftConfig, DraftModel
from edgesdk.runtime.text import TEMPLATE_REFUSED as REFUSED
from edgesdk.runtime.text import StreamDecoder, check_utf8, pieces_text, template_refusal_fix
from edgesdk.serve.api import (
    RANDOM_SEED,
    UNTIL_THE_CONTEXT_FILLS,
    ApiError,
    CompletionRequest,
    TextOffsets,
    TokenizeRequest,
    chat_turns,
    context_refusal,
    logprobs_body,
    mixed_prompt_ids,
    not_utf8,
    overflow_headline,
    utf8_field,
)
from edgesdk.serve.line_limits import LineLimits
from edgesdk.serve.metrics import MetricsHook, ServeMetrics
from edgesdk.serve.reasoning import CLOSE, OPEN, ReasoningSplitter, prompt_opens_thinking, template_thinks
from edgesdk.serve.reasoning import FORMATS as REASONING_FORMATS
from edgesdk.thermal.watch import BoardNeverCooled


@dataclass(frozen=True)
class ServeDefaults:
    """What a request that leaves a sampling field out gets (``edgesdk serve`` options)."""

    max_tokens: int = 512
    temperature: float = 0.0  # greedy, as ``edgesdk run``: the same request gives the same answer
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0: off
    # llama-server's -s/--seed: the seed of a request that sends none (None: a random one for each, as its -1); a
    # request's own seed, -1 (random) too, goes over it
    seed: int | None = None
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS  # the sampler chain (llama.cpp's --samplers)
    repeat_penalty: float = 1.0  # llama-server's --repeat-penalty (1: off) over the last repeat_last_n tokens
    repeat_last_n: int = 64  # llama-server's --repeat-last-n (-1: the whole context)
    max_waiting: int = 8  # requests queued behind the one generating; more are refused with 503
    prompt_cache: bool = True  # reuse the previous answer's KV cache for a prompt that repeats it
    # host memory for other conversations' saved KV caches (0: keep only the live one; -1: no limit, as
    # llama-server's --cache-ram -1)
    cache_ram_mib: int = 256
    lookup: int = 0  # prompt lookup decoding: draft tokens checked at once (0: off; edgesdk/runtime/lookup.py)
    prefill_assistant: bool = True  # a chat ending with an assistant message continues it (llama-server's default)
    # a thinking model's <think> block as reasoning_content: auto (where the template thinks) | none | deepseek |
    # deepseek-legacy (deepseek's, streamed in the content)
    reasoning_format: str = "auto"
    # llama-server's --reasoning-budget: -1 thinks without limit, 0 renders chat templates with enable_thinking false
    # unless a request's or the server's chat_template_kwargs set it
    reasoning_budget: int = -1
    # /v1/responses keeps finished responses in memory for previous_response_id and GET /v1/responses/{id}: at most
    # this many (0: keep none), and at most this many bytes of their JSON with their input items; the oldest go first
    responses_kept: int = 256
    responses_kept_bytes: int = 16 << 20
    # how an embedding pools a text's hidden states (llama-server's --pooling): last | mean | cls | none; None: as the
    # bundle's model declares, else mean (edgesdk.runtime.embedding.bundle_pooling), settled when the Completer opens
    pooling: str | None = None
    # llama-server's -b/--batch-size, whose quarters set an infill prompt's budget of prefix and suffix, and
    # --spm-infill, the suffix before the prefix (edgesdk/serve/infill.py)
    batch_size: int = DEFAULT_BATCH
    spm_infill: bool = False
    # llama-server's --context-shift (off by default, as in current llama.cpp: common/arg.cpp) and --keep: a full
    # context keeps its first n_keep tokens (-1: the prompt), drops half of the rest and the answer goes on
    # (edgesdk.runtime.generate.ContextShift); a request's n_keep (POST /completion) or Ollama's shift goes over them
    context_shift: bool = False
    n_keep: int = 0

    def __post_init__(self):
        chain = SamplingConfig(max_new_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
                               top_k=self.top_k, min_p=self.min_p, samplers=self.samplers,
                               repeat_penalty=self.repeat_penalty, repeat_last_n=self.repeat_last_n).samplers
        object.__setattr__(self, "samplers", chain)  # names and letters as canonical names
        if isinstance(self.lookup, bool) or not isinstance(self.lookup, int) or not 0 <= self.lookup <= MAX_DRAFT:
            raise ValueError(f"lookup must be 0 (off) or a whole number of draft tokens up to {MAX_DRAFT}, "
                             f"got {self.lookup!r}")
        if not _whole(self.max_waiting) or self.max_waiting < 0:  # 1.5 would admit without limit: no 503 ever
            raise ValueError(f"max_waiting must be a whole number >= 0 (the requests that may wait behind the one "
                             f"generating; 0: none), got {self.max_waiting!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed must be None (a random seed for each request) or a whole number >= 0, got "
                             f"{self.seed!r}")
        if self.reasoning_format not in REASONING_FORMATS:
            raise ValueError(f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}, got "
                             f"{self.reasoning_format!r}")
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be a whole number >= 1, got {self.batch_size!r}")
        if self.pooling is not None:
            EmbeddingConfig(pooling=self.pooling)  # an EmbeddingError (a ValueError) naming a pooling it does not know
        if not _whole(self.reasoning_budget) or self.reasoning_budget not in (-1, 0):
            raise ValueError(f"reasoning_budget must be -1 (thinking without limit) or 0 (thinking off: the chat "
                             f"template rendered with enable_thinking false), as llama-server takes it, got "
                             f"{self.reasoning_budget!r}")
        if not _whole(self.cache_ram_mib) or self.cache_ram_mib < -1:
            raise ValueError(f"cache_ram_mib must be -1 (no limit), 0 (keep only the live cache) or a whole number "
                             f"of MiB, got {self.cache_ram_mib!r}")
        if isinstance(self.n_keep, bool) or not isinstance(self.n_keep, int) or self.n_keep < -1:
            raise ValueError(f"n_keep (--keep) must be -1 (the whole prompt) or a whole number of the prompt's tokens "
                             f">= 0, got {self.n_keep!r}")
        for name in ("responses_kept", "responses_kept_bytes"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be a whole number >= 0 (0: keep no responses), got {getattr(self, name)!r}")


def _whole(value) -> bool:
    """Whether ``value`` is a whole number: an int, not a bool (True is 1 to Python, never a count) nor a float."""
    return isinstance(value, int) and not isinstance(value, bool)


# An answer without a token limit (-1) that shifts its context stops after this many times the context, as Ollama
# limits it (llm/server.go: "only allow maximum 10 context shifts to avoid infinite generation"); llama-server stops
# such an answer at the model's trained context (n_ctx_train), which a bundle does not record.
SHIFTED_LIMIT_CONTEXTS = 10


@dataclass
class Completion:
    """A finished answer. ``finish_reason``: "stop" (end of turn or a stop string) or "length"
    (``max_tokens`` or a full context), as OpenAI reports them.

    ``prompt_tokens`` is the whole prompt, the tokens taken from the KV cache (``cached_tokens``) included.
    ``completion_tokens`` counts every token the answer sampled, the end-of-text token it stopped at included (and
    the one an answer a grammar completed stops at, which llama-server samples once the grammar allows nothing
    else), as llama-server's ``n_decoded`` is bumped before ``process_token`` sees the end of text
    (tools/server/server-context.cpp) and Ollama's ``numDecoded`` before its ``TokenIsEog`` check
    (runner/llamarunner/runner.go): every route's count of generated tokens (``tokens_predicted``,
    ``timings.predicted_n``, ``usage.completion_tokens`` / ``output_tokens``, ``eval_count``) is this one."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens taken from the previous answer's KV cache
    # OpenAI's logprobs object (llama-server's completion_probabilities list for POST /completion), when asked for
    logprobs: dict | list | None = None
    stop_string: str | None = None  # the stop string that ended the answer (Anthropic's stop_sequence)
    # from the turn's start to the first answer token (the prefill, and its pick), and from the first answer token
    # to the last; neither counts the time the thermal guard held the steps back (its pauses and pacing)
    prompt_ms: float = 0.0
    predicted_ms: float = 0.0
    # tokens drafted (prompt lookup or a draft bundle) and those of them the model took, as llama-server's timings
    # count them (draft_n, draft_n_accepted)
    draft_tokens: int = 0
    draft_accepted: int = 0
    context_shifts: int = 0  # times the full context was shifted (llama-server's truncated answer)
    # The time the thermal guard held the answer's steps back (its pauses, pacing and prompt holds), which prompt_ms
    # and predicted_ms leave out, on the guard's clock (a simulated board's seconds with --simulate-thermal), as
    # /metrics' edgesdk_thermal_wait_seconds_total counts it: ``timings.thermal_wait_ms``, an edgesdk field beside
    # llama-server's, so that a client sees why a short answer took long. None where no guard runs (the field is left
    # out, as llama-server sends none).
    thermal_wait_ms: float | None = None
    context_discarded: int = 0  # the tokens those shifts dropped from the KV cache (their n_discard, summed)
    # The answer stopped because the context was full (no context shift): llama-server's ``truncated`` too, as it sets
    # it where a slot runs out of context ("stopped due to running out of context capacity",
    # tools/server/server-context.cpp process_token), not only at a shift
    context_full: bool = False
    # The ids of every token the answer sampled, in order: those of a stop string and what follows it in its token
    # too, and the end-of-text token it stopped at, as llama-server's slot keeps them (server-context.cpp
    # process_token: generated_tokens, all sampled tokens; POST /completion's 'tokens' with return_tokens)
    tokens: list[int] = field(default_factory=list)


@dataclass
class SlotState:
    """What llama-server's ``GET /slots`` reports of the request generating now: its task number, request and
    sampling, and how far it got."""

    task: int
    request: CompletionRequest
    sampling: SamplingConfig
    prompt_tokens: int  # the task's prompt tokens (an embedding task's: its input's)
    decoded: int = 0  # answer tokens so far
    has_new_line: bool = False  # the answer's text handed out so far holds a line break


class StopMatcher:
    """Cuts streamed text at its stop strings as llama-server's slot does (tools/server/server-context.cpp
    ``find_stopping_strings``) and never hands out a stop string's start.

    Text is pushed a token's text at a time, and after each delta the stop string found there that starts earliest
    ends the text (of those starting at one character, the first listed): stops "abcd" and "bc" cut "abcd" coming
    in one token before its "a", as llama-server and ``edgesdk run`` cut it, where the one that completes first
    would keep the "a". Text that could still turn into a stop string (a suffix that is a stop string's prefix) is
    held back until the next delta settles it, and no more: a streamed answer and a whole one, both read a token at
    a time, are the same text.

    Each stop string is followed by a Knuth-Morris-Pratt automaton (its failure function computed once): its
    state is the length of the longest prefix of the stop string that ends the text so far, updated in constant
    amortised time per character. The text is so read once, whatever the stop strings' lengths: checking every
    prefix length of a stop string against the text's end on every delta costs the square of its length.
    """

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.pending = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text
        self._failure = [_failure_function(stop) for stop in stops]
        self._state = [0] * len(stops)  # per stop: the length of its longest prefix that ends the text so far

    def push(self, delta: str) -> str:
        """The text safe to hand out after ``delta`` (a token's text); sets :attr:`stopped` at a stop string."""
        if self.stopped:
            return ""
        base = len(self.pending)
        self.pending += delta
        if "" in self.stops:  # an empty stop string ends the text where it starts
            return self._stop(0, "")
        found = None  # (start in pending, stop) of the earliest starting stop string the delta completes
        for index, stop in enumerate(self.stops):
            start = self._advance(index, delta, base)
            if start is not None and (found is None or start < found[0]):
                found = (start, stop)
        if found is not None:
            return self._stop(*found)
        keep = max(self._state, default=0)
        released = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(released):]
        return released

    def _advance(self, index: int, delta: str, base: int) -> int | None:
        """Read ``delta`` (from ``base`` in the pending text) into the ``index``-th stop's automaton: where in the
        pending text its first occurrence that ends in ``delta`` starts, or None without one. Its start lies in the
        pending text, as the part of it before ``delta`` was its prefix ending the text, so held back."""
        stop, state, failure = self.stops[index], self._state[index], self._failure[index]
        for offset, char in enumerate(delta, start=base + 1):
            while state and stop[state] != char:  # state < len(stop): the text stops at a whole one
                state = failure[state - 1]
            if stop[state] == char:
                state += 1
            if state == len(stop):
                self._state[index] = state
                return offset - len(stop)
        self._state[index] = state
        return None

    def _stop(self, start: int, stop: str) -> str:
        self.stopped, self.matched = True, stop
        released, self.pending = self.pending[:start], ""
        return released

    def flush(self) -> str:
        """What is still held back once the answer has ended (it never became a stop string)."""
        released, self.pending = ("" if self.stopped else self.pending), ""
        return released


def _failure_function(pattern: str) -> list[int]:
    """Knuth-Morris-Pratt's failure function: for each prefix of ``pattern``, the length of its longest proper
    prefix that is also its suffix."""
    failure = [0] * len(pattern)
    length = 0
    for index in range(1, len(pattern)):
        while length and pattern[index] != pattern[length]:
            length = failure[length - 1]
        if pattern[index] == pattern[length]:
            length += 1
        failure[index] = length
    return failure


class ThinkingFirst:
    """A thinking model's answer under tools: its ``<think>`` block free, then ``inner`` (the tools' constraint), as
    llama.cpp's lazy grammar for a thinking model leaves the answer free until its trigger and its root for
    ``tool_choice`` required opens with an optional ``"</think>" space`` (common/chat.cpp). ``opened``: the prompt
    opened the block, so the answer thinks from its first token; else it may open one (``<think>``, from its first
    byte; once begun, nothing but the rest of the tag) or start the call at once. Within the block no token without
    bytes (end of generation) is taken: the answer must still write the tools' JSON, which every ``tool_choice``
    asks for. After ``</think>`` only whitespace as llama.cpp's ``space`` rule writes it (one space, or one or two
    newlines and at most 20 spaces or tabs) comes before the call's first token, in the tag's own token too.
    Tags that are special tokens have no bytes here, as the answer's text has none of them (the stream decoder
    writes no special token), so the reader of the answer and this constraint see the same block: a model whose
    tags are special writes them in text. A ``TokenConstraint``."""

    def __init__(self, token_bytes: list[bytes | None], inner: TokenConstraint, opened: bool):
        self.token_bytes, self.inner = token_bytes, inner
        self.phase = "thinking" if opened else "start"  # then "closed" (whitespace after the tag), then "inner"
        # "start": the block's opening so far; "thinking": the last bytes, a tag's possible start; "closed": the
        # whitespace after the tag so far
        self.written = b""

    def _bytes(self, token_id: int) -> bytes:
        data = self.token_bytes[token_id] if 0 <= token_id < len(self.token_bytes) else None
        return data or b""

    def allows(self, token_id: int) -> bool:
        data = self._bytes(token_id)
        if self.phase == "start":
            opening = self.written + data
            if self.written or data and _opens(opening):  # the tag (begun: only its rest), and what the token
                return bool(data) and _opens(opening) and _thought(opening[len(_OPEN):])  # holds after it thought
            return self.inner.allows(token_id)
        if self.phase == "thinking":
            if not data:  # end of generation before </think>: an answer with no JSON
                return False
            return _thought(self.written + data)
        if self.phase == "closed" and data and not data.strip():
            return _spacing(self.written + data)
        return self.inner.allows(token_id)

    def advance(self, token_id: int) -> None:
        data = self._bytes(token_id)
        if self.phase == "start":
            opening = self.written + data
            if data and _opens(opening):
                self.written = opening
                if opening.startswith(_OPEN):  # the block is open: what the token holds after the tag is thought
                    self.phase, self.written = "thinking", b""
                    self._think(opening[len(_OPEN):])
                return
            self.phase = "inner"
        elif self.phase == "thinking":
            self._think(data)
            return
        elif self.phase == "closed" and data and not data.strip():
            self.written += data
            return
        self.phase = "inner"
        self.inner.advance(token_id)

    def _think(self, data: bytes) -> None:
        window = self.written + data
        end = window.find(_CLOSE)
        if end >= 0:
            self.phase, self.written = "closed", window[end + len(_CLOSE):]
        else:
            self.written = window[-(len(_CLOSE) - 1):]

    @property
    def complete(self) -> bool:
        return self.phase == "inner" and self.inner.complete


def _thought(window: bytes) -> bool:
    """Whether ``window`` (the block's last bytes and a token's) may be thought: no ``</think>`` in it, or one with
    nothing after it but (the start of) the space the call may follow."""
    end = window.find(_CLOSE)
    return end < 0 or _spacing(window[end + len(_CLOSE):])


def _opens(opening: bytes) -> bool:
    """Whether ``opening`` begins the ``<think>`` tag, or holds it whole with what follows."""
    return _OPEN.startswith(opening) or opening.startswith(_OPEN)


# llama.cpp's ``space`` rule (common/json-schema-to-grammar.cpp, SPACE_RULE): "" | " " | "\n"{1,2} [ \t]{0,20}; each
# prefix of a match matches too
SPACE = re.compile(rb"( |\n{1,2}[ \t]{0,20})?")


def _spacing(whitespace: bytes) -> bool:
    """Whether ``whitespace``, after ``</think>``, is (the start of) the ``space`` the call may follow."""
    return SPACE.fullmatch(whitespace) is not None


_OPEN, _CLOSE = OPEN.encode(), CLOSE.encode()


def _constraint_refusal(request: CompletionRequest, exc: GrammarError) -> ApiError:
    """The 400 of a constraint the request asked for that cannot be followed (:class:`GrammarError`: a ``<token>``
    this vocabulary lacks, more parses at once than the matcher follows), named as the field that gave it, whether
    it was found before the answer's first token or later in the answer (the walk that meets the cap runs when a
    token reaches the nested repetitions): the same grammar gets the same refusal wherever the model's tokens take
    it, not a server error. Once a stream's headers are out it is the stream's last event, as llama-server ends a
    stream whose grammar failed (its sampler's "Unexpected empty grammar stack" as an error event)."""
    # in the order _constraint picks the constraint: a grammar before the tools' schema and the response format's,
    # which is named as the client wrote it (request.schema_param: response_format, llama-server's json_schema, ...)
    param = "grammar" if request.grammar is not None else "tools" if request.tools is not None else request.schema_param
    return ApiError(400, f"{param}: {exc.problem}; {exc.fix}", param=param)


MIN_PREDICTED_MS = 0.001  # llama-server's least generation time, 1 µs (server-context.cpp t_token_generation)
DROPPED_WAIT_S = 5.0  # how long a request waits for the place a dropped waiter (its client gone) gives back


class _StopString(Exception):  # noqa: N818 (a signal out of the token callback, not an error)
    pass


class _LineLimit(Exception):  # noqa: N818 (a signal out of the token callback: n_indent, t_max_predict_ms)
    pass


class AnswerCut(_StopString):
    """Raised by an ``on_text`` callback of :meth:`Completer.complete` to end the answer where it stands, as a stop
    string ends it: the answer comes back with the text handed out so far, finish "stop", counted as stopped, not
    failed. Ollama's /api/chat ends so the unconstrained first pass of a thinking model's answer to a ``format``
    where its content begins (serve/ollama.py, :class:`~edgesdk.serve.ollama.Answer`), as its ChatHandler cancels
    that pass (server/routes.go, ``structuredOutputsState_ReadyToApply``)."""


class ClientGone(ConnectionAbortedError):
    """The request's client closed its connection: nobody is left to read the answer."""


class FairTurn:
    """The board's one turn, handed to the requests waiting for it in the order they asked.

    A ``threading.Lock`` lets any of its waiters proceed when it is released ("which one of the
    waiting threads proceeds is not defined", Python's threading documentation), and a thread that
    asks again right after releasing it may go first; here each waiter queues and the turn passes
    to the longest waiting one. A waiter that gives up (an exception while it waits) leaves the queue.
    """

    def __init__(self):
        self._changed = threading.Condition(threading.Lock())
        self._queue: deque[_Ticket] = deque()  # the holder first, then the waiters in arrival order

    @property
    def queued(self) -> int:
        """The holder and the waiters."""
        with self._changed:
            return len(self._queue)

    def acquire(self, gone: Callable[[], bool] | None = None) -> None:
        """Wait for the turn; ``gone`` says whether the waiter's client left, asked by :meth:`drop_gone`."""
        ticket = _Ticket(gone)
        with self._changed:
            self._queue.append(ticket)
            try:
                while self._queue[0] is not ticket:
                    if ticket.dropped:
                        raise ClientGone("the client closed the connection while the request waited")
                    self._changed.wait()
            except BaseException:
                self._queue.remove(ticket)
                self._changed.notify_all()  # the next in line may now be first
                raise

    def drop_gone(self) -> int:
        """Take the waiters whose client left out of the queue (each raises :class:`ClientGone` where it waits);
        how many there were."""
        with self._changed:
            gone = [ticket for ticket in list(self._queue)[1:]
                    if not ticket.dropped and ticket.gone is not None and ticket.gone()]
            for ticket in gone:
                ticket.dropped = True
            if gone:
                self._changed.notify_all()
            return len(gone)

    def release(self) -> None:
        with self._changed:
            self._queue.popleft()
            self._changed.notify_all()

    def __enter__(self) -> FairTurn:
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()


class _Ticket:
    """A place in :class:`FairTurn`'s queue: whether its client left (``gone``), and whether it was dropped."""

    def __init__(self, gone: Callable[[], bool] | None):
        self.gone, self.dropped = gone, False


class _DraftCount:
    """The server's drafter source (prompt lookup's settings or a draft model) for one answer, counting the tokens
    its drafter drafts: :func:`~edgesdk.runtime.generate.generate` asks it for the answer's drafter. ``config``: a
    draft model's settings for this answer (the request's speculative.*), in place of its own; ``min_draft``: prompt
    lookup's fewest tokens a draft is checked with (speculative.n_min), which a draft model's config holds itself."""

    def __init__(self, source: LookupConfig | DraftModel, config: DraftConfig | None = None, min_draft: int = 0):
        self.source, self.config, self.min_draft, self.drafted = source, config, min_draft, 0

    def drafter(self, prompt_ids) -> _CountedDrafter:
        if self.config is not None:
            return _CountedDrafter(self, self.source.drafter(prompt_ids, self.config))
        return _CountedDrafter(self, self.source.drafter(prompt_ids))


class _CountedDrafter:
    """A drafter (``push``, ``draft``) whose drafts are added to its :class:`_DraftCount`."""

    def __init__(self, count: _DraftCount, inner):
        self.count, self.inner = count, inner

    def push(self, token: int) -> None:
        self.inner.push(token)

    def draft(self, limit: int | None = None) -> list[int]:
        least = self.count.min_draft
        if least and limit is not None and limit < least:  # llama-server: "the max possible draft is too small"
            return []
        drafted = self.inner.draft(limit)
        if len(drafted) < least:  # a draft under n_min is ignored, as llama-server ignores it
            return []
        self.count.drafted += len(drafted)
        return drafted


class _HeldTime:
    """A StepHook around another that adds up the wall time its :meth:`before_step` held steps back."""

    def __init__(self, inner: StepHook, on_prefill: Callable[[int, int, int], None] | None = None,
                 prompt_tokens: int = 0):
        self.inner, self.held_s = inner, 0.0
        self.waited_s = 0.0  # the waits the inner hook says it held the steps for, on its clock (Completion's)
        # told after each prefill step (Completer.complete's ``on_prefill``): the whole prompt's ``prompt_tokens``
        self.on_prefill, self.prompt_tokens = on_prefill, prompt_tokens
        self._fresh = self._left = self._step = 0  # the tokens prefilled, those still to, the coming step's

    def begin(self, prompt_tokens: int, max_new_tokens: int) -> None:
        self._fresh = self._left = prompt_tokens
        self.inner.begin(prompt_tokens, max_new_tokens)

    def prefill_chunk(self, prompt_left: int) -> int | None:
        """The inner hook's prefill step (generate's ``prefill_chunk``; None: the whole prompt in one step), so that
        the thermal guard behind this wrapper can pace and pause a long prompt between its steps. The step's size is
        kept as generate's ``_prefill`` reads the answer, for :meth:`after_step` to tell ``on_prefill``."""
        ask = getattr(self.inner, "prefill_chunk", None)
        size = ask(prompt_left) if ask is not None else None
        self._step = prompt_left if size is None else min(max(int(size), 1), prompt_left)
        return size

    def before_step(self, kind: str) -> float:
        entered = time.perf_counter()
        try:
            waited = self.inner.before_step(kind) or 0.0  # a no-op hook returns None (StepHook)
            self.waited_s += waited
            return waited
        finally:
            self.held_s += time.perf_counter() - entered

    def after_step(self, kind: str, tokens: int, compute_s: float) -> None:
        self.inner.after_step(kind, tokens, compute_s)
        if kind == "prefill" and self.on_prefill is not None:
            # llama-server's prompt_progress after each batch of the prompt (server-context.cpp update_slots):
            # processed counts the tokens the KV cache took from the prompt cache too (slot.prompt.tokens.size())
            self._left = max(self._left - self._step, 0)
            cached = self.prompt_tokens - self._fresh
            self.on_prefill(cached + self._fresh - self._left, cached, self.prompt_tokens)

    def end(self, stats) -> None:
        self.inner.end(stats)


# the error codes of an embedding input's 400s besides context_length_exceeded, so that the Python API can word each fix
EMPTY_INPUT, TOKEN_OUT_OF_VOCABULARY, NOT_UTF8 = "empty_input", "token_out_of_vocabulary", "not_utf8"


def server_stopping() -> ApiError:
    """The 503 of a request the stopping server does not answer (Ctrl-C, a service manager's stop): one waiting for
    its turn, or for its model to be loaded where several bundles are served (serve/model_pool.py)."""
    return ApiError(503, "the server is shutting down (edgesdk serve was stopped); retry once it runs again",
                    code="server_stopping", kind="server_error")


def _board_too_hot(exc: BoardNeverCooled) -> ApiError:
    """The thermal guard gave up waiting for the board to cool: it cannot take work now, as llama-server answers 503
    while it loads its model; a 500 would be a fault of the server (Anthropic's route gives it as overloaded_error)."""
    return ApiError(503, f"{exc.problem}; {exc.fix}", code="board_too_hot", kind="server_error")


def _template_syntax_error(exc: BundleError) -> bool:
    """Whether the chat template failed to compile (a syntax error in the bundle's template, not its messages)."""
    import jinja2

    return isinstance(exc.__cause__, jinja2.TemplateSyntaxError)


def _template_unavailable(exc: EdgeSDKError, fix: str | None = None) -> ApiError:
    """The 500 of a chat request that no request could get rendered (the server's jinja2, or the bundle's template),
    with ``fix`` (else the error's own) and the route that takes a prompt without the template."""
    fix = fix or exc.fix or "fix the server's chat template setup"
    return ApiError(500, f"the chat template cannot be rendered on this server: {exc.problem}; {fix}; until then "
                    "/v1/completions takes a prompt already rendered", code="chat_template_unavailable",
                    kind="server_error")


class Completer:
    """Runs requests against one loaded bundle, one at a time."""

    def __init__(self, runtime: Runtime, defaults: ServeDefaults | None = None, hook: StepHook | None = None,
                 draft: DraftModel | None = None):
        defaults = defaults or ServeDefaults()
        if defaults.pooling is None:  # the bundle's model's pooling, else mean
            defaults = replace(defaults, pooling=bundle_pooling(runtime.bundle.manifest, runtime.bundle.path))
        self.runtime, self.defaults, self.hook = runtime, defaults, hook
        self._turn = FairTurn()  # held while a request generates, handed on in arrival order
        self._admitted = threading.BoundedSemaphore(self.defaults.max_waiting + 1)  # generating + waiting
        self.busy = False
        self.stopping = False  # set by stop(): the server is shutting down
        self.metrics = ServeMetrics()  # GET /metrics (edgesdk serve --metrics)
        # The conversation so far stays in the KV cache between requests (llama-server's cache_prompt).
        # Other conversations' caches wait in host memory (llama-server's --cache-ram), so the title and tag
        # requests a chat client sends between turns do not cost the chat its cache.
        mib = self.defaults.cache_ram_mib
        store = CacheStore(sys.maxsize if mib == -1 else mib * 2**20) if mib else None
        self.prompt_cache = PromptCache(runtime.backend, store) if self.defaults.prompt_cache else None
        drafts = self.defaults.lookup and can_draft(runtime.backend)
        self.lookup = LookupConfig(max_draft=self.defaults.lookup) if drafts else None
        if draft is not None and can_draft(runtime.backend):  # a draft bundle (serve --draft) drafts instead
            self.lookup = draft
        self.waiting = 0  # admitted requests waiting for their turn
        self.tasks = 0  # task ids taken (llama-server's, for GET /slots): one a request, one an embedding input
        self.slot: SlotState | None = None  # the request generating now
        self._count_lock = threading.Lock()

    def _draft_limit(self) -> int:
        """Tokens a draft may hold (prompt lookup or a draft bundle), 0 without drafting."""
        if self.lookup is None:
            return 0
        return self.lookup.config.max_draft if isinstance(self.lookup, DraftModel) else self.lookup.max_draft

    def draft_settings(self, request: CompletionRequest) -> tuple[int, int, float]:
        """(n_max, n_min, p_min) of the request's answer's drafts: its speculative.n_max, n_min and p_min over the
        server's (a draft bundle's --draft-max, --draft-min and --draft-p-min; --lookup N's N, 0 and 0; 0, 0 and 0
        where the server drafts nothing, whose answers a request's values then do not change), n_min lowered to n_max as
        llama-server clamps it (server-task.cpp, params_from_json_cmpl). Prompt lookup's drafts have no probability
        to hold to p_min, so it changes nothing there, as llama-server's n-gram drafters ignore it."""
        if isinstance(self.lookup, DraftModel):
            config = self.lookup.config
            n_max, n_min, p_min = config.max_draft, config.min_draft, config.p_min
        else:
            n_max, n_min, p_min = self._draft_limit(), 0, 0.0
        n_max = n_max if request.draft_max is None else request.draft_max
        n_min = n_min if request.draft_min is None else request.draft_min
        p_min = p_min if request.draft_p_min is None else request.draft_p_min
        return n_max, min(n_min, n_max), p_min

    def speculative_params(self, request: CompletionRequest) -> dict:
        """:meth:`draft_settings` in llama-server's names, as its slot params and /props list them."""
        n_max, n_min, p_min = self.draft_settings(request)
        return {"speculative.n_max": n_max, "speculative.n_min": n_min, "speculative.p_min": p_min}

    def _drafts(self, request: CompletionRequest) -> _DraftCount | None:
        """The request's answer's drafter source, with its own draft settings (:meth:`draft_settings`): the next
        answer is back to the server's. None where the server drafts nothing or the request's n_max is 0."""
        if self.lookup is None:
            return None
        n_max, n_min, p_min = self.draft_settings(request)
        if n_max == 0:
            return None
        if isinstance(self.lookup, DraftModel):
            config = DraftConfig(max_draft=n_max, min_draft=n_min, p_min=p_min)
            return _DraftCount(self.lookup, None if config == self.lookup.config else config)
        source = self.lookup if n_max == self.lookup.max_draft else replace(self.lookup, max_draft=n_max)
        return _DraftCount(source, min_draft=n_min)

    def props(self, model: str) -> dict:
        """llama-server's ``GET /props``: the context, the settings a request that sets none gets, the chat
        template and the special tokens (what llama.cpp's web UI and clients read at start).

        ``default_generation_settings.params`` holds every field ``GET /slots`` shows of a request that sets none
        (``seed`` the server's ``-s``, else 4294967295, ``stop``, ``ignore_eos``, ``n_probs`` ...:
        edgesdk/serve/llama_native.py, ``generation_settings``) with ``cache_prompt`` and ``speculative.n_max``,
        ``speculative.n_min`` and ``speculative.p_min`` (:meth:`draft_settings`), as
        llama-server's get_props shows ``task_params::to_json`` of its default sampling; ``model_alias`` is the name
        requests give, as llama-server's ``--alias``. ``model_path`` is the bundle's directory, resolved (a ``current``
        link read through), as llama-server's is the model file it loaded, and ``bundle_id`` the manifest's: after
        a redeploy or a rollback the served name stays, and these tell which build answers."""
        from edgesdk.serve.llama_native import generation_settings

        defaults, tokenizer = self.defaults, self.runtime.tokenizer
        idle = CompletionRequest(chat=False)
        params = generation_settings(idle, self.sampling(idle), defaults.n_keep, defaults.max_tokens, self.shifts(idle))
        # serve -n -1 (no limit but the context) is -1 here, as llama-server's "-1 = infinity" reads
        unlimited = defaults.max_tokens >= UNTIL_THE_CONTEXT_FILLS
        params.update({"n_predict": -1 if unlimited else defaults.max_tokens, "cache_prompt": defaults.prompt_cache,
                       **self.speculative_params(idle)})
        return {"default_generation_settings": {"id": 0, "n_ctx": self.runtime.backend.max_context,
                                                "is_processing": self.busy, "speculative": self.lookup is not None,
                                                "params": params},
                "total_slots": 1, "model_alias": model, "model_path": str(Path(self.runtime.bundle.path).resolve()),
                "bundle_id": self.runtime.bundle.bundle_id,
                "chat_template": tokenizer.template_source or "",
                "bos_token": tokenizer.bos_token or "", "eos_token": tokenizer.eos_token or "",
                "modalities": {"vision": False, "audio": False}, "build_info": f"edgesdk {__version__}"}

    @contextmanager
    def exclusive(self, keep_cache: bool = False) -> Iterator[None]:
        """The board's one turn for work on the backend outside a request (a perplexity measured through the
        Python API): it waits for the request generating and those queued before it, and requests wait for it.
        Afterwards the prompt cache starts over, as the backend's KV cache holds that work's tokens; with
        ``keep_cache`` it stays, for work that leaves the KV cache and the prompt cache's tokens agreeing, also
        when it raises (the cache written to a file, or loaded from one)."""
        with self._turn:
            try:
                yield
            finally:
                if not keep_cache and self.prompt_cache is not None:
                    self.prompt_cache.forget()
                elif not keep_cache:
                    self.runtime.backend.reset()

    @property
    def others_waiting(self) -> bool:
        """Whether work waits for the board's turn behind the one holding it (a caller that holds the turn can
        then hand it on sooner: the Python API's unread stream runs to its end instead of waiting for its reader)."""
        return self._turn.queued > 1

    def stop(self) -> None:
        """Take no more requests: the one generating ends at its next token and those waiting when
        their turn comes, each with a 503 ``server_stopping`` (a streamed answer gets it as its last
        event). The caller closes what the hook holds (the thermal session, the clock cap) once the
        answers are out, so no step of theirs runs after it."""
        self.stopping = True

    def close(self) -> None:
        """Give back what the model holds, for a server that loads another bundle in its place (``edgesdk serve``
        with several bundles, edgesdk/serve/model_pool.py): once the answers in flight and queued have had their
        turn, the prompt cache and the host copies of other conversations' KV caches are dropped, the backend's KV
        cache is reset and the backend (and a draft bundle's) closed where it has a ``close``: an ONNX Runtime session
        and the weights it holds go now, as do TensorRT's device buffers and stream. A request after it gets the 503
        of :meth:`stop`."""
        self.stopping = True
        with self._turn:
            backend = self.runtime.backend
            if self.prompt_cache is not None:
                if self.prompt_cache.store is not None:
                    self.prompt_cache.store.entries.clear()
                self.prompt_cache.forget()
                self.prompt_cache = None
            else:
                backend.reset()
            backends = [backend] + ([self.lookup.backend] if isinstance(self.lookup, DraftModel) else [])
            for each in backends:  # the draft bundle's backend too, TensorRT's buffers as the model's own
                close_backend(each)

    def _count_waiting(self, change: int) -> None:
        with self._count_lock:
            self.waiting += change

    def _check_stopping(self) -> None:
        if self.stopping:
            raise server_stopping()

    def prompt_ids(self, request: CompletionRequest) -> list[int]:
        """The request's token ids, or a 400 naming what is wrong with its text."""
        tokenizer = self.runtime.tokenizer
        try:
            if request.prompt_tokens:
                ids = list(request.prompt_tokens)
                vocabulary = self.token_id_limit()
                if max(ids) >= vocabulary:
                    raise ApiError(400, f"'prompt' holds token id {max(ids)}; this model's vocabulary has ids 0 to "
                                   f"{vocabulary - 1}", param="prompt", code=TOKEN_OUT_OF_VOCABULARY,
                                   # ids a client tokenized with another tokenizer (tiktoken's, OpenAI's) mostly
                                   fix="send ids of this model's own vocabulary (POST /tokenize, or the Python "
                                       "API's tokenize(), gives them); a client that tokenizes with tiktoken sends "
                                       "OpenAI's ids: send the prompt's text instead")
            elif not request.chat:
                check_utf8(request.prompt, "'prompt'")  # named as the field, as its other refusals name it
                ids = tokenizer.prompt_ids(request.prompt, raw=True)
            else:
                ids = tokenizer.chat_ids(self.rendered_chat(request))
        except EdgeSDKError as exc:  # text that is not UTF-8 (lone surrogates from JSON escapes)
            raise not_utf8(exc, "prompt") from exc
        limit = self.runtime.backend.max_context
        if not ids:
            raise ApiError(400, "the prompt encodes to 0 tokens", param="prompt")
        if len(ids) > limit:
            # llama-server's exceed_context_size_error ("request (N tokens) exceeds the available context size (C
            # tokens), try increasing it": tools/server/server-context.cpp), with the fix a bundle's context takes:
            # the --max-context that holds more, the most the model's positions allow, or that none does
            # (the field named is the route's own: the Responses API's input)
            what = request.prompt_param or ("messages" if request.chat else "prompt")
            shorten = f"shorten the {what} to fewer tokens (POST /tokenize counts them)"
            # a server started with -c N below the bundle's context: raising -c holds more, before any rebuild
            built = getattr(self.runtime.backend, "built_context", None)
            raise context_refusal(overflow_headline(len(ids), limit, what), shorten, what, len(ids), limit,
                                  self.runtime.bundle.manifest, built, self._context_source())
        return ids

    def token_id_limit(self) -> int:
        """The token ids a request may give: the tokenizer's, and no more than the model has rows for (ids past them
        it cannot read)."""
        vocabulary = self.runtime.tokenizer.tokenizer.get_vocab_size(with_added_tokens=True)
        rows = getattr(self.runtime.backend, "vocab_size", None)
        return min(vocabulary, rows) if rows else vocabulary

    def rendered_chat(self, request: CompletionRequest) -> str:
        """The chat request's prompt text (:meth:`chat_text`), or a 400 naming what the messages or template refused.

        What no change to the request can mend is the server's 500 (``chat_template_unavailable``), its fix named: a
        jinja2 too old to run chat templates in a safe sandbox (edgesdk.runtime.text.chat_environment), and a bundle
        whose template does not compile (a syntax error). llama-server tells the two apart the same way: an
        invalid_argument from the request's parsing is its 400, any other failure its 500 (tools/server/server.cpp,
        ``ex_wrapper``); a 400 here told the client to change messages that were never at fault."""
        if not self.runtime.tokenizer.has_chat_template:
            raise ApiError(400, "this bundle's model has no chat template, so it cannot take messages",
                           param="messages", code="no_chat_template")
        # text that is not UTF-8 (lone surrogates from JSON escapes): named as the client sent it, then in the
        # prompt's turns (what a caller built without the client's texts)
        for param, text in request.texts:
            utf8_field(text, param)
        checked = {text for _, text in request.texts}  # clean: a turn that is one of them needs no second look
        for index, message in enumerate(request.messages):
            if message["content"] not in checked:
                utf8_field(message["content"], f"messages[{index}].content")
        try:
            return self.chat_text(request)
        except BundleError as exc:
            if _template_syntax_error(exc):  # the bundle's template, whatever the messages
                raise _template_unavailable(exc, "correct the model's chat template (its chat_template.jinja or "
                                            "tokenizer_config.json) and rebuild the bundle") from exc
            if not exc.problem.startswith(REFUSED):
                raise ApiError(400, exc.problem, param="messages") from exc
            # the template refused the messages: its fix in a client's words (a server has no --raw); the refusal
            # keeps the template's words, with which the Python API words its own fix (edgesdk/api.py)
            words = exc.problem[len(REFUSED):]
            refusal = ApiError(400, f"{exc.problem}; {template_refusal_fix(words, 'server')}", param="messages")
            refusal.template_refusal = (exc.problem, words)
            raise refusal from exc
        except EdgeSDKError as exc:  # the server's setup (jinja2 too old): no request renders
            raise _template_unavailable(exc) from exc

    def continues_final(self, request: CompletionRequest) -> bool:
        """Whether the request's last message (an assistant's) is continued, or a 400 where a constraint would
        apply to an answer that the client already began."""
        if not (request.continue_final and self.defaults.prefill_assistant):
            return False
        shaped = ("tools" if request.tools is not None else "grammar" if request.grammar is not None
                  else "response_format" if request.json_schema is not None or request.json_object else None)
        if shaped is not None:
            raise ApiError(400, f"the messages end with an assistant message, which the answer continues, and "
                           f"'{shaped}' shapes the answer from its start; end the messages with a user message, or "
                           f"leave '{shaped}' out", param="messages")
        return True

    def chat_text(self, request: CompletionRequest) -> str:
        """The chat request's messages through the bundle's chat template: a generation prompt after them, or the
        last (assistant) message left open for the model to go on (:meth:`continues_final`)."""
        tokenizer, kwargs = self.runtime.tokenizer, request.template_kwargs
        given = {**tokenizer.template_kwargs, **(kwargs or {})}
        if self.defaults.reasoning_budget == 0 and "enable_thinking" not in given:
            kwargs = {**(kwargs or {}), "enable_thinking": False}
        continues = self.continues_final(request)
        # tool results in a row and the user's words after them are one user turn (serve/api.py chat_turns): a
        # template that makes roles alternate (Llama 2's, Mistral's) refuses several user turns in a row
        text = tokenizer.render_chat(chat_turns(request.messages), continue_final=continues, template_kwargs=kwargs)
        if not continues and self.thinking_off(request) and prompt_opens_thinking(text):
            # a template that opens the block whatever enable_thinking says (DeepSeek-R1's): llama.cpp closes it in
            # the prompt (common/chat.cpp, the DeepSeek-R1 handler: a prompt ending in "<think>\n" gets "</think>"
            # where enable_thinking is false), so the answer is not thinking forced open
            text += CLOSE
        return text

    def reasoning_splitter(self, request: CompletionRequest) -> ReasoningSplitter | None:
        """A splitter of the answer's ``<think>`` block from its content (edgesdk/serve/reasoning.py), or None:
        for a text completion, an answer a constraint shapes from its start (a grammar, JSON), one under tools (its
        reader, :class:`~edgesdk.serve.tools.AnswerStream`, splits a thinking model's block before the call), the
        ``none`` format, and ``auto`` where the chat template writes no ``<think>`` block. An answer that goes on
        from a begun assistant message (``<think>\nThe fox``) is split from where that message's text left off."""
        if not request.chat or request.tools is not None or request.grammar is not None or \
                request.json_schema is not None or request.json_object:
            return None
        form = request.reasoning_format or self.defaults.reasoning_format
        if form == "none" or (form == "auto" and not template_thinks(self.runtime.tokenizer.template_source)):
            return None
        # rendered_chat: a template that refuses the messages is the request's 400 here too (a stream asks first)
        prompt = self.rendered_chat(request)
        begun = request.messages[-1]["content"] if self.continues_final(request) else ""
        inline = form == "deepseek-legacy" and request.stream  # llama-server's reasoning_in_content
        if begun.strip():  # the answer goes on from the client's text, in the block where that text left it open
            return ReasoningSplitter(inline=inline).begun(begun)
        return ReasoningSplitter(opened=prompt_opens_thinking(prompt), inline=inline)

    def sampling(self, request: CompletionRequest) -> SamplingConfig:
        """The request's sampling, its unset fields the server's defaults: a request without a seed gets the
        server's (a random one where it has none), one that asks for a random seed (:data:`RANDOM_SEED`) a random
        one still, as llama-server reads ``seed`` with its ``-s`` for the default (server-task.cpp). A limit of 0
        tokens (POST /completion's ``n_predict`` 0: the prompt evaluated, nothing generated, :meth:`_prefill_only`)
        samples nothing; its settings are checked all the same, with a limit of 1."""
        pick = lambda value, default: default if value is None else value  # noqa: E731
        limit, context = max(pick(request.max_tokens, self.defaults.max_tokens), 1), self.runtime.backend.max_context
        if not self.shifts(request):
            limit = min(limit, context)
        elif limit >= UNTIL_THE_CONTEXT_FILLS:  # ten of the contexts the answer shifts within
            limit = SHIFTED_LIMIT_CONTEXTS * min(request.shift_window or context, context)
        config = SamplingConfig(max_new_tokens=limit,
                                temperature=pick(request.temperature, self.defaults.temperature),
                                top_p=pick(request.top_p, self.defaults.top_p),
                                top_k=pick(request.top_k, self.defaults.top_k),
                                min_p=pick(request.min_p, self.defaults.min_p),
                                samplers=pick(request.samplers, self.defaults.samplers), seed=self._seed(request),
                                presence_penalty=request.presence_penalty, frequency_penalty=request.frequency_penalty,
                                repeat_penalty=pick(request.repeat_penalty, self.defaults.repeat_penalty),
                                repeat_last_n=pick(request.repeat_last_n, self.defaults.repeat_last_n),
                                logit_bias=self._logit_bias(request))
        self._check_infill_vocabulary(config)
        return config

    def _seed(self, request: CompletionRequest) -> int | None:
        """The seed the request's answer samples with: its own, the server's where it sent none, None (a random
        one) where it asked for one."""
        if request.seed is None:
            return self.defaults.seed
        return None if request.seed == RANDOM_SEED else request.seed

    def _stopped_at_full_context(self, request: CompletionRequest, sampling: SamplingConfig,
                                 stats: GenerationStats) -> bool:
        """Whether the answer stopped because the context was full (llama-server's ``truncated``). Without a context
        shift, a limit past the context (the request's, else the server's, -1 too) is held to the context's size
        (:meth:`sampling`); an answer that reaches that held limit filled the context, not the limit asked for: a
        one-token prompt reaches it together with the full context, which generate() reports as the token limit."""
        if stats.stop_reason == "max_context":
            return True
        asked = self.defaults.max_tokens if request.max_tokens is None else request.max_tokens
        return stats.stop_reason == "max_new_tokens" and not self.shifts(request) and asked > sampling.max_new_tokens

    def _context_source(self) -> str:
        """What held the run's context below the bundle's (:meth:`~edgesdk.runtime.session.Runtime.cap_context`: -c,
        LLAMA_ARG_CTX_SIZE, the Python API's n_ctx), which an overflow's fix names and raises."""
        return getattr(self.runtime.backend, "context_source", "-c")

    def shifts(self, request: CompletionRequest) -> bool:
        """Whether the request's answer shifts a full context and goes on (its own setting, else the server's)."""
        asked = request.context_shift
        return self.defaults.context_shift if asked is None else asked

    def context_shift(self, request: CompletionRequest, ids: list[int], sampling: SamplingConfig) -> ContextShift | None:
        """The request's context shift (None: the answer stops at the full context), or a 400 naming ``n_keep`` where
        what it keeps leaves nothing to discard in a context the answer can reach, and ``n_discard`` where it
        discards more than follows the kept tokens. ``n_keep`` counts the BOS the prompt starts with on top, as
        llama.cpp adds it to the tokens kept where the vocabulary adds one."""
        if not self.shifts(request):
            return None
        keep = request.n_keep
        bos = starts_with_added_bos(self.runtime.tokenizer, ids)
        param = request.keep_param
        built = getattr(self.runtime.backend, "built_context", None)  # -c N below the bundle's: named in a refusal
        try:
            shift = ContextShift(keep=self.defaults.n_keep if keep is None else keep,
                                 discard=request.n_discard, bos=bos,
                                 window=request.shift_window)
            if len(ids) + sampling.max_new_tokens - 1 > shift.context(self.runtime.backend.max_context):
                source = self._context_source()
                replace(shift, discard=0).spans(len(ids), self.runtime.backend.max_context, built,
                                                source)  # what n_keep keeps
                param = "n_discard"  # the kept tokens leave some to discard: only the request's discard can fail
                shift.spans(len(ids), self.runtime.backend.max_context, built, source)
        except ValueError as exc:
            raise ApiError(400, f"'{param}': {exc}", param=param) from exc
        except EdgeSDKError as exc:
            raise ApiError(400, f"'{param}': {exc.problem}; {exc.fix}", param=param) from exc
        return shift

    def _check_infill_vocabulary(self, sampling: SamplingConfig) -> None:
        """Where the chain holds llama.cpp's infill sampler, its view of the vocabulary is read first (once per
        model: the token texts, the end-of-generation ids, the EOT token), so that a vocabulary it cannot read is
        the request's 400 naming ``samplers``."""
        if "infill" in sampling.samplers:
            from edgesdk.runtime.infill_sampler import vocabulary_of

            try:
                vocabulary_of(self.runtime.tokenizer)
            except EdgeSDKError as exc:
                raise ApiError(400, f"'samplers': {exc.problem}; {exc.fix}", param="samplers") from exc

    def vocabulary(self) -> int:
        return self.runtime.tokenizer.tokenizer.get_vocab_size(with_added_tokens=True)

    def _logit_bias(self, request: CompletionRequest) -> tuple[tuple[int, float], ...]:
        """The request's logit bias as (token id, bias) pairs: ids checked against the vocabulary, text keys
        tokenized as llama-server tokenizes them (``common_tokenize(vocab, text, false)``: special tokens' text read
        as plain text, so ``"<|im_end|>"`` is its pieces, not the end-of-text token), one pair per token of the text:
        a token that appears twice gets the bias twice, as llama-server's logit-bias sampler adds each entry. The ids
        are those the model has a logit for (:meth:`token_id_limit`: a tokenizer with tokens past the model's rows
        has ids no bias can reach), refused here, before a stream opens, rather than at the first step."""
        vocabulary, pairs = self.token_id_limit(), []
        for key, bias in request.logit_bias:
            if isinstance(key, int):
                if key >= vocabulary:
                    raise ApiError(400, f"'logit_bias' names token id {key}; this model's vocabulary has ids 0 to "
                                   f"{vocabulary - 1} (POST /tokenize gives a text's ids)", param="logit_bias")
                pairs.append((key, bias))
                continue
            utf8_field(key, "logit_bias", f"the logit_bias key {key!r}")
            tokens = self.runtime.tokenizer.encode_plain(key)
            if max(tokens, default=-1) >= vocabulary:  # an added token past the model's rows
                raise ApiError(400, f"'logit_bias' key {key!r} holds token id {max(tokens)}; this model's vocabulary "
                               f"has ids 0 to {vocabulary - 1}: leave that text out of 'logit_bias'",
                               param="logit_bias")
            pairs.extend((token, bias) for token in tokens)
        if request.ignore_eos:
            pairs.extend((token, -math.inf) for token in sorted(self.runtime.tokenizer.eos_token_ids))
        if len({token for token, bias in pairs if bias == -math.inf}) >= vocabulary:
            raise ApiError(400, f"'logit_bias' bans every token of the vocabulary (false or -inf on all {vocabulary}); "
                           "leave some token without a ban", param="logit_bias")
        return tuple(pairs)

    def tokenize(self, request: TokenizeRequest) -> dict:
        """llama-server's ``POST /tokenize`` answer: ``{"tokens": [id, ...]}``, or with ``with_pieces`` each token
        as ``{"id", "piece"}``, the piece a string where its bytes are UTF-8 and a list of bytes where not."""
        ids = self._content_ids(request)
        if not request.with_pieces:
            return {"tokens": ids}
        pieces = []
        for token in ids:
            piece = self._token_piece(token)
            try:
                shown: str | list[int] = piece.decode("utf-8")
            except UnicodeDecodeError:
                shown = list(piece)
            pieces.append({"id": token, "piece": shown})
        return {"tokens": pieces}

    def _content_ids(self, request: TokenizeRequest) -> list[int]:
        """The ids of ``/tokenize``'s ``content`` as llama-server's ``tokenize_mixed`` builds them: a string
        tokenized, or an array's ids as they are (each checked against the vocabulary) and its strings tokenized,
        the tokenizer's special tokens added to a string only where it is the first part."""
        tokenizer = self.runtime.tokenizer.tokenizer if request.parse_special else self.runtime.tokenizer.plain_text()
        mixed = not isinstance(request.content, str)
        vocabulary, ids = self.vocabulary(), []
        for index, part in enumerate(request.content if mixed else (request.content,)):
            name = f"'content[{index}]'" if mixed else "'content'"
            if isinstance(part, int):
                if part >= vocabulary:
                    raise ApiError(400, f"{name} is {part}; this model's vocabulary has ids 0 to {vocabulary - 1}",
                                   param="content")
                ids.append(part)
                continue
            utf8_field(part, "content", name)
            ids.extend(tokenizer.encode(part, add_special_tokens=request.add_special and index == 0).ids)
        return ids

    def detokenize(self, tokens: tuple[int, ...]) -> dict:
        """llama-server's ``POST /detokenize`` answer: ``{"content": text}``, special tokens written out."""
        vocabulary = self.vocabulary()
        for index, token in enumerate(tokens):
            if token >= vocabulary:
                raise ApiError(400, f"tokens[{index}] is {token}; this model's vocabulary has ids 0 to "
                               f"{vocabulary - 1}", param=f"tokens[{index}]")
        return {"content": pieces_text(self.runtime.tokenizer, list(tokens))}

    def complete(self, request: CompletionRequest, on_text: Callable[[str, dict | None], None] | None = None,
                 on_start: Callable[[], None] | None = None,
                 client_gone: Callable[[], bool] | None = None,
                 on_ids: Callable[[list[int]], None] | None = None,
                 on_prefill: Callable[[int, int, int], None] | None = None) -> Completion:
        """Generate the answer; ``on_text`` gets each piece of text as it is settled (and the logprobs
        object of the tokens that made it, when the request asked for them), ``on_start`` is
        called when the request's turn comes (before its prefill). An exception from either (a client
        that went away) ends the generation and propagates; the next request runs normally.

        ``client_gone`` is asked when the turn comes and after every token: once it says the client
        left, :class:`ClientGone` ends the request there, as llama-server drops a request whose
        connection closed. A request whose client left while it waited in the queue never runs (and gives
        its place to a request that finds the queue full), and a
        whole (not streamed) answer, which writes nothing until its end, stops at the next token.

        ``on_ids`` (llama-server's stream, whose every partial result carries the ids of its token: server-context.cpp
        send_partial_response) gets, just before each ``on_text`` of the answer's text, the ids of the tokens sampled
        since the last one; ids that made no text handed out (a stop string's, the end-of-text token) come at the
        end with an ``on_text`` of "".

        ``on_prefill`` (llama-server's ``return_progress``: a ``prompt_progress`` partial result after each batch of
        the prompt, server-context.cpp update_slots) is called after each step of the prompt's prefill (one step, or
        the thermal guard's ``prefill_chunk`` steps) with the prompt's tokens the KV cache holds so far, those of them
        it took from the prompt cache, and the prompt's tokens (its ``processed``, ``cache`` and ``total``)."""
        ids = self.prompt_ids(request)
        if request.prompt_tokens:  # the text an echo returns and text_offset counts from, its special tokens written
            # out as the logprobs list them (and as the same prompt sent as text comes back)
            request = replace(request, prompt=self.runtime.tokenizer.tokenizer.decode(ids, skip_special_tokens=False))
        sampling = self.sampling(request)
        # Refused before the turn, as a bad prompt is: a stream's headers go out when the turn comes.
        constraint = self._constraint(request)
        shift = self.context_shift(request, ids, sampling)
        with self._request_turn(client_gone, answer=True):
            self.busy = True
            self.tasks += 1
            self.slot = SlotState(self.tasks, request, sampling, len(ids))
            try:
                try:
                    self._check_stopping()
                    if client_gone is not None and client_gone():
                        raise ClientGone("the client closed the connection while the request waited")
                    if on_start is not None:  # a stream's headers and first events: a client gone fails the write
                        on_start()
                except BaseException as exc:  # ended before its first step: counted, no hook to tell
                    self._count_ended(exc)
                    raise
                with self._thermal_wait_ends(client_gone, "the answer"):
                    try:
                        if request.max_tokens == 0:  # its prefill is paced and paused by the guard as an answer's
                            return self._prefill_only(request, ids, on_text, on_prefill)
                        return self._generate(request, ids, sampling, constraint, on_text, client_gone, shift,
                                              on_ids, on_prefill)
                    except LogitBiasError as exc:  # the request's bias left no token to take: its fault, not ours
                        raise ApiError(400, f"{exc.problem}; {exc.fix}", param="logit_bias") from exc
                    except BoardNeverCooled as exc:
                        raise _board_too_hot(exc) from exc
            finally:
                self.busy, self.slot = False, None

    @contextmanager
    def _request_turn(self, client_gone: Callable[[], bool] | None, answer: bool = False) -> Iterator[None]:
        """A request's place in the queue, then its turn on the board: a 503 ``server_busy`` where
        ``max_waiting`` requests already wait, ``server_stopping`` once :meth:`stop` was called. An ``answer`` (not an
        embedding, which the request counters leave out) whose client left while it waited is counted cancelled, as
        one whose client leaves once its turn came."""
        self._check_stopping()
        # A full queue first lets go of the waiters whose client left (they hold places until asked, never run)
        if not self._admitted.acquire(blocking=False) and \
                not (self._turn.drop_gone() and self._admitted.acquire(timeout=DROPPED_WAIT_S)):
            self.metrics.refuse_busy()
            raise ApiError(503, f"the server is busy: one request is generating and {self.defaults.max_waiting} are "
                           "waiting; retry later (edgesdk serve --max-queue raises the limit)",
                           code="server_busy", kind="server_error")
        self._count_waiting(+1)
        try:
            try:
                self._turn.acquire(client_gone)
            except ClientGone as exc:
                if answer:
                    self._count_ended(exc)
                raise
            finally:
                self._count_waiting(-1)
            try:
                yield
            finally:
                self._turn.release()
        finally:
            self._admitted.release()

    @contextmanager
    def _thermal_wait_ends(self, client_gone: Callable[[], bool] | None, what: str) -> Iterator[Callable[[], None]]:
        """Inside, a thermal pause of the hook ends where the work would end at its next step: the client left
        (:class:`ClientGone`) or the server stops (503 ``server_stopping``). Yields that check, for work that asks it
        between its own steps (an embedding's inputs)."""

        def abandon_wait() -> None:
            if client_gone is not None and client_gone():
                raise ClientGone(f"the client closed the connection while the thermal guard held {what}")
            self._check_stopping()

        wired = hasattr(self.hook, "abandon_wait")
        if wired:
            self.hook.abandon_wait = abandon_wait
        try:
            yield abandon_wait
        finally:
            if wired:
                self.hook.abandon_wait = None

    def embed(self, inputs: Sequence[str | Sequence[int]], config: EmbeddingConfig, truncate: bool = False,
              param: str = "input", client_gone: Callable[[], bool] | None = None, window: int | None = None,
              window_name: str = BUNDLE_CONTEXT) -> list[Embedding]:
        """The embeddings of ``inputs`` (texts, tokenized with the model's special tokens as llama-server's
        embedding route does, or token id lists) in one turn on the board. The sequences run beside the
        conversation in the KV cache (:func:`edgesdk.runtime.embedding.embed_tokens`), so the prompt cache
        stays; the thermal hook paces or pauses each as it does a prefill. Each must fit in ``window`` tokens
        (Ollama's ``num_ctx``, named ``window_name`` in refusals; the bundle's context where None or larger), or with
        ``truncate`` is cut to it. Errors are 400s naming ``param`` (``input[2]`` for the third input)."""
        problem = hidden_states_problem(self.runtime.backend, self.runtime.bundle.manifest)  # its bundle's fix
        if problem is not None:
            raise ApiError(501, f"{problem.problem}; {problem.fix}", code="not_supported", kind="not_supported_error")
        if not inputs:
            raise ApiError(400, f"'{param}' holds no input to embed", param=param)
        # every input tokenized and checked against the context before the turn: a refused one waits for no turn
        # or thermal pause, and runs none of the others
        limit = self.runtime.backend.max_context
        fit = (limit, BUNDLE_CONTEXT) if window is None or window >= limit else (window, window_name)
        sequences = [self._embedding_ids(item, f"{param}[{index}]" if len(inputs) > 1 else param, truncate, *fit)
                     for index, item in enumerate(inputs)]

        with self._request_turn(client_gone), self._thermal_wait_ends(client_gone, "the embedding") as abandon_wait:
            self.busy = True
            # llama-server makes an embedding task of each input, its ids taken one after another
            # (server-context.cpp handle_embeddings_impl), and its slot runs them in turn: GET /slots shows the
            # slot processing the input being embedded now, under its own id_task (no tokens to predict: n_predict 0)
            idle = CompletionRequest(chat=False, max_tokens=0)
            sampling = self.sampling(idle)
            try:
                self._check_stopping()
                if client_gone is not None and client_gone():
                    raise ClientGone("the client closed the connection while the request waited")
                first, self.tasks = self.tasks + 1, self.tasks + len(sequences)
                embeddings = []
                for index, (ids, cut) in enumerate(sequences):
                    if index:  # the client left or the server stops between inputs: the rest do not run
                        abandon_wait()
                    self.slot = SlotState(first + index, idle, sampling, len(ids))
                    embeddings.append(replace(self._embed_one(ids, config), truncated=cut))
                return embeddings
            finally:
                self.busy, self.slot = False, None

    def _embedding_ids(self, item: str | Sequence[int | str], param: str, truncate: bool, limit: int,
                       window: str) -> tuple[list[int], bool]:
        """(token ids, cut) of one embedding input as it will run, or a 400 naming it: an input past ``limit`` tokens
        (``window``) is refused, or with ``truncate`` cut to it keeping the special tokens the tokenizer appended to
        a text (:func:`edgesdk.runtime.embedding.fitted`); token ids given as such are cut as they are. An input
        mixing ids and strings takes its strings' ids as llama-server's ``tokenize_mixed`` does: the special tokens
        (BOS) added to a string only where it comes first."""
        tokenizer = self.runtime.tokenizer
        end = 0
        if not isinstance(item, str) and any(isinstance(part, str) for part in item):
            item = mixed_prompt_ids(tokenizer, list(item), param)  # a 400 naming the part (not_utf8 for bad text)
        if isinstance(item, str):
            try:
                ids, end = text_ids(tokenizer, item) if item else ([], 0)
            except EdgeSDKError as exc:  # text that is not UTF-8 (lone surrogates from JSON escapes)
                raise ApiError(400, f"'{param}': {exc.problem}; {exc.fix}", param=param, code=NOT_UTF8) from exc
        else:
            ids = [int(token) for token in item]
            vocabulary = self.token_id_limit()
            bad = [token for token in ids if not 0 <= token < vocabulary]
            if bad:
                raise ApiError(400, f"'{param}' holds token id {bad[0]}; this model's vocabulary has ids 0 to "
                               f"{vocabulary - 1}", param=param, code=TOKEN_OUT_OF_VOCABULARY,
                               # ids a client tokenized with another tokenizer: LangChain's OpenAIEmbeddings sends
                               # tiktoken's (OpenAI's) by default, which name no token of this model past its size
                               fix="send ids of this model's own vocabulary (POST /tokenize, or the Python API's "
                                   "tokenize(), gives them); a client that tokenizes with tiktoken sends OpenAI's "
                                   "ids: send the texts instead (LangChain's OpenAIEmbeddings: "
                                   "check_embedding_ctx_length=False)")
        if not ids:
            raise ApiError(400, f"'{param}' is empty: there is nothing to embed", param=param, code=EMPTY_INPUT)
        try:
            return fitted(ids, limit, truncate, end, window, getattr(self.runtime.backend, "built_context", None),
                          restart=True, source=self._context_source())
        except EmbeddingError as exc:
            if isinstance(exc, InputTooLong) and window == BUNDLE_CONTEXT:  # led by OpenAI's words, the input named
                raise ApiError(400, f"{overflow_headline(len(ids), limit, param)}; {exc.fix}", param=param,
                               code="context_length_exceeded") from exc
            code = "context_length_exceeded" if isinstance(exc, InputTooLong) else None
            raise ApiError(400, f"'{param}': {exc.problem}; {exc.fix}", param=param, code=code) from exc

    def _embed_one(self, ids: list[int], config: EmbeddingConfig) -> Embedding:
        """The embedding of ``ids`` (checked by :meth:`_embedding_ids`), one pass that the thermal hook paces or
        pauses as a prefill. The pass is counted in the metrics as llama-server counts an embedding task's: its tokens
        as prompt tokens processed and one decode (tools/server/server-context.cpp, metrics_post_decode), none
        predicted, no answer finished, none cached (an embedding reads no prompt cache); the guard's wait too. The
        hook's end comes also for an embedding its wait ended (the client left, the server stopping, a board that
        never cooled), which gives a capped clock back."""
        hook = MetricsHook(self.metrics, self.hook)
        try:
            embedding = hooked_pass(hook, len(ids), lambda: embed_tokens(self.runtime.backend, ids, config))
        except BaseException as exc:
            hook.end(None)
            if isinstance(exc, BoardNeverCooled):
                raise _board_too_hot(exc) from exc
            raise
        hook.end(GenerationStats(prompt_tokens=embedding.tokens, stop_reason="embedding"))
        return embedding

    def _prefill_only(self, request: CompletionRequest, ids: list[int],
                      on_text: Callable[[str, dict | None], None] | None = None,
                      on_prefill: Callable[[int, int, int], None] | None = None) -> Completion:
        """llama-server's ``n_predict`` 0 (tools/server README, "POST /completion": "no tokens will be generated but
        the prompt is evaluated into the cache"): the prompt's part that the KV cache does not hold yet is
        prefilled, so a next request that starts with it prefills only what follows; the answer is empty, its
        timings those of the prefill. The hook sees the prefill as a step that yielded no token.

        ``/v1/completions`` with ``max_tokens`` 0 (OpenAI takes 0) is the same; with ``echo`` its answer is the
        prompt, and with ``logprobs`` too each prompt token's log-probability (the first's null: nothing predicts
        it), as OpenAI scores a prompt (``echo: true, logprobs: N, max_tokens: 0``, lm-evaluation-harness's
        loglikelihood): the whole prompt is prefilled then, none of it taken from the cache, as :meth:`_generate`
        does for an echo's log-probabilities. With ``logprobs`` and no echo, the lists are empty."""
        backend, cache = self.runtime.backend, self.prompt_cache
        openai_logprobs = request.logprobs is not None and not request.llama_probs
        recorder = LogprobRecorder(top=request.logprobs, prompt=True) if openai_logprobs and request.echo else None
        hook = _HeldTime(MetricsHook(self.metrics, self.hook, self.runtime.backend, self.prompt_cache), on_prefill,
                         len(ids))
        start = time.perf_counter()
        stats = GenerationStats(prompt_tokens=len(ids), stop_reason="max_new_tokens")
        try:
            if cache is None:
                backend.reset()
            else:
                stats.cached_tokens = cache.start(ids, reuse=request.cache_prompt and recorder is None)
            fresh = ids[stats.cached_tokens:]
            hook.begin(len(fresh), 0)
            # in the steps the thermal guard asks for (prefill_chunk), as generate() prefills a prompt: one pass else
            rows, last_s = _prefill(backend, fresh, len(fresh) if recorder else 1, hook, cache, stats)
            if recorder is not None:  # also a one-token prompt, whose one entry has no log-probability
                recorder.record_prompt(rows, list(ids))
            hook.after_step("prefill", 0, last_s)
            hook.end(stats)
        except BaseException as exc:
            self._failed(exc)
            raise
        self.metrics.finish("length")
        prompt_ms = (time.perf_counter() - start - hook.held_s) * 1e3
        text = request.prompt if request.echo else ""
        logprobs = None
        if openai_logprobs:
            logprobs = logprobs_body(request, recorder.prompt_entries if recorder else [], self._token_piece,
                                     0 if request.echo else len(request.prompt))
        if text and on_text is not None:  # a stream's one piece: the echoed prompt, with its logprobs
            on_text(text, logprobs)
        return Completion(text, "length", len(ids), 0, stats.cached_tokens, logprobs, prompt_ms=max(prompt_ms, 0.0),
                          thermal_wait_ms=self._thermal_wait_ms(hook))

    def _generate(self, request: CompletionRequest, ids: list[int], sampling: SamplingConfig,
                  constraint: TokenConstraint | None, on_text: Callable[[str, dict | None], None] | None,
                  client_gone: Callable[[], bool] | None, shift: ContextShift | None = None,
                  on_ids: Callable[[list[int]], None] | None = None,
                  on_prefill: Callable[[int, int, int], None] | None = None) -> Completion:
        tokenizer, slot = self.runtime.tokenizer, self.slot
        sampled: list[int] = []  # every token sampled (Completion.tokens)
        unsent: list[int] = []  # those not yet handed to on_ids
        decoder, matcher, pieces = StreamDecoder(tokenizer), StopMatcher(request.stop), []
        answer: list[str] = []  # the answer's text handed out (pieces without an echoed prompt)
        limits = LineLimits(request.n_indent, request.t_max_predict_ms)
        count = 0
        recorder = None if request.logprobs is None else LogprobRecorder(top=request.logprobs, prompt=request.echo)
        offsets = TextOffsets(0 if request.echo else len(request.prompt))  # the streamed chunks' text_offset
        # An answer's entry is handed out once the text handed out reaches its token, so a token cut off with a
        # stop string (or held back as a stop string's start) is not listed, whole or streamed.
        starts, reach = [], TextOffsets()  # where each answer token starts in the answer's text
        given = {"entries": 0, "chars": 0, "echoed": not request.echo}
        # The end-of-text token the answer stopped at is listed after it with an echo, as OpenAI's completions list
        # "<|endoftext|>" (a harness scoring a prompt, echo and max_tokens 1, takes the last entry for the generated
        # token and the ones before it for the prompt's), and in POST /completion's completion_probabilities, as
        # llama-server lists every token it sampled there, the end-of-text token too (server-context.cpp
        # process_token adds it to generated_token_probs; send_final_response lists them all but a stop word's, and
        # a stream's partial result for it carries its entry): one entry per token of 'tokens' and tokens_predicted.
        # Ollama's runner leaves it out (request.end_probs false there).
        lists_end = request.echo or request.end_probs

        def settle(final: bool) -> list:
            """The answer's entries not handed out yet whose tokens start in the text handed out (all, at the
            answer's end: tokens that make no text)."""
            answer = recorder.answer
            starts.extend(reach([self._token_piece(entry.token) for entry in answer[len(starts):]]))
            upto = given["entries"]
            while upto < len(answer) and (final or starts[upto] < given["chars"]):
                upto += 1
            fresh, given["entries"] = answer[given["entries"]:upto], upto
            return fresh

        def hand_out(text: str) -> None:
            if not given["echoed"]:  # echo: the prompt (and its logprobs) before the first text
                given["echoed"] = True
                pieces.append(request.prompt)
                if on_text is not None:
                    on_text(request.prompt, logprobs_body(request, recorder.prompt_entries, self._token_piece, offsets)
                            if recorder else None)
            if text:
                pieces.append(text)
                answer.append(text)
                given["chars"] += len(text)
                if "\n" in text and slot is not None:
                    slot.has_new_line = True
                fresh = settle(final=False) if recorder else None
                send_ids()
                if on_text is not None:
                    on_text(text, None if fresh is None else logprobs_body(request, fresh, self._token_piece, offsets))

        # The answer's timings leave out the time the hook held its steps back (the thermal guard's pauses and
        # pacing), as the metrics' prefill and decode seconds do: the held time up to the first and last token.
        hook = _HeldTime(MetricsHook(self.metrics, self.hook, self.runtime.backend, self.prompt_cache), on_prefill,
                         len(ids))
        clock = {"start": time.perf_counter(), "first": None, "last": None, "held_first": 0.0, "held_last": 0.0}

        def on_token(token: int) -> None:
            nonlocal count
            count += 1
            if slot is not None:
                slot.decoded = count
            clock["last"], clock["held_last"] = time.perf_counter(), hook.held_s
            if clock["first"] is None:
                clock["first"], clock["held_first"] = clock["last"], clock["held_last"]
            sampled.append(token)
            unsent.append(token)
            handed = len(answer)
            hand_out(matcher.push(decoder.push(token)))
            if matcher.stopped:
                raise _StopString
            if limits.active:
                keep = limits.push("".join(answer[handed:]), time.perf_counter())
                if keep is not None:  # the answer ends here, cut before an under-indented line's text
                    text = "".join(answer)
                    del pieces[len(pieces) - len(answer):]
                    answer[:] = [text[:keep]]
                    pieces.append(text[:keep])
                    raise _LineLimit
            if client_gone is not None and client_gone():
                raise ClientGone("the client closed the connection mid-answer")
            self._check_stopping()

        def send_ids() -> None:
            """Hand ``on_ids`` the ids sampled since it was last called."""
            if on_ids is not None:
                on_ids(unsent[:])
                unsent.clear()

        def rest_ids() -> None:
            """The ids of tokens whose text was cut off or is none, in an event of their own (llama-server sends
            each token's partial result, its content "" for these)."""
            if on_ids is not None and unsent and on_text is not None:
                send_ids()
                on_text("", None)

        drafts = self._drafts(request)
        stats = GenerationStats()  # read after a stop string too, which ends generate() from on_token
        try:
            generate(self.runtime.backend, ids, sampling, tokenizer.eos_token_ids, on_token=on_token, hook=hook,
                     cache=self.prompt_cache, reuse_cache=request.cache_prompt, constraint=constraint,
                     logprobs=recorder, lookup=drafts, vocabulary=tokenizer, shift=shift, stats=stats)
            # A grammar completed by the limit's last token ends at the limit, as llama-server's and Ollama's do
            # (server-context.cpp process_token: the has_budget check stops the slot with STOP_TYPE_LIMIT before the
            # end-of-text token the grammar leaves is sampled, finish_reason "length"; Ollama's runner removes the
            # sequence at numPredict with DoneReasonLength): stop_type "limit", Anthropic's "max_tokens", Ollama's
            # done_reason "length". Below the limit the grammar's end is the end-of-text token's: "stop".
            completed = stats.stop_reason == "complete" and count < sampling.max_new_tokens
            finish = "stop" if stats.stop_reason == "eos" or completed else "length"
            if stats.stop_token is not None:  # llama-server samples it as any token and lists it with the answer's
                sampled.append(stats.stop_token)  # ids (``tokens``), though its text is not the answer's
                unsent.append(stats.stop_token)
                # its pick ends the generation time llama-server divides by n_decoded; where it was the first pick it
                # starts that time too (llama-server's t_start_generation is set at n_decoded 1), so the time the
                # hook held the prefill back (a thermal pause) is not taken for generation time
                clock["last"], clock["held_last"] = time.perf_counter(), hook.held_s
                if clock["first"] is None:
                    clock["first"], clock["held_first"] = clock["last"], clock["held_last"]
            # The end-of-text token is counted as llama-server's n_decoded and Ollama's numDecoded count it
            # (Completion.completion_tokens); a grammar that is complete allows nothing else, so llama-server
            # samples it there too, but only below the token limit: a grammar completed by the limit's last token
            # ends at the limit there (process_token's has_budget check stops the slot before another token is
            # sampled; Ollama's runner stops at numPredict alike), so the count never passes the limit asked for.
            ended = stats.stop_token is not None or completed
            hand_out(matcher.push(decoder.flush()))
            hand_out(matcher.flush())
            hand_out("")  # an echo whose answer made no text
            if matcher.stopped:
                finish = "stop"
                ended = ended and stats.stop_token is not None  # a stop string before a grammar's end
            elif recorder is not None:  # the entries of tokens that made no text, and the end-of-text token's
                rest = settle(final=True) + ([recorder.end] if lists_end and recorder.end is not None else [])
                if rest and on_text is not None:
                    send_ids()
                    on_text("", logprobs_body(request, rest, self._token_piece, offsets))
            if ended and stats.stop_token is None:
                # the end-of-text token a complete grammar leaves, which llama-server samples as any token (the
                # grammar sampler allows only end-of-generation tokens there: llama-grammar.cpp
                # llama_grammar_apply_impl), so it is counted in n_decoded and its id goes out in ``tokens`` as an
                # end-of-text token the model chose does; none is counted where the vocabulary has none
                end = self._end_token()
                ended = end is not None
                if ended:
                    self.metrics.picked(1)  # no step picked it: the metrics count it here, as the answer does
                    sampled.append(end)
                    unsent.append(end)
                    clock["last"], clock["held_last"] = time.perf_counter(), hook.held_s
            rest_ids()
            count += int(ended)
        except (_StopString, _LineLimit) as signal:  # _LineLimit: llama-server's stop_type limit, as the token limit
            finish = "stop" if isinstance(signal, _StopString) else "length"
            try:
                rest_ids()
            except BaseException as exc:
                self._failed(exc)
                raise
            self._end_early()
        except GrammarError as exc:  # the constraint's walk cap, met past the first token: the request's grammar
            self._failed(exc)
            raise _constraint_refusal(request, exc) from exc
        except BaseException as exc:
            self._failed(exc)
            raise
        self.metrics.finish(finish)
        cached = self.prompt_cache.reused if self.prompt_cache is not None else 0  # also for an answer cut short
        logprobs = None
        if recorder is not None:
            entries = (recorder.prompt_entries if request.echo else []) + recorder.answer[:given["entries"]]
            if lists_end and recorder.end is not None and not matcher.stopped:
                entries.append(recorder.end)
            logprobs = logprobs_body(request, entries, self._token_piece, 0 if request.echo else len(request.prompt))
        if clock["first"] is None:  # no answer token: all of it was the prompt's
            clock["first"], clock["held_first"] = time.perf_counter(), hook.held_s
        first = clock["first"]
        prompt_ms = (first - clock["start"] - clock["held_first"]) * 1e3
        predicted_ms = ((clock["last"] or first) - first - (clock["held_last"] - clock["held_first"])) * 1e3
        # at least 1 µs once a token was generated, as llama-server's t_token_generation (max(1, t - t_start) µs):
        # a one-token answer's generation time was 0, and a client's eval_count / eval_duration divided by it
        predicted_ms = max(predicted_ms, MIN_PREDICTED_MS) if count else 0.0
        return Completion("".join(pieces), finish, len(ids), count, cached, logprobs, matcher.matched,
                          prompt_ms=max(prompt_ms, 0.0), predicted_ms=predicted_ms,
                          draft_tokens=0 if drafts is None else drafts.drafted, draft_accepted=stats.draft_accepted,
                          context_shifts=stats.context_shifts, context_discarded=stats.context_discarded,
                          context_full=self._stopped_at_full_context(request, sampling, stats), tokens=sampled,
                          thermal_wait_ms=self._thermal_wait_ms(hook))

    def _thermal_wait_ms(self, hook: _HeldTime) -> float | None:
        """The milliseconds the thermal guard held the answer's steps back (Completion's ``thermal_wait_ms``); None
        where no guard runs (no hook, or a thermal hook that only records: ``--no-guard``, ``--telemetry`` alone)."""
        return hook.waited_s * 1e3 if getattr(self.hook, "guard", None) is not None else None

    def _end_token(self) -> int | None:
        """The end-of-text id a complete grammar's answer ends with: the vocabulary's EOS token where it ends
        generation (llama.cpp's ``llama_vocab_eos``), else the lowest end-of-generation id; None where there is none.
        Used where generate() picked none: without log-probabilities recorded (``n_probs``, ``logprobs``) it stops at a
        complete grammar without another decode (with them too where that step cannot be taken: no room left in the
        context, every end-of-text id banned), so the id is the vocabulary's, not the one of the end-of-generation
        tokens the model's logits would rank first; with them it otherwise picks the end-of-text token with one more
        step, and that id (``stats.stop_token``) is taken instead."""
        tokenizer = self.runtime.tokenizer
        ends = tokenizer.eos_token_ids
        eos = tokenizer.token_id(tokenizer.eos_token) if isinstance(tokenizer.eos_token, str) else None
        return eos if eos in ends else min(ends, default=None)

    def _token_piece(self, token: int) -> bytes:
        """A token's bytes, as the logprobs report them (a special token's name for one that has no text)."""
        table = self.runtime.tokenizer.token_bytes()
        piece = table[token] if 0 <= token < len(table) else None
        return piece if piece is not None else (self.runtime.tokenizer.tokenizer.id_to_token(token) or "").encode()

    def check_constraint(self, request: CompletionRequest) -> None:
        """Refuse what :meth:`complete` would refuse of the constraint ``request`` asks for (a grammar naming a token
        this vocabulary lacks, a tokenizer whose token bytes cannot be read), before anything runs: for an answer
        whose constraint applies only to a later pass (Ollama's ``format`` after a thinking model's thinking)."""
        self._constraint(request)

    def _constraint(self, request: CompletionRequest) -> TokenConstraint | None:
        """JSON mode's, the JSON schema's, the tools' or the grammar's constraint on the answer, if the
        request asks for one."""
        schema = request.tools.schema if request.tools is not None else request.json_schema
        if schema is None and not request.json_object and request.grammar is None:
            return None
        tokenizer = self.runtime.tokenizer
        try:
            token_bytes = tokenizer.token_bytes()
        except EdgeSDKError as exc:  # a tokenizer whose token bytes JSON mode cannot read
            param = "tools" if request.tools is not None else "grammar" if request.grammar else request.schema_param
            raise ApiError(400, exc.problem, param=param, code="unsupported_parameter") from exc
        if request.grammar is not None:
            try:
                return GrammarConstraint(token_bytes, request.grammar, tokenizer.eos_token_ids,
                                         token_id_of=tokenizer.token_id)
            except GrammarError as exc:  # a <token> this vocabulary does not hold, parses past the walk's cap
                raise _constraint_refusal(request, exc) from exc
        if schema is not None:
            constraint = SchemaConstraint(token_bytes, schema)
            if self.thinks_before_tools(request):  # the call (or answer) after the model's <think> block
                return ThinkingFirst(token_bytes, constraint, self.tools_think_opened(request))
            return constraint
        return JsonConstraint(token_bytes)

    def thinks_before_tools(self, request: CompletionRequest) -> bool:
        """Whether a chat answer under ``tools`` may think before its call (:class:`ThinkingFirst`): the chat
        template writes a ``<think>`` block, thinking is not rendered off (``enable_thinking`` false in the
        request's or the server's ``chat_template_kwargs``, ``serve --reasoning-budget 0``) and the reasoning is split
        off (not ``reasoning_format`` ``none``, which leaves the tools' constraint on the whole answer). Its reasoning
        comes back beside the call (edgesdk/serve/tools.py, :class:`~edgesdk.serve.tools.AnswerStream`)."""
        if not request.chat or request.tools is None or not template_thinks(self.runtime.tokenizer.template_source):
            return False
        if self.thinking_off(request):
            return False
        return (request.reasoning_format or self.defaults.reasoning_format) != "none"

    def tools_think_opened(self, request: CompletionRequest) -> bool | None:
        """Whether a chat answer under ``tools`` is its ``<think>`` block from its first character: it thinks before
        its call (:meth:`thinks_before_tools`) and the rendered prompt opened the block; None for a request without
        tools. The reader of the answer (:class:`~edgesdk.serve.tools.AnswerStream`'s ``opened``) and its
        constraint (:class:`ThinkingFirst`) both take it from here, so that what the constraint left free is never
        read as the call."""
        if request.tools is None:
            return None
        return self.thinks_before_tools(request) and prompt_opens_thinking(self.rendered_chat(request))

    def thinking_off(self, request: CompletionRequest) -> bool:
        """Whether the chat template renders thinking off: ``enable_thinking`` false in the request's or the
        server's ``chat_template_kwargs``, or ``serve --reasoning-budget 0`` where neither sets it."""
        given = {**self.runtime.tokenizer.template_kwargs, **(request.template_kwargs or {})}
        return given.get("enable_thinking", self.defaults.reasoning_budget != 0) is False

    def _failed(self, exc: BaseException) -> None:
        """An answer that ended in ``exc``: the hook told, and the metrics count it cancelled (the client left, the
        server stopping) or failed."""
        self._end_early()
        self._count_ended(exc)

    def _count_ended(self, exc: BaseException) -> None:
        """An answer that ended in ``exc``, counted in the metrics: cancelled where the client left (also a write that
        found its connection gone: a broken pipe, a reset) or the server stopped, else failed. Each answer that got
        its turn is counted once, whatever point it ended at, as its steps are."""
        cancelled = isinstance(exc, (ClientGone, ConnectionError)) or \
            (isinstance(exc, ApiError) and exc.code == "server_stopping")
        self.metrics.finish("cancelled" if cancelled else "error")

    def _end_early(self) -> None:
        """An answer cut short (stop string, client gone): the hook's end of request, which gives a
        capped clock back, as ``edgesdk run`` does when Ctrl-C stops an answer."""
        if self.hook is not None:
            self.hook.end(None)
