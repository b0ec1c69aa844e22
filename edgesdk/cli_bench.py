"""``edgesdk bench``: a bundle's prompt-processing and generation speed, as llama-bench reports them, with the
conditions the figures were taken under (registered in :mod:`edgesdk.cli`; the tests are
:mod:`edgesdk.runtime.bench`).

Importing this module imports click only; the runtime loads when the command runs.
"""

from __future__ import annotations

from pathlib import Path

import click

from edgesdk import __version__
from edgesdk.cli_llama import LLAMA_OPTION_NAMES, LlamaCommand, whole_number
from edgesdk.cli_options import echo_json, runtime_options

# llama-bench's -o / -oe formats (edgesdk.runtime.bench.LLAMA_BENCH_FORMATS, which is not imported here: numpy)
LLAMA_BENCH_FORMATS = ("none", "csv", "json", "jsonl", "md", "sql")
# llama-bench reads --delay with std::stoi, so it refuses more than INT_MAX seconds; a longer one here would end the run
# in Python's OverflowError from time.sleep (past about 292 years of nanoseconds) once the model had loaded
LLAMA_BENCH_MAX_DELAY = 2**31 - 1


class _CountList(click.ParamType):
    """A llama-bench list value of ``-p``, ``-n`` or ``-t`` (``128,256``, ``1-4``, ``1-8+2``, ``64-512*2``;
    :func:`edgesdk.runtime.bench.parse_int_range`), converted to its list of counts. ``threads``: a single
    count of 0 or below is the default thread count (None), as ``--threads`` takes it in run and serve
    (llama.cpp's ``-t -1``), and so is a 0 in a list."""

    name = "N[,N...]"

    def __init__(self, threads: bool = False):
        self.threads = threads

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        from edgesdk.runtime.bench import parse_int_range

        text = str(value).strip()
        if self.threads and whole_number(text) and int(text) <= 0:
            return [None]
        try:
            counts = parse_int_range(text)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if not counts:
            self.fail(f"{text!r} names no count (a range's first value is above its last): give FIRST-LAST with "
                      "FIRST <= LAST, e.g. 1-4", param, ctx)
        return [count or None for count in counts] if self.threads else counts


class _PromptGen(click.ParamType):
    """llama-bench's ``-pg PP,TG``: exactly two whole numbers >= 0 (tools/llama-bench/llama-bench.cpp: the value split
    at ',' must give two parts, each read by ``std::stoi``), a test of a PP-token prompt and TG generated tokens."""

    name = "PP,TG"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        parts = str(value).split(",")
        if len(parts) != 2 or not all(whole_number(part) and int(part) >= 0 for part in parts):
            self.fail(f"{value!r} is not PP,TG: give the prompt's tokens and the generated tokens, two whole numbers "
                      "separated by a comma, e.g. -pg 512,128", param, ctx)
        return int(parts[0]), int(parts[1])


def _listed(given: tuple[list, ...], default: list) -> list:
    """An option given once or more (llama-bench adds each one's values to the list), or its default."""
    return [value for values in given for value in values] if given else default


def _threads_list(command: click.Command) -> click.Command:
    """bench's ``-t/--threads`` from :func:`runtime_options` made llama-bench's list option: several thread counts
    (``-t 1,2,4``, ``-t 1-4``, ``-t 2 -t 4``) each run every test, where a second ``-t`` replaced the first."""
    for index, param in enumerate(command.params):
        if param.name == "threads":
            command.params[index] = click.Option(
                ["--threads", "-t"], type=_CountList(threads=True), multiple=True, metavar="N[,N...]",
                help="Intra-op threads [from the target profile, at most the usable cores; 0 or below: that "
                     "default]; several (llama-bench's -t 1,2,4, 1-4, 1-8+2, or -t given again) run every test "
                     "with each.")
    return command


def _models(bundle: Path | None, models: tuple[str, ...]) -> list[Path]:
    """The bundles to benchmark, one after another: BUNDLE, then each ``-m / --model`` in order. llama-bench's -m is
    given once or more, each value a comma-separated list of models (tools/llama-bench/llama-bench.cpp,
    ``parse_cmd_params``: ``string_split(argv[i], ',')``), and every test runs on each model in turn."""
    paths = [bundle] if bundle is not None else []
    paths += [Path(part) for value in models for part in value.split(",") if part]
    if not paths:
        raise click.UsageError("Missing argument 'BUNDLE': give the bundle's directory (or -m BUNDLE, as llama-bench "
                               "names its model; several are benchmarked one after another)")
    return paths


# llama-bench's -ngl 99, -fa 1, -mmp 0 and the like: accepted where they change nothing (cli_llama.LlamaCommand);
# '_' in a long option's name read as '-', as llama-bench's parse_cmd_params reads it (--no_warmup, --n_prompt)
@_threads_list
@click.command(cls=LlamaCommand, llama_bench=True, context_settings=LLAMA_OPTION_NAMES)
@click.argument("bundle", type=click.Path(path_type=Path), required=False)
@click.option("--model", "-m", "models", multiple=True, metavar="BUNDLE[,BUNDLE...]",
              help="A bundle to benchmark, as llama-bench's -m names its model; given again (or comma-separated) "
                   "the bundles are benchmarked one after another, each with every test.")
@click.option("--prompt-tokens", "--n-prompt", "-p", type=_CountList(), multiple=True, metavar="N[,N...]",
              help="Prompt length of the prompt-processing test (ppN); 0 skips it [default: 512]. Several, as "
                   "llama-bench's (128,256, 128-512*2, or -p given again), run a ppN test for each.")
@click.option("--new-tokens", "--n-gen", "-n", type=_CountList(), multiple=True, metavar="N[,N...]",
              help="Decode steps of the generation test (tgN); 0 skips it [default: 128]. Several run a tgN test "
                   "for each.")
@click.option("-pg", "prompt_gen", type=_PromptGen(), multiple=True, metavar="PP,TG",
              help="A test of a PP-token prompt and TG tokens generated after it, timed together (ppPP+tgTG, "
                   "(PP + TG) / seconds), as llama-bench's -pg; given again, several.")
@click.option("--repetitions", "-r", default=5, show_default=True, type=click.IntRange(min=1),
              help="Timed runs of each test, after one untimed warm-up.")
@click.option("--no-warmup", is_flag=True, help="Skip each test's untimed warm-up run (llama-bench's --no-warmup).")
@click.option("--delay", default=0, show_default=True, type=click.IntRange(0, LLAMA_BENCH_MAX_DELAY), metavar="SECONDS",
              help="Seconds to wait before each test, for the board to cool off (llama-bench's --delay).")
@click.option("--output", "-o", "output", type=click.Choice(LLAMA_BENCH_FORMATS), default=None,
              help="Print llama-bench's records to stdout in its format (csv, json, jsonl, md, sql; none: nothing), "
                   "its field names where they mean the same here; the conditions and warnings go to stderr then. "
                   "[default: edgesdk's table with the conditions]")
@click.option("--output-err", "-oe", "output_err", type=click.Choice(LLAMA_BENCH_FORMATS), default=None,
              help="Print llama-bench's records to stderr too, in this format (llama-bench's -oe).")
@click.option("--progress", is_flag=True, help="Say on stderr each test and run as it starts (llama-bench's "
                                                "--progress).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON, with the conditions (edgesdk's "
                                                      "form; -o json is llama-bench's).")
@runtime_options
def bench(bundle, models, prompt_tokens, new_tokens, prompt_gen, repetitions, no_warmup, delay, output, output_err, progress,
          as_json, threads, backend, target, ignore_target):
    """Prompt-processing (ppN) and generation (tgN) speed of a bundle here, as llama-bench reports them.

    Each test runs once untimed (unless --no-warmup), then --repetitions times; the table gives mean ± standard
    deviation of tok/s. -p, -n and -t take llama-bench's lists: each thread count runs a ppN test for each -p
    value, then a tgN test for each -n value; -m given again benchmarks several bundles one after another.
    -o csv|json|jsonl|md|sql prints llama-bench's records (build_commit, model_filename, model_type, n_prompt,
    n_gen, avg_ns, stddev_ns, avg_ts, stddev_ts, samples_ns, samples_ts, ...). Run nothing else heavy meanwhile:
    other work on the cores moves the figures.

    llama-bench's test parameters that change nothing here are accepted and said so on stderr (-ngl, -fa, -mmp,
    -nkvo, -b, -ub, -ctk / -ctv f16, ...); the others are refused by name.
    """
    import os
    import platform
    import time
    from dataclasses import replace

    from edgesdk.board import detect_board
    from edgesdk.bundle import Bundle, check_runnable, read_manifest
    from edgesdk.envinfo import package_version
    from edgesdk.runtime.bench import (
        BenchConfig,
        LlamaBenchPrinter,
        bench_model_facts,
        check_room,
        format_table,
        llama_bench_record,
        peak_rss_mib,
        run_bench,
    )
    from edgesdk.runtime.bench_conditions import cpu_times, during_tests, snapshot, summary, warnings
    from edgesdk.runtime.huge_pages import huge_pages_state
    from edgesdk.runtime.session import check_target, open_runtime

    paths = _models(bundle, models)
    if as_json and output is not None:
        raise click.UsageError(f"--json and -o {output} both say how to print the results: pass one (--json is "
                               "edgesdk's form with the conditions, -o llama-bench's)")
    if as_json and len(paths) > 1:
        raise click.BadParameter(f"prints one bundle's results, and {len(paths)} bundles are given: pass -o json or "
                                 "-o jsonl (each record names its model_filename), or one bundle", param_hint="'--json'")
    prompts, gens = _listed(prompt_tokens, [512]), _listed(new_tokens, [128])
    thread_counts = _listed(threads, [None])
    if not any(prompts) and not any(gens) and not any(pp or tg for pp, tg in prompt_gen):
        raise click.BadParameter(_no_test_message(prompts, gens, prompt_gen), param_hint="-p/-n/-pg")
    # llama-bench's order (get_cmd_params_instances): for each model and thread count, each -p test, then each -n test,
    # then each -pg test (PP,0 is ppPP and 0,TG tgTG there, as its test name says; 0,0 is skipped)
    configs = [BenchConfig(prompt_tokens=count, new_tokens=0, repetitions=repetitions, warmup=not no_warmup)
               for count in prompts if count] + \
              [BenchConfig(prompt_tokens=0, new_tokens=count, repetitions=repetitions, warmup=not no_warmup)
               for count in gens if count] + \
              [BenchConfig(prompt_tokens=pp, new_tokens=tg, repetitions=repetitions, warmup=not no_warmup,
                           combined=bool(pp and tg), from_pg=not (pp and tg)) for pp, tg in prompt_gen if pp or tg]
    # every test, thread count and bundle's target, checked before any model loads: a refusal of the second bundle or
    # thread count after the first one's tests had run threw those results away (the refusal names the bundle where
    # several are given)
    _check_thread_counts(thread_counts)
    for path in paths:
        manifest = read_manifest(Path(path))
        given = Bundle(Path(path), manifest)
        check_runnable(given)  # a fact missing is refused as run refuses it, not a KeyError
        check_target(given, target, ignore_target)
        max_context = manifest["graph"]["max_context"]
        for config in configs:
            check_room(config, max_context, str(path) if len(paths) > 1 else "")
    board = detect_board()
    build = f"edgesdk {__version__}"
    printers = [LlamaBenchPrinter(fmt, lambda text, err=err: click.echo(text, nl=False, err=err))
                for fmt, err in ((output, False), (output_err, True)) if fmt is not None]
    for printer in printers:
        printer.header()
    # -o: stdout holds llama-bench's records alone, and the rest goes to stderr
    say = (lambda text: click.echo(text, err=True)) if output is not None else click.echo
    count, index = len(paths) * len(thread_counts) * len(configs), 0
    results, opened, runtime, before, spans, loaded, gates = [], [], None, None, [], None, {}
    try:
        for path in paths:
            for threads_asked in thread_counts:
                runtime = None  # the previous sessions are let go before the next ones load
                # each bundle's notes (its backend, threads, target) name it where several are benchmarked, as run's
                # and serve's do where more than one bundle is open
                runtime = open_runtime(path, backend=backend, threads=threads_asked, expected_target=target,
                                       ignore_target=ignore_target, verbose=not as_json,
                                       name=str(path) if len(paths) > 1 else None)
                loaded = (runtime.bundle.bundle_id, runtime.backend.name, runtime.threads)
                opened.append(runtime.threads)
                facts = bench_model_facts(path, runtime.bundle.manifest, runtime.backend.name, build,
                                          cpu_info=_cpu_info(board))
                # a power-gated bundle's FFN skipping, of each bundle (-m given again: the second may be the gated one)
                gates.setdefault(str(path), getattr(runtime.backend, "gating", None))
                if before is None:
                    thermal = runtime.bundle.manifest["target"].get("thermal") or {}
                    zones, throttle_c = thermal.get("zones") or (), thermal.get("firmware_throttle_c")
                    before = snapshot(zones)
                for config in configs:
                    index += 1
                    test_index = index

                    def told(what: str, test_index: int = test_index) -> None:
                        click.echo(f"edgesdk bench: benchmark {test_index}/{count}: {what}", err=True)

                    if progress:
                        told("starting")
                    began = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # llama-bench's test_time
                    if delay:
                        time.sleep(delay)  # llama-bench: "cool off before the test"
                    start = cpu_times()  # the other work is counted over the tests alone, not over the --delay
                    done = run_bench(runtime, config, progress=told if progress else None)
                    spans.append((start, cpu_times()))
                    for result in (replace(result, started=began) for result in done):
                        results.append((path, runtime.backend.name, result, facts))
                        for printer in printers:
                            printer.test(llama_bench_record(result, facts))
        stopped = False
    except KeyboardInterrupt:
        if not results:
            raise
        stopped = True  # Ctrl-C: the tests that finished are printed, as llama-bench's rows printed as each ended
    runtime = None
    for printer in printers:
        printer.footer()
    after = {**snapshot(zones), "during_tests": during_tests(spans)}
    found = warnings(before, after, board.cpu_count or os.cpu_count() or 1, throttle_c)
    huge_pages = huge_pages_state()
    if as_json:
        conditions = {"board": {"model": board.model, "family": board.family, "jetpack": board.jetpack,
                                "cpu_count": board.cpu_count},
                      "versions": {"edgesdk": __version__, "python": platform.python_version(),
                                   "onnxruntime": package_version("onnxruntime", "onnxruntime-gpu")},
                      "huge_pages": huge_pages, "before": before, "after": after, "warnings": found}
        body = {"bundle": str(paths[0]), "bundle_id": loaded[0], "backend": loaded[1],
                "threads": opened[0] if len(opened) == 1 else opened,  # a -t list: each result's n_threads
                "power_gating": gates.get(str(paths[0])), "results": [result.to_json() for _, _, result, _ in results],
                "peak_rss_mib": _rounded_mib(peak_rss_mib()), "conditions": conditions}
        echo_json(body)
        _stop_if(stopped, len(results), count)
        return
    if output is None:  # edgesdk's table: each row names its bundle, its size and parameters, and its backend
        click.echo(format_table([result for _, _, result, _ in results], loaded[1], loaded[2],
                                _bundle_name(paths[0]), peak_rss_mib(),
                                rows=[(_bundle_name(path), name, facts["model_size"], facts["model_n_params"])
                                      for path, name, _, facts in results]))
    say(summary(before, after))
    for line in _gates_lines(gates, several=len(paths) > 1):
        say(line)
    say(_huge_pages_line(huge_pages))
    for warning in found:
        say(f"warning: {warning}")
    _stop_if(stopped, len(results), count)


def _check_thread_counts(thread_counts: list[int | None]) -> None:
    """Refuse a ``-t`` count past the runtime's bound (``MAX_THREADS``, as :func:`edgesdk.runtime.session.open_runtime`
    refuses it) before any model loads, rather than once the counts before it have run every test."""
    from edgesdk.runtime.ort_backend import MAX_THREADS

    over = [count for count in thread_counts if count is not None and count > MAX_THREADS]
    if over:
        raise click.BadParameter(f"{over[0]} threads is more than the runtime runs (at most {MAX_THREADS}): give "
                                 f"counts from 1 to {MAX_THREADS}, e.g. -t 1,2,4, or 0 for the profile's count",
                                 param_hint="'-t' / '--threads'")


def _stop_if(stopped: bool, finished: int, count: int) -> None:
    """After Ctrl-C stopped the tests and the finished ones were printed: say how many of them ran, and go on
    stopping (the command line exits 130)."""
    if stopped:
        click.echo(f"edgesdk bench: {finished} of {count} tests finished before Ctrl-C; the results printed are "
                   "theirs alone", err=True)
        raise KeyboardInterrupt


def _bundle_name(path: Path) -> str:
    """The name of the bundle's folder for the table's bundle column: ``.`` and ``..`` name the folder they stand for
    (``Path('.').name`` is empty), a link such as a deploy root's ``current`` keeps its own name (the path is made
    absolute without following links), and ``/`` is shown as given."""
    import os

    return Path(os.path.abspath(path)).name or str(path)


def _no_test_message(prompts: list[int], gens: list[int], prompt_gen: tuple[tuple[int, int], ...]) -> str:
    """Why no test is left: the values of -p, -n and -pg given, each 0 (a 0 skips its test), and the fix."""
    given = [f"-p {','.join(map(str, prompts))}", f"-n {','.join(map(str, gens))}"]
    given += [f"-pg {pp},{tg}" for pp, tg in prompt_gen]
    return (f"every test is off ({' '.join(given)}: a 0 skips its test); give -p or -n a count above 0, e.g. "
            "-p 512 -n 128, or -pg PP,TG with PP or TG above 0")


def _cpu_info(board) -> str:
    """llama-bench's ``cpu_info``: the CPU's name (:func:`edgesdk.board.read_cpu_model_name`: /proc/cpuinfo's
    "model name", as ggml's CPU device names itself, where the kernel gives one; else the cores', Cortex-A78AE),
    not the processor architecture (x86_64); the board's model where neither is known."""
    import platform

    return board.cpu_model_name or board.model or platform.processor() or platform.machine()


def _rounded_mib(value: float | None) -> float | None:
    """Peak RSS in MiB to one decimal for --json (None where the platform does not report it)."""
    return None if value is None else round(value, 1)


def _gates_lines(gates: dict[str, bool | None], several: bool) -> list[str]:
    """Whether each power-gated bundle's gates skipped FFN blocks during its tests (``gates``: each bundle's path and
    its backend's ``gating``, None where the bundle has no gates); the bundle named where ``several`` were
    benchmarked."""
    lines = []
    for path, gating in gates.items():
        if gating is None:
            continue
        state = "on" if gating else "off: every FFN block runs and no adapter scale acts (the loaded model)"
        lines.append(f"power gates of {path}: {state}" if several else f"power gates: {state}")
    return lines


def _huge_pages_line(state: dict) -> str:
    """Where the weights the tests streamed lay: on transparent huge pages or 4 KiB ones (runtime/huge_pages.py)."""
    used = state["anon_huge_pages_mib"]
    return (f"huge pages: {'unknown' if used is None else f'{used:g} MiB'} in use, THP "
            f"{state['transparent_huge_pages'] or 'unknown'}, glibc.malloc.hugetlb {state['glibc_hugetlb'] or 'unset'}")
