"""Prompt-processing and generation speed of a bundle on this board, as ``llama-bench`` measures it.

Two tests, each repeated after one untimed warm-up run:

* ``ppN``: prefill of an N-token prompt from an empty cache, N / seconds;
* ``tgN``: N decode steps after a one-token prompt, N / seconds of those steps, greedy, with no
  stop token so every repetition decodes all N (the generation loop of ``edgesdk run``, sampling
  included).

Results are the mean and sample standard deviation (0 for one repetition) of the repetitions' tok/s,
not total tokens over total time, as llama-bench computes ``avg_ts`` and ``stddev_ts``
(ggml-org/llama.cpp, ``tools/llama-bench/llama-bench.cpp``: ``get_ts``, ``avg``, ``stdev``). Where
it differs from llama-bench:

* the prompt is real text (a fixed English paragraph, repeated to length, no BOS), where llama-bench
  feeds random ids after a BOS: a tokenizer's rare tokens are no faster or slower, but real text is
  what a board sees;
* llama-bench's ``test_gen`` decodes its N tokens from an empty cache (the first one BOS, each next
  one a random id, no sampler); here the one-token prompt is prefilled untimed and the N timed steps
  follow it, each picking its token greedily, so tgN needs N + 1 positions of the context;
* llama-bench warms a tg test up with a single decode step; here the warm-up is a whole tgN run (a
  ppN test's warm-up is the whole prompt in both).

``-p``, ``-n`` and ``-t`` take llama-bench's value lists (:func:`parse_int_range`: ``128,256``, ranges
``1-4``, ``1-8+2``, ``64-512*2``, and the option given again adds its values): each thread count runs
a ppN test for each ``-p`` value, then a tgN test for each ``-n`` value, in llama-bench's order
(``get_cmd_params_instances``); ``--no-warmup`` skips the warm-up runs as llama-bench's does.

``--json`` carries llama-bench's per-test figures under its names (``n_prompt``, ``n_gen``, ``n_depth``,
``avg_ns``, ``stddev_ns``, ``avg_ts``, ``stddev_ts``, ``samples_ns``, ``samples_ts``, and ``n_threads`` where
known) beside
edgesdk's own (``test``, ``tokens``, ``tok_s``, ``stdev``, ``samples``).
"""

from __future__ import annotations

import math
import re
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.generate import SamplingConfig, generate

PROMPT_TEXT = (
    "Small language models run on boards at the edge of a network, where power, memory and heat are "
    "scarce. A runtime that reads fewer bytes per token decodes faster, and one that watches the "
    "temperature keeps the board from throttling in the middle of an answer. "
)


@dataclass(frozen=True)
class BenchConfig:
    """What to measure; 0 tokens skips that test."""

    prompt_tokens: int = 512  # llama-bench's default -p
    new_tokens: int = 128  # llama-bench's default -n
    repetitions: int = 5  # llama-bench's default -r
    warmup: bool = True

    def __post_init__(self):
        if self.prompt_tokens < 0 or self.new_tokens < 0 or (self.prompt_tokens == 0 and self.new_tokens == 0):
            raise ValueError(f"prompt and new tokens must be >= 0 and not both 0, got {self.prompt_tokens} and "
                             f"{self.new_tokens}")
        if self.repetitions < 1:
            raise ValueError(f"repetitions must be >= 1, got {self.repetitions}")


@dataclass(frozen=True)
class BenchResult:
    test: str  # "pp512", "tg128"
    tokens: int
    samples: tuple[float, ...]  # tok/s of each repetition
    seconds: tuple[float, ...] = ()  # the timed seconds of each repetition
    threads: int | None = None  # the intra-op threads the test ran with, where the caller records them

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples)

    @property
    def stdev(self) -> float:
        """Sample standard deviation; 0 for one repetition (llama-bench's ``stdev``), NaN where a repetition's
        rate is not finite (one too short for the clock to time), which ``statistics.stdev`` cannot take."""
        if len(self.samples) < 2:
            return 0.0
        if not all(math.isfinite(sample) for sample in self.samples):
            return math.nan
        return statistics.stdev(self.samples)

    def to_json(self) -> dict:
        """edgesdk's figures, then llama-bench's per-test fields under its names; a figure that is not finite is
        None (JSON has no infinity or NaN)."""
        test_kind = "pp" if self.test.startswith("pp") else "tg"
        nanoseconds = [round(s * 1e9) for s in self.seconds]
        body = {"test": self.test, "tokens": self.tokens, "tok_s": _finite(round(self.mean, 3)),
                "stdev": _finite(round(self.stdev, 3)), "samples": [_finite(round(s, 3)) for s in self.samples],
                "n_prompt": self.tokens if test_kind == "pp" else 0,
                "n_gen": self.tokens if test_kind == "tg" else 0,
                "n_depth": 0,  # llama-bench's -d: tokens in the cache before the test; each test here starts empty
                "avg_ts": _finite(self.mean), "stddev_ts": _finite(self.stdev),
                "samples_ts": [_finite(s) for s in self.samples]}
        if self.threads is not None:
            body["n_threads"] = self.threads
        if nanoseconds:
            body.update(avg_ns=round(statistics.fmean(nanoseconds)),
                        stddev_ns=round(statistics.stdev(nanoseconds)) if len(nanoseconds) > 1 else 0,
                        samples_ns=nanoseconds)
        return body


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


# llama-bench's list item, first[-last[(+|*)step]] (tools/llama-bench/llama-bench.cpp, parse_int_range)
_RANGE_ITEM = re.compile(r"(\d+)(?:-(\d+)(?:([+*])(\d+))?)?")


def parse_int_range(text: str) -> list[int]:
    """The values of one llama-bench list option (``-p``, ``-n``, ``-t``), as llama-bench's ``parse_int_range``
    reads them: comma-separated items, each ``first``, ``first-last`` (step 1), ``first-last+step`` or
    ``first-last*mult``, every value from first up to last; ``8-1`` gives nothing, as there. A malformed list, or a
    step that does not move forward (``1-8+0``, ``0-8*2``), raises ValueError naming the item, where llama-bench
    throws "invalid range format" / "invalid range"."""
    values: list[int] = []
    items = text.split(",")
    for item in items[:-1] if len(items) > 1 and not items[-1] else items:  # "16," is 16 there too
        match = _RANGE_ITEM.fullmatch(item.strip())
        if match is None:
            raise ValueError(f"{item!r} in {text!r} is not a count or range; llama-bench's forms are N, N,M, "
                             "FIRST-LAST, FIRST-LAST+STEP and FIRST-LAST*MULT, e.g. 128,256 or 1-8+1 or 64-512*2")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) else first
        op, step = match.group(3) or "+", int(match.group(4)) if match.group(4) else 1
        value = first
        while value <= last:
            values.append(value)
            following = value + step if op == "+" else value * step
            if following <= value:
                raise ValueError(f"the range {item!r} in {text!r} does not move forward (step {op}{step} from "
                                 f"{value}); give a step of at least 1, or a multiplier of at least 2 from 1 up")
            value = following
    return values


def prompt_ids(tokenizer, count: int) -> list[int]:
    """``count`` token ids of real text (the paragraph repeated as often as needed)."""
    ids: list[int] = []
    piece = tokenizer.encode(PROMPT_TEXT, add_special_tokens=False)
    while len(ids) < count:
        ids += piece
    return ids[:count]


def check_room(config: BenchConfig, max_context: int) -> None:
    """Refuse tests that need more positions than ``max_context`` (the ppN prompt, or tgN's steps after one token)."""
    needed = max(config.prompt_tokens, config.new_tokens + 1)
    if needed > max_context:
        raise EdgeSDKError(f"the bench needs {needed} positions; the bundle's max_context is {max_context}",
                           f"lower -p / -n to at most {max_context} prompt tokens and {max_context - 1} new tokens")


def run_bench(runtime, config: BenchConfig = BenchConfig()) -> list[BenchResult]:
    """The ppN and tgN results for the runtime's backend (see the module docstring)."""
    backend, threads = runtime.backend, getattr(runtime, "threads", None)
    check_room(config, backend.max_context)
    results = []
    if config.prompt_tokens:
        ids = np.asarray(prompt_ids(runtime.tokenizer, config.prompt_tokens), np.int64)

        def prefill_s() -> float:
            backend.reset()
            start = time.perf_counter()
            backend.prefill(ids)
            return time.perf_counter() - start

        results.append(_repeat(f"pp{config.prompt_tokens}", config.prompt_tokens, prefill_s, config, threads))
    if config.new_tokens:
        first = prompt_ids(runtime.tokenizer, 1)
        sampling = SamplingConfig(max_new_tokens=config.new_tokens + 1)  # the prefill's token, then N steps

        def decode_s() -> float:
            _, stats = generate(backend, first, sampling, stop_ids=set())
            return stats.decode_s

        results.append(_repeat(f"tg{config.new_tokens}", config.new_tokens, decode_s, config, threads))
    backend.reset()
    return results


def _repeat(test: str, tokens: int, timed, config: BenchConfig, threads: int | None = None) -> BenchResult:
    if config.warmup:
        timed()
    samples, times = [], []
    for _ in range(config.repetitions):
        seconds = timed()
        times.append(seconds)
        samples.append(tokens / seconds if seconds > 0 else math.inf)
    return BenchResult(test, tokens, tuple(samples), tuple(times), threads)


def peak_rss_mib() -> float | None:
    """This process's peak resident memory so far in MiB (the weights, ONNX Runtime's arenas, the KV
    cache and Python), from ``getrusage``; None where the platform has no ``resource`` module."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def format_table(results: list[BenchResult], backend: str, threads: int, bundle: str,
                 peak_mib: float | None = None) -> str:
    """A markdown table like llama-bench's, then the peak resident memory when known; a result that records its
    threads (a ``-t`` list) shows them, the others ``threads``."""
    lines = ["| bundle | backend | threads | test | t/s |", "| --- | --- | ---: | ---: | ---: |"]
    for result in results:
        shown = threads if result.threads is None else result.threads
        lines.append(f"| {bundle} | {backend} | {shown} | {result.test} | "
                     f"{result.mean:.2f} ± {result.stdev:.2f} |")
    if peak_mib is not None:
        lines.append(f"\npeak RSS {peak_mib:.0f} MiB")
    return "\n".join(lines)
