"""``edgesdk bench``: a bundle's prompt-processing and generation speed, as llama-bench reports them, with the
conditions the figures were taken under (registered in :mod:`edgesdk.cli`; the tests are
:mod:`edgesdk.runtime.bench`).

Importing this module imports click only; the runtime loads when the command runs.
"""

from __future__ import annotations

from pathlib import Path

import click

from edgesdk import __version__
from edgesdk.cli_llama import LlamaCommand
from edgesdk.cli_options import echo_json, runtime_options


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
        if self.threads and text.lstrip("-").isdigit() and int(text) <= 0:
            return [None]
        try:
            counts = parse_int_range(text)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if not counts:
            self.fail(f"{text!r} names no count (a range's first value is above its last): give FIRST-LAST with "
                      "FIRST <= LAST, e.g. 1-4", param, ctx)
        return [count or None for count in counts] if self.threads else counts


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


# llama-bench's -ngl 99, -fa 1, -mmp 0 and the like: accepted where they change nothing (cli_llama.LlamaCommand)
@_threads_list
@click.command(cls=LlamaCommand, llama_bench=True)
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--prompt-tokens", "-p", type=_CountList(), multiple=True, metavar="N[,N...]",
              help="Prompt length of the prompt-processing test (ppN); 0 skips it [default: 512]. Several, as "
                   "llama-bench's (128,256, 128-512*2, or -p given again), run a ppN test for each.")
@click.option("--new-tokens", "-n", type=_CountList(), multiple=True, metavar="N[,N...]",
              help="Decode steps of the generation test (tgN); 0 skips it [default: 128]. Several run a tgN test "
                   "for each.")
@click.option("--repetitions", "-r", default=5, show_default=True, type=click.IntRange(min=1),
              help="Timed runs of each test, after one untimed warm-up.")
@click.option("--no-warmup", is_flag=True, help="Skip each test's untimed warm-up run (llama-bench's --no-warmup).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@runtime_options
def bench(bundle, prompt_tokens, new_tokens, repetitions, no_warmup, as_json, threads, backend, target,
          ignore_target):
    """Prompt-processing (ppN) and generation (tgN) speed of a bundle here, as llama-bench reports them.

    Each test runs once untimed (unless --no-warmup), then --repetitions times; the table gives mean ± standard
    deviation of tok/s. -p, -n and -t take llama-bench's lists: each thread count runs a ppN test for each -p
    value, then a tgN test for each -n value. Run nothing else heavy meanwhile: other work on the cores moves the figures.

    llama-bench's test parameters that change nothing here are accepted and said so on stderr (-ngl, -fa, -mmp,
    -nkvo, -b, -ub, -ctk / -ctv f16, ...); the others are refused by name.
    """
    import os
    import platform

    from edgesdk.board import detect_board
    from edgesdk.bundle import read_manifest
    from edgesdk.envinfo import package_version
    from edgesdk.runtime.bench import BenchConfig, check_room, format_table, peak_rss_mib, run_bench
    from edgesdk.runtime.bench_conditions import snapshot, summary, warnings
    from edgesdk.runtime.huge_pages import huge_pages_state
    from edgesdk.runtime.session import open_runtime

    prompts, gens = _listed(prompt_tokens, [512]), _listed(new_tokens, [128])
    thread_counts = _listed(threads, [None])
    if not any(prompts) and not any(gens):
        raise click.BadParameter("both tests are off; give at least one of them tokens", param_hint="-p/-n")
    # the longest of each test, checked before the model loads
    check_room(BenchConfig(prompt_tokens=max(prompts), new_tokens=max(gens)),
               read_manifest(Path(bundle))["graph"]["max_context"])
    # llama-bench's order (get_cmd_params_instances): for each thread count, each -p test, then each -n test
    configs = [BenchConfig(prompt_tokens=count, new_tokens=0, repetitions=repetitions, warmup=not no_warmup)
               for count in prompts if count] + \
              [BenchConfig(prompt_tokens=0, new_tokens=count, repetitions=repetitions, warmup=not no_warmup)
               for count in gens if count]
    results, opened, runtime, before = [], [], None, None
    for count in thread_counts:
        del runtime  # the previous thread count's sessions are let go before the next ones load
        runtime = open_runtime(bundle, backend=backend, threads=count, expected_target=target,
                               ignore_target=ignore_target, verbose=not as_json)
        opened.append(runtime.threads)
        if before is None:
            gating = getattr(runtime.backend, "gating", None)  # a power-gated bundle's FFN skipping (off unless asked)
            thermal = runtime.bundle.manifest["target"].get("thermal") or {}
            zones, throttle_c = thermal.get("zones") or (), thermal.get("firmware_throttle_c")
            before = snapshot(zones)
        for config in configs:
            results += run_bench(runtime, config)
    after = snapshot(zones)
    board = detect_board()
    found = warnings(before, after, board.cpu_count or os.cpu_count() or 1, throttle_c)
    huge_pages = huge_pages_state()
    if as_json:
        conditions = {"board": {"model": board.model, "family": board.family, "jetpack": board.jetpack,
                                "cpu_count": board.cpu_count},
                      "versions": {"edgesdk": __version__, "python": platform.python_version(),
                                   "onnxruntime": package_version("onnxruntime", "onnxruntime-gpu")},
                      "huge_pages": huge_pages, "before": before, "after": after, "warnings": found}
        body = {"bundle": str(bundle), "bundle_id": runtime.bundle.bundle_id, "backend": runtime.backend.name,
                "threads": opened[0] if len(opened) == 1 else opened,  # a -t list: each result's n_threads
                "power_gating": gating, "results": [result.to_json() for result in results],
                "peak_rss_mib": _rounded_mib(peak_rss_mib()), "conditions": conditions}
        echo_json(body)
        return
    click.echo(format_table(results, runtime.backend.name, runtime.threads, Path(bundle).name, peak_rss_mib()))
    click.echo(summary(before, after))
    if gating is not None:
        click.echo(f"power gates: {'on' if gating else 'off: every FFN block runs and no adapter scale acts (the loaded model)'}")
    click.echo(_huge_pages_line(huge_pages))
    for warning in found:
        click.echo(f"warning: {warning}")


def _rounded_mib(value: float | None) -> float | None:
    """Peak RSS in MiB to one decimal for --json (None where the platform does not report it)."""
    return None if value is None else round(value, 1)


def _huge_pages_line(state: dict) -> str:
    """Where the weights the tests streamed lay: on transparent huge pages or 4 KiB ones (runtime/huge_pages.py)."""
    used = state["anon_huge_pages_mib"]
    return (f"huge pages: {'unknown' if used is None else f'{used:g} MiB'} in use, THP "
            f"{state['transparent_huge_pages'] or 'unknown'}, glibc.malloc.hugetlb {state['glibc_hugetlb'] or 'unset'}")
