"""Several bundles behind one ``edgesdk serve``, one of them loaded at a time and swapped on demand.

A request names its model where its API puts it (``model``; Ollama's older ``name``), matched as Ollama matches a
model's name (:func:`ollama_key`: in any case, ``name``, ``name:latest`` and ``library/name`` alike); the model it
names is loaded if it is not, as Ollama's scheduler loads it (server/sched.go) and llama-server's router mode
(``--models-dir``) starts it. A board's memory holds one model, so, as Ollama on a small machine
(``OLLAMA_MAX_LOADED_MODELS=1``), the idle one is unloaded first: its :class:`~edgesdk.serve.completion.Completer`
closed (its prompt cache, the host copies of other conversations' KV caches and the backend's KV cache dropped, the
backend closed where it can be), then the other loaded. A line on stderr names both and the load's seconds.

Requests are answered one at a time in the order they came, whatever model they name (the board's one turn,
:class:`~edgesdk.serve.completion.FairTurn`, within a model): a request holds a :class:`Lease` on its model from
when its body is read until its answer is written (made, where Ollama's ``keep_alive`` 0 unloads the model with
it). A request for the loaded model is granted its lease at once while nothing waits for another; a request for
another model, and every request behind it, waits in this pool's queue, so a swap waits for the answer in progress
and the requests queued before it, and no request cuts in before one that came earlier. A request that names no model (or a route that names none: /tokenize, /props,
/slots) gets the model loaded when its turn comes.
Ollama's unload request (``keep_alive`` 0, nothing to generate) takes no turn: it is answered at once, and the model
goes once the answers holding it are written (:meth:`ModelPool.unload`).
An idle model goes as Ollama's scheduler expires its runner: once its last answer is written and nothing waits for it,
an unload is set for ``keep_alive`` later (the last request's, :meth:`ModelPool.release`, else the server's default:
OLLAMA_KEEP_ALIVE or llama-server's --sleep-idle-seconds; by default it is kept loaded), called off by a request for it
before then; /api/ps's ``expires_at`` is when it goes (:meth:`ModelPool.unload_at`). A default of 0 unloads a model
after each answer, not the first model at start, which stays loaded until its first answer. On a board that frees the model's
memory while nothing asks for it; the next request loads it again.

A model that fails to load is a 500 naming its bundle and the error; the server goes on answering for the others
(with nothing loaded until a request names one, as Ollama is after a failed load). A bundle that no longer reads
(removed from --models-dir, or its manifest or a file damaged, since the start: its files are verified against their
hashes first) is refused before the loaded model is unloaded,
which goes on answering, as Ollama answers a request for a model it no longer has without touching the one loaded.
The thermal guard's hook and the metrics are the server's, shared by every model's completer.

What describes a model without running it (Ollama's /api/show, a prompt's token count) reads the bundle's manifest
and tokenizer alone, as Ollama's show handler reads the model's files and loads nothing (server/routes.go,
``GetModelInfo``): :meth:`ModelPool.described` keeps these light pieces per bundle, and such a request neither
waits in the queue nor swaps the loaded model.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edgesdk.bundle import Bundle, read_manifest, verify_bundle
from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.session import Runtime, context_limit
from edgesdk.runtime.text import ChatTokenizer
from edgesdk.serve.api import ApiError, json_shown
from edgesdk.serve.completion import ClientGone, Completer, ServeDefaults, server_stopping

WAIT_POLL_S = 0.5  # how often a request waiting for its model asks whether its client left


@dataclass(frozen=True)
class ServedModel:
    """A bundle the server answers for: the name requests give, and the bundle, verified at start."""

    name: str
    bundle: Bundle


@dataclass(frozen=True)
class Lease:
    """A request's hold on its model, loaded: the completer that answers it, the model's served name, and the
    lease's place in the order leases were granted."""

    completer: Completer
    name: str
    number: int = 0


class GraphFacts:
    """The facts of a bundle's graph that a prompt is checked against (its context, its vocabulary), from the
    manifest, in place of a loaded backend: what a :func:`described` completer reads. It runs nothing. The context is
    the one the loaded model will hold: the server's ``-c N`` where it holds the bundle to less
    (:func:`edgesdk.runtime.session.context_limit`, as open_runtime caps the runtime it opens), so that /props and a
    refusal say the same of a model before it loads as after."""

    name = "none (not loaded)"
    built_context: int | None = None  # the bundle's context where -c holds the run to less (Runtime.cap_context's)

    def __init__(self, bundle: Bundle):
        graph = bundle.manifest["graph"]
        self.max_context, self.vocab_size = int(graph["max_context"]), int(graph["vocab_size"])
        limit = context_limit(bundle.path)
        if limit is not None and limit < self.max_context:
            self.built_context, self.max_context = self.max_context, limit


def described(bundle: Bundle, defaults: ServeDefaults, template_kwargs: dict | None) -> Completer:
    """A completer that describes ``bundle``'s model without loading it: its tokenizer and chat template opened from
    the bundle's files as :func:`edgesdk.runtime.session.open_runtime` opens them, its graph's facts from the
    manifest (:class:`GraphFacts`), no ONNX Runtime session. Its prompts' token ids and rendered chats, its
    ``/api/show`` and ``/props`` facts are the loaded model's; it generates nothing."""
    facts = bundle.manifest["tokenizer"]
    template = facts.get("chat_template")
    tokenizer = ChatTokenizer(bundle.file(facts["file"]), facts, bundle.file(template) if template else None)
    tokenizer.template_kwargs = template_kwargs or {}
    return Completer(Runtime(bundle=bundle, backend=GraphFacts(bundle), tokenizer=tokenizer), defaults)


OLLAMA_DEFAULTS = ("registry.ollama.ai", "library", "latest")  # types/model/name.go DefaultName: host, namespace, tag
MISSING_PART = "!MISSING!"  # a part a separator promised and the name left empty (Ollama's MissingPart): no default


def _cut_promised(text: str, separator: str) -> tuple[str, str, bool]:
    """``text`` cut at its last ``separator`` (Ollama's ``cutPromised``): the parts before and after it, each
    :data:`MISSING_PART` where empty, and whether it was there (``text`` and "" where not)."""
    before, found, after = text.rpartition(separator)
    if not found:
        return text, "", False
    return before or MISSING_PART, after or MISSING_PART, True


def ollama_key(name: str) -> str:
    """What Ollama compares of a model's name: the whole name (``host/namespace/model:tag``) case-folded
    (types/model/name.go ``Name.EqualFold``, which server/routes.go ``getExistingName`` matches a request's name
    with, so that ``Qwen`` finds ``qwen``), each part the name leaves out its default, as ``ParseName`` fills it
    (``qwen``, ``qwen:latest``, ``library/qwen`` and ``registry.ollama.ai/library/qwen:latest`` are one name). Two
    served names with one key are one name to an Ollama client."""
    rest, tag = name, ""
    if name.rfind(":") > name.rfind("/"):  # a colon before the last slash is a host's port, not a tag
        rest, tag, _ = _cut_promised(name, ":")
    host = namespace = ""
    rest, model, promised = _cut_promised(rest, "/")
    if not promised:
        model = rest
    else:
        rest, namespace, promised = _cut_promised(rest, "/")
        if not promised:
            namespace = rest
        else:  # what is left is the host, a scheme before it dropped (``https://host/namespace/model``)
            scheme, cut, after = rest.partition("://")
            host = after if cut else scheme
    default_host, default_namespace, default_tag = OLLAMA_DEFAULTS
    return f"{host or default_host}/{namespace or default_namespace}/{model}:{tag or default_tag}".casefold()


class _Waiter:
    """A place in the pool's queue: the model it waits for (None: whichever is loaded when its turn comes)."""

    def __init__(self, name: str | None):
        self.name = name


class ModelPool:
    """The served models, one loaded. ``load`` opens a model's completer (the CLI's settings, the shared thermal
    hook); ``loaded`` is the first model's, opened at start."""

    def __init__(self, models: Sequence[ServedModel], load: Callable[[ServedModel], Completer], loaded: Completer,
                 max_waiting: int | None = None, log: Callable[[str], None] | None = None,
                 describe: Callable[[ServedModel], Completer] | None = None, keep_alive_s: float = math.inf):
        if not models:
            raise EdgeSDKError("a model pool needs at least one model", "pass the bundles to serve")
        if not keep_alive_s >= 0:  # NaN too
            raise EdgeSDKError(f"a model pool's keep_alive is {keep_alive_s!r} seconds",
                               "give 0 or more seconds (math.inf: kept loaded)")
        self.models = {model.name: model for model in models}
        self._load = load
        # what describes a model without loading it (:func:`described`), made once per model on first use; by
        # default with the first model's settings (nothing here keeps its completer, which a swap gives back)
        settings, template_kwargs = loaded.defaults, loaded.runtime.tokenizer.template_kwargs
        self._describe = describe or (lambda model: described(model.bundle, settings, template_kwargs))
        self._described: dict[str, Completer] = {}
        self._describing = threading.Lock()
        self.metrics = loaded.metrics  # one set of counters for the server, whichever model answers
        self.hook = loaded.hook  # the thermal guard's, one per board
        self.max_waiting = loaded.defaults.max_waiting if max_waiting is None else max_waiting
        self._log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self._changed = threading.Condition(threading.Lock())
        self._queue: deque[_Waiter] = deque()
        self._holders = 0  # leases on the loaded model not yet released
        self._granted = 0  # leases granted so far: a lease's number is its place in that order
        self._unload_idle = False  # keep_alive 0 on an answer: unload the model once nobody holds it
        # the model a swap loads (None: no swap), from the turn of the request it loads for to that model's answer:
        # meanwhile nobody else is granted a lease
        self._loading: str | None = None
        # an unload request for the model being loaded: it goes once the answer it is loaded for is written
        self._unload_loaded = False
        self._name: str | None = models[0].name
        self._completer: Completer | None = loaded
        self.default = models[0].name  # the last model loaded: what a request naming none loads when none is
        self.stopping = False
        # Ollama's keep_alive: the server's default (OLLAMA_KEEP_ALIVE, llama-server's --sleep-idle-seconds; math.inf:
        # kept loaded), and the loaded model's, the last request's or else the default (Ollama's sessionDuration)
        self.keep_alive_s = keep_alive_s
        self._session_s = keep_alive_s
        self._expires: float | None = None  # when an idle unload is set for (time.time()), None: none is
        self._idle_timer: threading.Timer | None = None
        self._idle_set = 0  # which idle unload is the one set: a timer of an earlier one does nothing
        loaded.unload_at = self.unload_at  # what /api/ps reads (ollama.running)
        # nothing has asked for the first model yet: it goes once idle that long, as any other; with a keep_alive of
        # 0 (OLLAMA_KEEP_ALIVE=0: unload after each answer) it stays until its first answer, which unloads it: an
        # unload at start would contradict the start line that says it is loaded, and unload nothing an answer used
        if keep_alive_s > 0:
            self._idle()

    # ---------------------------------------------------------------------------------------------------- reads
    @property
    def loaded(self) -> tuple[str | None, Completer | None]:
        """The loaded model's name and completer (None, None while none is: during a swap, after an unload or a
        failed load), read together."""
        with self._changed:
            return self._name, self._completer

    @property
    def completer(self) -> Completer | None:
        return self.loaded[1]

    @property
    def loading(self) -> str | None:
        """The name of the model a swap is loading now (the idle one being unloaded, or the new one not yet
        answering), or None: what /health says beside the loaded model, which is none meanwhile."""
        with self._changed:
            return self._loading

    @property
    def state(self) -> tuple[str | None, Completer | None, str | None]:
        """The loaded model's name and completer and the name of the model a swap is loading (None: no swap), read
        together (:attr:`loaded` and :attr:`loading` read one after the other may straddle a swap's end)."""
        with self._changed:
            return self._name, self._completer, self._loading

    def unload_at(self) -> float | None:
        """When the loaded model goes unless a request for it comes first (``time.time()`` seconds; None: it is kept
        loaded, or none is loaded): ``keep_alive`` after the last answer ends, or, while a request holds it or waits
        for it, no earlier than that long from now. /api/ps's ``expires_at`` (:func:`edgesdk.serve.ollama.running`)."""
        with self._changed:
            if self._completer is None:
                return None
            if self._unload_idle:  # keep_alive 0, or an unload request: it goes as the answers holding it end
                return time.time()
            if math.isinf(self._session_s):
                return None
            return self._expires if self._expires is not None else time.time() + self._session_s

    def unload_pending(self, name: str) -> bool:
        """Whether served model ``name`` is loaded (or being loaded) with an unload pending: an unload request or
        ``keep_alive`` 0 came while an answer held it (it goes once nobody holds it) or while it loaded (it goes once
        the answer it loads for is written); a lease granted since calls it off."""
        with self._changed:
            if self._loading is not None:
                return self._loading == name and self._unload_loaded
            return self._name == name and self._completer is not None and self._unload_idle

    def held(self, name: str) -> bool:
        """Whether served model ``name`` is loaded and a request holds it now (its answer not yet written): that
        answer may still unload it as it ends (its ``keep_alive`` 0, or the server's default 0), which
        :meth:`unload_pending` cannot tell yet, as the answer's lease decides only once released (:meth:`release`)."""
        with self._changed:
            return self._loading is None and self._name == name and self._completer is not None and self._holders > 0

    @property
    def queued(self) -> int:
        """Requests waiting in the pool's queue for their model (not those in the loaded completer's)."""
        with self._changed:
            return len(self._queue)

    def described(self, name: str) -> Completer:
        """Served model ``name``'s :func:`described` completer (its tokenizer, chat template and settings; no
        session), loaded or not, made on first use and kept: no lease, no wait for the requests before it, no
        swap."""
        with self._describing:
            if name not in self._described:
                try:
                    self._described[name] = self._describe(self.models[name])
                except Exception as exc:  # a bundle removed or damaged since the start: named, as a failed load is
                    raise self._unusable(name, exc, "cannot be read")[1] from exc
            return self._described[name]

    def resolve(self, name: object, unknown: Callable[[str], ApiError], field: str = "model") -> str | None:
        """The served name a request's ``name`` means (None where it names none: the loaded model answers): the
        served name itself, or one Ollama takes for it (:func:`ollama_key`: in any case, ``name:latest`` for
        ``name`` and ``name`` for ``name:latest``); ``unknown(name)`` is the 404 raised for a name not served, in the
        request's API's words. ``field`` is the body's field the name came from, named in the 400 of a value that
        is no name (``model``, or Ollama's older ``name``)."""
        if name is None or name == "":
            return None
        if not isinstance(name, str):
            raise ApiError(400, f"{field!r} must be the name of a served model, got {json_shown(name)}: one of "
                           f"{', '.join(self.models)} (GET /v1/models lists them)", param=field)
        if name in self.models:
            return name
        # as Ollama's handlers find a model (server/routes.go: ``getExistingName`` compares each part of the name
        # with ``strings.EqualFold``; types/model/name.go: a name without a tag is ``name:latest``)
        matches = [served for served in self.models if ollama_key(served) == ollama_key(name)]
        if len(matches) == 1:
            return matches[0]
        raise unknown(name)

    # ---------------------------------------------------------------------------------------------------- leases
    def acquire(self, name: str | None, client_gone: Callable[[], bool] | None = None) -> Lease:
        """A lease on model ``name`` (a served name; None: the one loaded when the request's turn comes), loaded
        for it where it is not, once the requests before it have been answered. A 503 where ``max_waiting``
        requests wait already or the server stops; :class:`ClientGone` where the client leaves while it waits; a
        500 naming the bundle where the model fails to load. As a single bundle's queue counts them (the
        completer's ``max_waiting``), only requests waiting behind other work count against the limit: not the
        one whose model is being loaded, and none on a server with nothing to do. The limit is the server's, counted
        once: the requests waiting here and those holding a lease that wait in the loaded model's own queue for the
        one generating (:meth:`_waiting`)."""
        waiter = _Waiter(name)
        with self._changed:
            self._check_stopping()
            if not self._queue and self._loading is None and self._completer is not None and name in (None, self._name):
                return self._grant()
            waiting = self._waiting()
            if (waiting or self._loading is not None or self._holders) and waiting >= self.max_waiting:
                self.metrics.refuse_busy()
                raise ApiError(503, f"the server is busy ({self._busy_with()}): {waiting} request(s) already wait, "
                               f"the most --max-queue {self.max_waiting} lets wait; retry later (edgesdk serve "
                               "--max-queue raises the limit)", code="server_busy", kind="server_error")
            self._queue.append(waiter)
            try:
                wanted = self._wait_for_turn(waiter, client_gone)
                if wanted is None:  # the model is loaded: the lease is granted
                    self._queue.popleft()
                    self._changed.notify_all()
                    return self._grant()
                self._loading = wanted
            except BaseException:
                self._queue.remove(waiter)
                self._idle()  # it waited for the loaded model, which nobody may want now
                self._changed.notify_all()
                raise
        return self._swap_for(waiter, wanted)

    def release(self, lease: Lease, unload: bool = False, keep_alive: float | None = None) -> None:
        """The request is answered. ``keep_alive`` is its Ollama ``keep_alive`` in seconds (None: it gave none, the
        server's default holds; ``math.inf``: kept loaded; :func:`edgesdk.serve.ollama.keep_alive`): once nobody
        holds the model and no request waits for it, it is unloaded after that long idle, as Ollama's scheduler
        unloads a runner once its session duration has passed since its last request ended (server/sched.go); a
        request for it before then keeps it. With ``unload`` (``keep_alive`` 0) it goes at once then, as Ollama
        unloads such a model after the answer. A request for the model granted after this lease decides in its
        place (decided here, as the lease ends, and undone by a lease granted before the earlier holders are
        done), as a later request's keep_alive replaces an earlier one's in Ollama's scheduler."""
        with self._changed:
            self._holders -= 1
            if self._name == lease.name and self._granted == lease.number:  # granted none since: this one decides
                self._session_s = self.keep_alive_s if keep_alive is None else \
                    math.inf if keep_alive < 0 else keep_alive  # below 0: kept loaded, as Ollama keeps it
                # (an unload request made while it was held stands: :meth:`unload`)
                self._unload_idle = self._unload_idle or unload or self._session_s == 0
            if self._unload_idle and self._nobody_wants_loaded():
                self._unload_now("keep_alive 0")
            self._idle()
            self._changed.notify_all()

    def unload(self, name: str) -> None:
        """Ollama's unload request (nothing to generate, ``keep_alive`` 0), answered at once, as Ollama's handler
        answers it without a turn in the queue (server/routes.go: ``expireRunner``, then the "unload" answer): model
        ``name``, where it is loaded, is unloaded now if nobody holds it and no request waits for it, else once the
        answers holding it are written (server/sched.go: the runner's session ended, it goes when its last request
        does); a request for it granted before then keeps it, as a later request's keep_alive replaces the
        unload's. A model being loaded goes once the answer it is loaded for is written, as Ollama expires a runner
        still loading (its session duration 0: it goes when its first request ends). Nothing is loaded for a model
        that is not. Waiting behind an answer that streams, the request held its client until that answer ended
        (``ollama stop`` hung meanwhile), and a request for the same model behind it found the model closed and
        loaded it again. Nothing waits, so the client is not asked whether it is gone."""
        with self._changed:
            self._check_stopping()
            if self._loading == name:  # being loaded: it goes after the answer it is granted to (_swap_for)
                self._unload_loaded = True
                return
            if self._name != name or self._completer is None:
                return
            self._unload_idle = True
            if self._nobody_wants_loaded():
                self._unload_now("an unload request")
            self._changed.notify_all()

    def stop(self) -> None:
        """Take no more requests: those waiting for their model get a 503, and the loaded model's completer stops
        (:meth:`Completer.stop`)."""
        with self._changed:
            self.stopping = True
            completer = self._completer
            self._keep_now()
            self._changed.notify_all()
        if completer is not None:
            completer.stop()

    # ---------------------------------------------------------------------------------------------------- inside
    def _grant(self) -> Lease:
        self._holders += 1
        self._granted += 1
        self._unload_idle = False  # a request for the model since keeps it, as a later keep_alive does in Ollama
        self._keep_now()  # and its idle unload is off until the last answer holding it ends
        return Lease(self._completer, self._name, self._granted)

    def _idle(self) -> None:
        """Set the loaded model's idle unload (the lock held) where nobody wants it now and its ``keep_alive`` is
        finite: a timer that unloads it after that long, unless a request for it comes first (:meth:`_keep_now`).
        One already set stands: the model has been idle since then."""
        if self._expires is not None or self._completer is None or self.stopping or \
                math.isinf(self._session_s) or not self._nobody_wants_loaded():
            return
        self._idle_set += 1
        self._expires = time.time() + self._session_s
        timer = threading.Timer(self._session_s, self._idle_over, args=(self._idle_set,))
        timer.daemon = True  # a stopping server does not wait for it
        self._idle_timer = timer
        timer.start()

    def _keep_now(self) -> None:
        """Call off the idle unload set, if any (the lock held): a request came for the model, or it went."""
        self._idle_set += 1
        self._expires = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _idle_over(self, which: int) -> None:
        """The idle unload ``which``'s time came: the model goes if that unload still stands and nobody wants it."""
        with self._changed:
            if which != self._idle_set or self.stopping:
                return
            self._expires = self._idle_timer = None
            if self._nobody_wants_loaded() and self._completer is not None:
                self._unload_now(f"idle for its keep_alive of {self._session_s:g} s")
                self._changed.notify_all()

    def _nobody_wants_loaded(self) -> bool:
        """Whether the loaded model may be unloaded now (the lock held): nobody holds it, no swap is under way, and
        no request waits for it (or for whichever model is loaded)."""
        return self._holders == 0 and self._loading is None and \
            not any(waiter.name in (None, self._name) for waiter in self._queue)

    def _busy_with(self) -> str:
        """What keeps a new request from its lease (the lock held), for the 503 of a full queue: the model being
        loaded, the requests holding the loaded one, or (neither) those queued before it."""
        if self._loading is not None:
            return f"the model '{self._loading}' is being loaded"
        if self._holders:
            return f"{self._holders} request(s) hold the model '{self._name}'"
        return "the requests before it wait for their turn"

    def _waiting(self) -> int:
        """The requests waiting for their turn (the lock held): those in this pool's queue, less the one whose model
        is being loaded, and those the loaded model's completer holds in its own queue (their lease granted, the
        request before them generating)."""
        queued = len(self._queue) - int(self._loading is not None)  # the one being loaded for is not waiting
        return queued + (self._completer.waiting if self._completer is not None else 0)

    def _wait_for_turn(self, waiter: _Waiter, client_gone: Callable[[], bool] | None) -> str | None:
        """Wait (the lock held) until ``waiter`` is first in the queue and its model is loaded (None comes back), or
        the model loaded is another that nobody holds (the name of the model to load comes back). A waiter whose
        client left is asked once more as its turn comes (:class:`ClientGone`): woken by the answer before it, it
        was otherwise taken for there, and the model others were using was unloaded and its own loaded for nobody.
        Ollama's scheduler skips a pending request whose client left before it loads anything (server/sched.go
        ``processPending``: ``pending.ctx.Err() != nil``), as a completer's turn is not run for such a request."""
        while True:
            if self._queue[0] is waiter and self._loading is None:
                if self._completer is not None and waiter.name in (None, self._name):
                    self._check_client(client_gone)
                    return None
                if self._holders == 0:
                    self._check_client(client_gone)
                    return waiter.name or self.default
            self._wait(client_gone)

    @staticmethod
    def _check_client(client_gone: Callable[[], bool] | None) -> None:
        if client_gone is not None and client_gone():
            raise ClientGone("the client closed the connection while the request waited for its model")

    def _wait(self, client_gone: Callable[[], bool] | None) -> None:
        self._check_stopping()
        self._check_client(client_gone)
        self._changed.wait(WAIT_POLL_S if client_gone is not None else None)
        self._check_stopping()

    def _check_stopping(self) -> None:
        if self.stopping:
            raise server_stopping()

    def _unload_now(self, why: str) -> None:
        """Close the loaded model (the lock held, nobody holding it)."""
        name, completer = self._name, self._completer
        self._name, self._completer, self._unload_idle = None, None, False
        self._keep_now()
        if completer is not None:
            completer.close()
            self._log(f"edgesdk serve: unloaded {name} ({why})")

    def _unusable(self, name: str, exc: Exception, failed: str) -> tuple[str, ApiError]:
        """Why served model ``name``'s bundle could not be loaded or described (``exc``), and the 500 that names the
        model, its bundle, why and the fix. Where the bundle itself no longer reads (its directory removed, moved or
        half-replaced under --models-dir since the start, its manifest damaged), that is the why and the fix given,
        as :func:`edgesdk.bundle.read_manifest` words it, not the error of the file read first (a tokenizer.json
        "not a tokenizer.json" whose fix was to edit the manifest of a bundle that is gone)."""
        path = self.models[name].bundle.path
        try:
            read_manifest(path)
        except EdgeSDKError as gone:
            exc = gone
        except OSError:
            pass
        why = exc.problem if isinstance(exc, EdgeSDKError) else f"{type(exc).__name__}: {exc}"
        fix = exc.fix if isinstance(exc, EdgeSDKError) and exc.fix else \
            "check the bundle with 'edgesdk verify', or rebuild it with 'edgesdk build'"
        return why, ApiError(500, f"the model '{name}' (bundle {path}) {failed}: {why}; {fix}; the other models "
                             "served here still answer", code="model_load_failed", kind="server_error")

    def _swap_for(self, waiter: _Waiter, name: str) -> Lease:
        """Unload the idle model and load ``name`` for ``waiter``, first in the queue (``_loading`` set, so
        nobody else is granted a lease meanwhile), then grant it its lease. A bundle that no longer reads or whose
        files no longer match their hashes (removed, damaged or half-replaced since the start:
        :func:`edgesdk.bundle.verify_bundle`, which takes no memory beyond a read buffer) is refused before the idle
        model is unloaded, which goes on answering, as Ollama refuses a request for a model it no longer has
        without touching the one loaded; a bundle that fails as it loads leaves none loaded, as a failed load
        leaves Ollama's scheduler (the other was unloaded to make room)."""
        model = self.models[name]
        try:
            try:
                # one more hash pass over the bundle's files (the load's open_runtime verifies them again): a swap
                # reads its weights twice, so that a weight file damaged since the start is a 500 that leaves the
                # loaded model answering, not a board with no model loaded
                verify_bundle(model.bundle.path)
            except Exception as exc:
                why, failed = self._unusable(name, exc, "failed to load")
                self._log(f"edgesdk serve: loading {name} from {model.bundle.path} failed: {why}; "
                          f"{self._name or 'no model'} stays loaded")
                raise failed from exc
            with self._changed:
                old, completer = self._name, self._completer
                self._name, self._completer, self._unload_idle = None, None, False
                self._keep_now()
            if completer is not None:
                completer.close()
            started = time.monotonic()
            try:
                loaded = self._load(model)
            except Exception as exc:
                why, failed = self._unusable(name, exc, "failed to load")
                self._log(f"edgesdk serve: {f'unloaded {old}; ' if completer is not None else ''}loading {name} "
                          f"from {model.bundle.path} failed: {why}")
                raise failed from exc
            seconds = time.monotonic() - started
            loaded.metrics = self.metrics
            loaded.unload_at = self.unload_at  # what /api/ps reads (ollama.running)
            self._log(f"edgesdk serve: {f'unloaded {old}; ' if completer is not None else ''}loaded {name} "
                      f"in {seconds:.2f} s")
        except BaseException:
            with self._changed:
                self._loading, self._unload_loaded = None, False
                self._queue.remove(waiter)
                self._idle()  # a model kept (its bundle refused before the swap) goes once idle, as before it
                self._changed.notify_all()
            raise
        with self._changed:
            unload = self._unload_loaded  # an unload request came while it loaded
            self._loading, self._unload_loaded = None, False
            self._name, self._completer, self.default = name, loaded, name
            self._session_s = self.keep_alive_s  # its own keep_alive is its answers' to give
            self._queue.remove(waiter)
            self._changed.notify_all()
            if self.stopping:  # stopped while it loaded: this request and those after it get the 503
                loaded.stop()
                raise server_stopping()
            lease = self._grant()
            self._unload_idle = unload  # it goes once this answer is written, unless a request for it comes first
            return lease
