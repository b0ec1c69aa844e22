"""``GET /metrics`` of ``edgesdk serve --metrics``: counters in Prometheus' text format (0.0.4).

The counters and gauges follow llama-server's (``server_task_result_metrics::to_metrics`` in
tools/server/server-task.cpp: ``llamacpp:prompt_tokens_total``, ``prompt_seconds_total``,
``prompt_tokens_cached_total``, ``tokens_predicted_total``, ``tokens_predicted_seconds_total``, ``n_decode_total``,
``n_tokens_max``, ``prompt_tokens_seconds``, ``predicted_tokens_seconds``, ``requests_processing``,
``requests_deferred``, ``n_busy_slots_per_decode``) under the ``edgesdk_`` prefix, with what each counts: prompt
tokens are those prefilled, an embedding's included (llama-server counts every prompt token of a batch it decodes, an
embedding task's too: ``metrics_post_decode`` in tools/server/server-context.cpp), cached prompt tokens those the KV
cache held instead, predicted tokens every token the answer sampled (the prefill's first one included, and the
end-of-text token a complete grammar leaves, picked with no pass of its own), as many as the answer's
``tokens_predicted`` (llama-server adds each answer's ``n_decoded``), a decode is one pass of the backend (a
prefill, a decode step or an embedding's input), ``n_tokens_max`` the longest sequence (prompt and answer) the KV
cache held after a pass, as llama-server's is after each ``llama_decode`` (an embedding runs beside the KV cache and
leaves it as it was), and the two throughput gauges are the tokens per second since the previous scrape
(llama-server resets their window at each scrape). An embedding predicts no token and finishes no answer, so the
request counters leave it out; ``requests_processing`` counts it while it runs, as llama-server's processing slots do.
Each is counted as its step runs, so an answer counts whatever ended it: its last token, a stop string, the client
leaving, the server stopping; the time the guard held a step back is counted as the wait ends, also a wait that ended
the answer (a simulated board that never cooled). The board's temperature and the thermal guard's level and pause are
added (the level and pause only where a guard runs; between requests, those the temperature now gives, as
``/health`` reports them), which is what a fleet of boards needs watched. Step times are
the backend's compute (as ``edgesdk run --stats`` counts them), not the time the guard held a step back; that is
``edgesdk_thermal_wait_seconds_total``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

FINISH_REASONS = ("stop", "length", "cancelled", "error")
THERMAL_LEVELS = ("normal", "warm", "hot", "critical")


@dataclass
class ServeMetrics:
    """Counters, updated from the handler thread that generates and read by the one that renders."""

    prompt_tokens: int = 0
    prompt_cached_tokens: int = 0  # prompt tokens the KV cache held, not prefilled
    prompt_seconds: float = 0.0
    predicted_tokens: int = 0  # tokens generated, the prefill's first one included
    predicted_seconds: float = 0.0  # decode steps' compute
    thermal_wait_seconds: float = 0.0
    decodes: int = 0  # backend passes: prefills and decode steps (llama-server's n_decode_total)
    tokens_max: int = 0  # the longest sequence the KV cache held after a pass (llama-server's n_tokens_max)
    # Since the previous scrape, for the throughput gauges: [prompt tokens, prompt seconds, predicted tokens,
    # decode seconds]
    window: list = field(default_factory=lambda: [0, 0.0, 0, 0.0])
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    refused_busy: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def step(self, kind: str, prompt_tokens: int, tokens: int, compute_s: float, cached_tokens: int = 0,
             sequence: int = 0) -> None:
        """A pass of the backend: ``prompt_tokens`` prefilled after the ``cached_tokens`` the KV cache held (for a
        prefill), ``tokens`` picked, ``sequence`` tokens in the KV cache after it."""
        with self._lock:
            self.tokens_max = max(self.tokens_max, sequence)
            if kind == "prefill":
                self.prompt_tokens += prompt_tokens
                self.prompt_cached_tokens += cached_tokens
                self.prompt_seconds += compute_s
                self.window[0] += prompt_tokens
                self.window[1] += compute_s
            else:
                self.predicted_seconds += compute_s
                self.window[3] += compute_s
            self.predicted_tokens += tokens
            self.window[2] += tokens
            self.decodes += 1

    def picked(self, tokens: int) -> None:
        """``tokens`` the answer sampled without a backend pass: the end-of-text token a complete constraint leaves,
        which the answer counts (:class:`~edgesdk.serve.completion.Completion`'s ``completion_tokens``) as
        llama-server's ``n_decoded`` counts it, though no step picked it; counted where the answer appends it."""
        with self._lock:
            self.predicted_tokens += tokens
            self.window[2] += tokens

    def waited(self, seconds: float) -> None:
        """The thermal guard held a step back ``seconds``: counted once the wait ends, also when it ends in an error
        (a board that never cooled) and no step follows."""
        with self._lock:
            self.thermal_wait_seconds += seconds

    def finish(self, reason: str) -> None:
        with self._lock:
            self.finished[reason] = self.finished.get(reason, 0) + 1

    def refuse_busy(self) -> None:
        with self._lock:
            self.refused_busy += 1

    def render(self, processing: int, waiting: int, thermal: dict | None) -> str:
        """The exposition text; ``thermal`` is /health's thermal part (None without a guard). A scrape starts the
        throughput gauges' next window, as llama-server's does."""
        lines: list[str] = []
        metric = lambda *args: _metric(lines, *args)  # noqa: E731
        with self._lock:
            prompt_n, prompt_s, predicted_n, predicted_s = self.window
            self.window = [0, 0.0, 0, 0.0]
            metric("prompt_tokens_total", "counter", "Prompt tokens prefilled (embeddings' included; those the KV cache held excluded).",
                   [("", self.prompt_tokens)])
            metric("prompt_tokens_cached_total", "counter", "Prompt tokens taken from the KV cache, not prefilled.",
                   [("", self.prompt_cached_tokens)])
            metric("prompt_seconds_total", "counter", "Prefill compute time in seconds.", [("", self.prompt_seconds)])
            metric("tokens_predicted_total", "counter", "Tokens generated (the prefill's first one included).",
                   [("", self.predicted_tokens)])
            metric("tokens_predicted_seconds_total", "counter", "Decode compute time in seconds.",
                   [("", self.predicted_seconds)])
            metric("n_decode_total", "counter", "Backend passes (prefills and decode steps).", [("", self.decodes)])
            # A high-water mark, typed counter as llama-server types it (it never goes down).
            metric("n_tokens_max", "counter", "Longest sequence (prompt and answer) the KV cache held after a pass.",
                   [("", self.tokens_max)])
            metric("prompt_tokens_seconds", "gauge", "Prefill throughput in tokens/s since the previous scrape.",
                   [("", prompt_n / prompt_s if prompt_s > 0 else 0.0)])
            metric("predicted_tokens_seconds", "gauge", "Generation throughput in tokens/s since the previous scrape.",
                   [("", predicted_n / predicted_s if predicted_s > 0 else 0.0)])
            metric("n_busy_slots_per_decode", "gauge", "Requests in each backend pass, on average (one slot: 1).",
                   [("", 1.0 if self.decodes else 0.0)])
            metric("requests_finished_total", "counter", "Answers ended, by finish reason (cancelled: the "
                   "client left or the server stopped).",
                   [(f'{{finish_reason="{reason}"}}', count) for reason, count in self.finished.items()])
            metric("requests_refused_busy_total", "counter", "Requests refused with 503: the queue was full.",
                   [("", self.refused_busy)])
            metric("requests_processing", "gauge", "Requests generating or embedding now (0 or 1).", [("", processing)])
            metric("requests_deferred", "gauge", "Requests waiting for their turn.", [("", waiting)])
            metric("thermal_wait_seconds_total", "counter", "Time the thermal guard held steps back.",
                   [("", self.thermal_wait_seconds)])
        if thermal is not None:
            if thermal.get("temperature_c") is not None:
                metric("thermal_temperature_celsius", "gauge", "Board temperature last read.",
                       [("", thermal["temperature_c"])])
            # a board watched with no guard (--no-guard: /health's level "unguarded") has no level and no pause:
            # none is reported, rather than a level family with no current level
            if thermal["level"] in THERMAL_LEVELS:
                # between requests the level the reading now gives, not the last request's (http_server.thermal_health)
                metric("thermal_level", "gauge", "The guard's level (1 for the current one; between requests, the "
                       "level the board's temperature now gives).",
                       [(f'{{level="{level}"}}', int(thermal["level"] == level)) for level in THERMAL_LEVELS])
                metric("thermal_paused", "gauge", "1 while the guard pauses generation (between requests: while a "
                       "request starting now would wait for the board to cool).",
                       [("", int(thermal["paused"]))])
        return "\n".join(lines) + "\n"


def _metric(lines: list[str], name: str, kind: str, text: str, samples: list[tuple[str, float]]) -> None:
    """One metric family: its HELP and TYPE lines, then a sample per (labels, value)."""
    lines += [f"# HELP edgesdk_{name} {text}", f"# TYPE edgesdk_{name} {kind}",
              *(f"edgesdk_{name}{labels} {_number(value)}" for labels, value in samples)]


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))


class MetricsHook:
    """A StepHook that counts each step into :class:`ServeMetrics` and passes it on to the thermal hook.

    ``backend`` gives the KV cache's length after each pass, and ``cache`` (the server's
    :class:`~edgesdk.runtime.prompt_cache.PromptCache`, None without one) the prompt tokens it held: both
    :func:`~edgesdk.runtime.generate.generate` and a prefill-only request call :meth:`begin` once the cache has
    kept the prompt's prefix it serves."""

    def __init__(self, metrics: ServeMetrics, inner=None, backend=None, cache=None):
        self.metrics, self.inner, self.backend, self.cache = metrics, inner, backend, cache
        self.prompt_tokens = self.cached_tokens = 0
        self._step_prompt: int | None = None  # the coming prefill step's prompt tokens (prefill_chunk)
        self._cached_counted = False  # the request's cached tokens went with its first prefill step

    def begin(self, prompt_tokens: int, max_new_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = self.cache.reused if self.cache is not None else 0
        self._step_prompt, self._cached_counted = None, False
        if self.inner is not None:
            self.inner.begin(prompt_tokens, max_new_tokens)

    def prefill_chunk(self, prompt_left: int) -> int | None:
        """The inner hook's prefill step (the thermal guard's, :meth:`edgesdk.thermal.watch.ThermalHook.prefill_chunk`;
        None: the whole prompt in one step). Each step counts its own prompt tokens, and the cached ones are counted
        with the first, so a prompt prefilled in steps counts its tokens once, as llama-server counts a prompt it
        decodes in several batches; each step is a backend pass (``n_decode_total``), as each of llama-server's
        ``llama_decode`` calls is."""
        ask = getattr(self.inner, "prefill_chunk", None)
        step = ask(prompt_left) if ask is not None else None
        self._step_prompt = prompt_left if step is None else min(max(int(step), 1), prompt_left)
        return step

    def before_step(self, kind: str) -> float:
        """The inner hook's wait, counted as it ends: a wait the guard gave up on (the thermal watch's
        BoardNeverCooled, which ends the answer before its step) by the seconds the hook says it waited. A hook that
        returns None (a no-op one, which the StepHook protocol allows) waited 0 s, as generate counts it."""
        if self.inner is None:
            return 0.0
        try:
            waited = self.inner.before_step(kind) or 0.0
        except BaseException:
            self.metrics.waited(getattr(self.inner, "waited_s", None) or 0.0)
            raise
        self.metrics.waited(waited)
        return waited

    def after_step(self, kind: str, tokens: int, compute_s: float) -> None:
        sequence = self.backend.position if self.backend is not None else 0
        prompt = self.prompt_tokens if self._step_prompt is None else self._step_prompt
        cached = 0 if self._cached_counted else self.cached_tokens
        self.metrics.step(kind, prompt, tokens, compute_s, cached, sequence)
        if kind == "prefill":  # the prompt's cached tokens are counted with its first step only
            self._step_prompt, self._cached_counted = None, True
        if self.inner is not None:
            self.inner.after_step(kind, tokens, compute_s)

    def end(self, stats) -> None:
        """The answer's end, passed on to the inner hook. The end-of-text token a complete constraint leaves, which
        generate() took no step to pick, is counted where the answer counts it (edgesdk.serve.completion,
        :meth:`ServeMetrics.picked`)."""
        if self.inner is not None:
            self.inner.end(stats)
