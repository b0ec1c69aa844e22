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

``-pg P,N`` is llama-bench's combined test, ``ppP+tgN``: the P-token prompt prefilled from an empty cache and N
tokens generated after it (N decode steps after the prefill's token), timed together, (P + N) / seconds.

``-o`` / ``-oe`` print llama-bench's records in its formats (:class:`LlamaBenchPrinter`: csv, json, jsonl, md, sql),
with its field names where they mean the same here (:data:`LLAMA_BENCH_FIELDS`).

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
from edgesdk.weights_file import loaded_bytes

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
    # llama-bench's -pg P,N: one test (ppP+tgN), the P-token prompt prefilled and N tokens generated after it, timed
    # together, (P + N) / seconds (test_prompt then test_gen between t_start and t_ns in llama-bench.cpp)
    combined: bool = False
    # the test came from llama-bench's -pg P,N with P or N 0 (a lone ppP or tgN test, as llama-bench names it): a
    # refusal names -pg P,N, the option the user gave, instead of -p or -n
    from_pg: bool = False

    def __post_init__(self):
        if self.prompt_tokens < 0 or self.new_tokens < 0 or (self.prompt_tokens == 0 and self.new_tokens == 0):
            raise ValueError(f"prompt and new tokens must be >= 0 and not both 0, got {self.prompt_tokens} and "
                             f"{self.new_tokens}")
        if self.repetitions < 1:
            raise ValueError(f"repetitions must be >= 1, got {self.repetitions}")
        if self.combined and not (self.prompt_tokens and self.new_tokens):
            raise ValueError(f"a combined ppP+tgN test needs both P and N above 0, got {self.prompt_tokens} and "
                             f"{self.new_tokens}")


@dataclass(frozen=True)
class BenchResult:
    test: str  # "pp512", "tg128"
    tokens: int
    samples: tuple[float, ...]  # tok/s of each repetition
    seconds: tuple[float, ...] = ()  # the timed seconds of each repetition
    threads: int | None = None  # the intra-op threads the test ran with, where the caller records them
    started: str = ""  # when the test began, RFC 3339 UTC (llama-bench's test_time)

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
        prompt, gen = re.search(r"pp(\d+)", self.test), re.search(r"tg(\d+)", self.test)  # ppP, tgN, ppP+tgN
        nanoseconds = [round(s * 1e9) for s in self.seconds]
        body = {"test": self.test, "tokens": self.tokens, "tok_s": _finite(round(self.mean, 3)),
                "stdev": _finite(round(self.stdev, 3)), "samples": [_finite(round(s, 3)) for s in self.samples],
                "n_prompt": int(prompt.group(1)) if prompt else 0,
                "n_gen": int(gen.group(1)) if gen else 0,
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


# llama-bench's list item, first[-last[(+|*)step]] (tools/llama-bench/llama-bench.cpp, parse_int_range): ASCII digits
# alone, as its std::regex reads them (Python's \d also takes '５' or '٥', which int() reads as 5)
_RANGE_ITEM = re.compile(r"(\d+)(?:-(\d+)(?:([+*])(\d+))?)?", re.ASCII)


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


def _tests_sized(config: BenchConfig, max_context: int) -> list[tuple[str, int, str]]:
    """Each test of ``config``: its name, the positions it needs (the ppN prompt, tgN's steps after its one-token
    prompt, ppP+tgN's prompt and steps) and how to make it fit in ``max_context``."""
    prompt, gen = config.prompt_tokens, config.new_tokens
    if config.combined:
        return [(f"pp{prompt}+tg{gen}", prompt + gen, f"lower -pg {prompt},{gen} to PP + TG at most {max_context}")]
    if config.from_pg:  # -pg P,0 or -pg 0,N: the option the user gave
        prompt_fix = f"lower -pg {prompt},{gen} to PP at most {max_context}"
        gen_fix = f"lower -pg {prompt},{gen} to TG at most {max_context - 1}"
    else:
        prompt_fix = f"lower -p {prompt} to at most {max_context}"
        gen_fix = f"lower -n {gen} to at most {max_context - 1}"
    tests = [(f"pp{prompt}", prompt, prompt_fix)] if prompt else []
    if gen:
        tests.append((f"tg{gen}", gen + 1, f"{gen_fix} (tgN takes N + 1 positions: its one-token prompt, then N "
                                           "steps)"))
    return tests


def check_room(config: BenchConfig, max_context: int, bundle: str = "") -> None:
    """Refuse a test that needs more positions than ``max_context``, naming the test, its option and ``bundle`` (the
    bundle's path, where given: several may be benchmarked)."""
    for test, needed, fix in _tests_sized(config, max_context):
        if needed > max_context:
            where = f" {bundle}" if bundle else ""
            raise EdgeSDKError(f"the bench needs {needed} positions; the bundle{where}'s max_context is {max_context}, "
                               f"too few for the test {test}", fix)


def run_bench(runtime, config: BenchConfig = BenchConfig(), progress=None) -> list[BenchResult]:
    """The ppN and tgN results for the runtime's backend (see the module docstring). ``progress(what)``, where given,
    is told each run as it starts ("warmup prompt run", "prompt run 1/5", ...: llama-bench's --progress lines)."""
    backend, threads = runtime.backend, getattr(runtime, "threads", None)
    check_room(config, backend.max_context)
    results = []
    if config.combined:
        ids = prompt_ids(runtime.tokenizer, config.prompt_tokens)
        both = SamplingConfig(max_new_tokens=config.new_tokens + 1)  # the prefill's token, then N steps

        def both_s() -> float:
            backend.reset()
            _, stats = generate(backend, ids, both, stop_ids=set(), reuse_cache=False)
            return stats.prefill_s + stats.decode_s

        results.append(_repeat(f"pp{config.prompt_tokens}+tg{config.new_tokens}",
                               config.prompt_tokens + config.new_tokens, both_s, config, threads, progress,
                               "prompt+generation"))
        backend.reset()
        return results
    if config.prompt_tokens:
        ids = np.asarray(prompt_ids(runtime.tokenizer, config.prompt_tokens), np.int64)

        def prefill_s() -> float:
            backend.reset()
            start = time.perf_counter()
            backend.prefill(ids)
            return time.perf_counter() - start

        results.append(_repeat(f"pp{config.prompt_tokens}", config.prompt_tokens, prefill_s, config, threads,
                               progress, "prompt"))
    if config.new_tokens:
        first = prompt_ids(runtime.tokenizer, 1)
        sampling = SamplingConfig(max_new_tokens=config.new_tokens + 1)  # the prefill's token, then N steps

        def decode_s() -> float:
            _, stats = generate(backend, first, sampling, stop_ids=set())
            return stats.decode_s

        results.append(_repeat(f"tg{config.new_tokens}", config.new_tokens, decode_s, config, threads,
                               progress, "generation"))
    backend.reset()
    return results


def _repeat(test: str, tokens: int, timed, config: BenchConfig, threads: int | None = None, progress=None,
            kind: str = "") -> BenchResult:
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if config.warmup:
        if progress is not None:
            progress(f"warmup {kind} run")
        timed()
    samples, times = [], []
    for repetition in range(config.repetitions):
        if progress is not None:
            progress(f"{kind} run {repetition + 1}/{config.repetitions}")
        seconds = timed()
        times.append(seconds)
        samples.append(tokens / seconds if seconds > 0 else math.inf)
    return BenchResult(test, tokens, tuple(samples), tuple(times), threads, started)


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
                 peak_mib: float | None = None, rows: list[tuple] | None = None, size: int | None = None,
                 params: int | None = None) -> str:
    """A markdown table with llama-bench's columns (markdown_printer: model, size, params, backend, threads, test,
    t/s; the model named by its bundle), then the peak resident memory when known. ``size`` and ``params`` are the
    weights' bytes and the model's parameters (:func:`bench_model_facts`' model_size and model_n_params, "?" where
    unknown), shown as llama-bench shows them (135.00 M, 256.61 MiB); a result that records its threads (a ``-t``
    list) shows them, the others ``threads``. ``rows``: each result's (bundle, backend, size, params), where several
    bundles were benchmarked (llama-bench's -m given again), instead of ``bundle``, ``backend``, ``size`` and
    ``params``."""
    lines = ["| bundle | size | params | backend | threads | test | t/s |",
             "| --- | ---: | ---: | --- | ---: | ---: | ---: |"]
    for number, result in enumerate(results):
        shown = threads if result.threads is None else result.threads
        name, ran, weights, count = rows[number] if rows is not None else (bundle, backend, size, params)
        lines.append(f"| {name} | {size_label(weights)} | {params_label(count)} | {ran} | {shown} | {result.test} | "
                     f"{result.mean:.2f} ± {result.stdev:.2f} |")
    if peak_mib is not None:
        lines.append(f"\npeak RSS {peak_mib:.0f} MiB")
    return "\n".join(lines)


def size_label(size: int | None) -> str:
    """A model's size in bytes as llama-bench's markdown table shows it (markdown_printer: MiB below 1 GiB, else
    GiB, two decimals); "?" where unknown."""
    if size is None:
        return "?"
    return f"{size / 2**20:.2f} MiB" if size < 2**30 else f"{size / 2**30:.2f} GiB"


def params_label(params: int | None) -> str:
    """A model's parameter count as llama-bench's markdown table shows it (markdown_printer: M below 1e9, else B,
    two decimals); "?" where unknown."""
    if params is None:
        return "?"
    return f"{params / 1e6:.2f} M" if params < 1e9 else f"{params / 1e9:.2f} B"


# --- llama-bench's output formats (-o / -oe) -------------------------------------------------------------------------
#
# tools/llama-bench/llama-bench.cpp (ggml-org/llama.cpp): ``test::get_fields`` names each test's record, and the
# printers csv_printer, json_printer, jsonl_printer, markdown_printer and sql_printer write it. The fields here are
# those that mean the same for a bundle, in llama-bench's order; the ones that name llama.cpp's own knobs (n_batch,
# n_gpu_layers, type_k, split_mode, flash_attn, ...) are left out rather than filled with values that were not used.

LLAMA_BENCH_FORMATS = ("none", "csv", "json", "jsonl", "md", "sql")  # llama-bench's output_format_from_str
LLAMA_BENCH_FIELDS = ("build_commit", "cpu_info", "gpu_info", "backends", "model_filename", "model_type", "model_size",
                      "model_n_params", "n_threads", "n_prompt", "n_gen", "n_depth", "test_time", "avg_ns", "stddev_ns",
                      "avg_ts", "stddev_ts")
_INT_FIELDS = ("model_size", "model_n_params", "n_threads", "n_prompt", "n_gen", "n_depth", "avg_ns", "stddev_ns")
_FLOAT_FIELDS = ("avg_ts", "stddev_ts")


def bench_model_facts(bundle_path, manifest: dict, backend: str, build: str, cpu_info: str = "",
                      gpu_info: str = "") -> dict:
    """What llama-bench's record says of the tool and the model, for a bundle: ``model_filename`` the path given,
    ``model_type`` as llama_model_desc words it (architecture, size in parameters, the weights' type: here the
    bundle's recipe), ``model_size`` the bytes of the weights ``backend`` loads as they lie in memory: the graph and
    its external weights, or the block-sparse weights file for ``triton`` (an entropy-coded weights file counts its
    inflated bytes, ``graph.weights.bytes``, as llama-bench's model_size counts the tensors' bytes),
    ``model_n_params`` the model's parameters (None where the manifest does not say), ``backends`` the runtime
    backend that ran the tests, ``build_commit`` the tool's version."""
    model = manifest.get("model") or {}
    facts = model.get("after") or model.get("before") or {}
    params = facts.get("parameters")
    params = params if isinstance(params, int) and params > 0 else None
    graph = manifest.get("graph") or {}
    files = manifest.get("files") or {}
    sizes = [loaded_bytes(name, record.get("size"), graph.get("weights")) for name, record in files.items()
             if _loaded_by(backend, manifest, name) and isinstance(record, dict)]
    size = sum(sizes) if sizes and all(isinstance(value, int) for value in sizes) else None
    words = [facts.get("architecture") or "?"]
    if params is not None:
        words.append(_count_label(params))
    recipe = (manifest.get("recipe") or {}).get("name")
    if recipe:
        words.append(str(recipe))
    return {"build_commit": build, "cpu_info": cpu_info, "gpu_info": gpu_info, "backends": backend,
            "model_filename": str(bundle_path), "model_type": " ".join(words), "model_size": size,
            "model_n_params": params}


def _loaded_by(backend: str, manifest: dict, name: str) -> bool:
    """Whether ``backend`` loads the bundle file ``name`` as the model's weights: the ``triton`` backend runs the
    block-sparse weights file alone (``sparse.weights``, runtime/triton_backend.py), the others the ONNX graph and
    its external weights (``model.onnx``, ``model.onnx.data`` or its coded ``model.onnx.data.zlib``)."""
    sparse = manifest.get("sparse")
    if backend == "triton" and isinstance(sparse, dict) and sparse.get("weights"):
        return name == sparse["weights"]
    graph_file = (manifest.get("graph") or {}).get("file") or ""
    return bool(graph_file) and (name == graph_file or name.startswith(graph_file + "."))


_COUNT_UNITS = (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3))


def _count_label(params: int) -> str:
    """llama.cpp's size label of a model: 135M, 1.7B (llama_model_desc's ``type_name``, from the count), three
    significant digits; a count that rounds to 1000 of a unit is 1 of the next (999.6M is 1B, not 1e+03M)."""
    for index, (unit, scale) in enumerate(_COUNT_UNITS):
        if params >= scale:
            figure = float(f"{params / scale:.3g}")
            if figure >= 1000 and index > 0:  # the rounding carried: one of the next unit up
                unit, figure = _COUNT_UNITS[index - 1][0], figure / 1000
            return f"{figure:g}{unit}"
    return str(params)


def llama_bench_record(result: BenchResult, facts: dict) -> dict:
    """One test as llama-bench records it (``test::get_fields`` and ``get_values``, then ``samples_ns`` and
    ``samples_ts``): ``avg_ts`` / ``stddev_ts`` the mean and sample standard deviation of the repetitions'
    tokens / second, ``avg_ns`` / ``stddev_ns`` those of their nanoseconds. A figure that is not finite is None."""
    body = result.to_json()
    record = {**{field: facts.get(field) for field in LLAMA_BENCH_FIELDS[:8]},
              "n_threads": result.threads, "n_prompt": body["n_prompt"], "n_gen": body["n_gen"], "n_depth": 0,
              "test_time": result.started, "avg_ns": body.get("avg_ns"), "stddev_ns": body.get("stddev_ns"),
              "avg_ts": body["avg_ts"], "stddev_ts": body["stddev_ts"], "samples_ns": body.get("samples_ns", []),
              "samples_ts": body["samples_ts"]}
    return record


def _text(field: str, value) -> str:
    """A field's value as llama-bench's ``get_values`` writes it (``std::to_string``: a float with 6 decimals);
    unknown is empty."""
    if value is None:
        return ""
    if field in _FLOAT_FIELDS:
        return f"{value:f}"
    return str(value)


class LlamaBenchPrinter:
    """llama-bench's printer of ``fmt`` (csv, json, jsonl, md, sql; none prints nothing), writing through
    ``write(text)``: :meth:`header` before the tests, :meth:`test` as each ends, :meth:`footer` after, as
    llama-bench's ``print_header`` / ``print_test`` / ``print_footer`` (the JSON forms are one array, one object a
    line; the CSV quotes every value; the markdown table has llama-bench's columns and widths)."""

    # markdown_printer: its fields for a CPU backend and their widths (negative: left-aligned)
    MD_COLUMNS = (("model", -30), ("size", 10), ("params", 10), ("backend", -10), ("threads", 7), ("test", 15),
                  ("t/s", 20))

    def __init__(self, fmt: str, write):
        if fmt not in LLAMA_BENCH_FORMATS:
            raise ValueError(f"output format {fmt!r} is not one of llama-bench's: {', '.join(LLAMA_BENCH_FORMATS)}")
        self.fmt, self.write, self.count, self.build = fmt, write, 0, ""

    def header(self) -> None:
        if self.fmt == "csv":
            self.write(",".join(LLAMA_BENCH_FIELDS) + "\n")
        elif self.fmt == "json":
            self.write("[\n")
        elif self.fmt == "md":
            self.write("|" + "".join(f" {self._cell(name, width)} |" for name, width in self.MD_COLUMNS) + "\n")
            self.write("|" + "".join(f" {'-' * (abs(width) - 1)}{':' if width > 0 else '-'} |"
                                     for _, width in self.MD_COLUMNS) + "\n")
        elif self.fmt == "sql":
            kinds = {**{field: "INTEGER" for field in _INT_FIELDS}, **{field: "REAL" for field in _FLOAT_FIELDS}}
            self.write("CREATE TABLE IF NOT EXISTS llama_bench (\n" + ",\n".join(
                f"  {field} {kinds.get(field, 'TEXT')}" for field in LLAMA_BENCH_FIELDS) + "\n);\n\n")

    def test(self, record: dict) -> None:
        import json

        self.count += 1
        self.build = record.get("build_commit") or ""
        if self.fmt == "csv":
            self.write(",".join('"' + _text(field, record[field]).replace('"', '""') + '"'
                                for field in LLAMA_BENCH_FIELDS) + "\n")
        elif self.fmt == "json":
            body = json.dumps(record, indent=2, allow_nan=False)
            self.write(("" if self.count == 1 else ",\n") + "\n".join("  " + line for line in body.splitlines()))
        elif self.fmt == "jsonl":
            self.write(json.dumps(record, allow_nan=False) + "\n")
        elif self.fmt == "md":
            # llama-bench pads "±" (two bytes) one wider in bytes; Python pads characters, which is the same look
            self.write("|" + "".join(f" {self._cell(self._md_value(name, record), width)} |"
                                     for name, width in self.MD_COLUMNS) + "\n")
        elif self.fmt == "sql":
            values = ", ".join("'" + _text(field, record[field]).replace("'", "''") + "'" for field in LLAMA_BENCH_FIELDS)
            self.write(f"INSERT INTO llama_bench ({', '.join(LLAMA_BENCH_FIELDS)}) VALUES ({values});\n")

    def footer(self) -> None:
        if self.fmt == "json":
            self.write("\n]\n")
        elif self.fmt == "md":
            self.write(f"\nbuild: {self.build}\n")

    @staticmethod
    def _cell(value: str, width: int) -> str:
        return value.ljust(-width) if width < 0 else value.rjust(width)

    @staticmethod
    def _md_value(name: str, record: dict) -> str:
        if name == "model":
            return record["model_type"] or ""
        if name == "size":
            return size_label(record["model_size"])
        if name == "params":
            return params_label(record["model_n_params"])
        if name == "backend":
            return record["backends"] or ""
        if name == "threads":
            return _text(name, record["n_threads"])
        if name == "test":
            n_prompt, n_gen = record["n_prompt"], record["n_gen"]
            return f"pp{n_prompt}" if not n_gen else f"tg{n_gen}" if not n_prompt else f"pp{n_prompt}+tg{n_gen}"
        mean, stdev = record["avg_ts"], record["stddev_ts"]
        return f"{_number(mean)} ± {_number(stdev)}"


def _number(value: float | None) -> str:
    return "nan" if value is None else f"{value:.2f}"
