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


# llama-bench's -ngl 99, -fa 1, -mmp 0 and the like: accepted where they change nothing (cli_llama.LlamaCommand)
@click.command(cls=LlamaCommand, llama_bench=True)
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--prompt-tokens", "-p", default=512, show_default=True, type=click.IntRange(min=0),
              help="Prompt length of the prompt-processing test (ppN); 0 skips it.")
@click.option("--new-tokens", "-n", default=128, show_default=True, type=click.IntRange(min=0),
              help="Decode steps of the generation test (tgN); 0 skips it.")
@click.option("--repetitions", "-r", default=5, show_default=True, type=click.IntRange(min=1),
              help="Timed runs of each test, after one untimed warm-up.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@runtime_options
def bench(bundle, prompt_tokens, new_tokens, repetitions, as_json, threads, backend, target, ignore_target):
    """Prompt-processing (ppN) and generation (tgN) speed of a bundle here, as llama-bench reports them.

    Each test runs once untimed, then --repetitions times; the table gives mean ± standard
    deviation of tok/s. Run nothing else heavy meanwhile: other work on the cores moves the figures.

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

    if prompt_tokens == 0 and new_tokens == 0:
        raise click.BadParameter("both tests are off; give at least one of them tokens", param_hint="-p/-n")
    config = BenchConfig(prompt_tokens=prompt_tokens, new_tokens=new_tokens, repetitions=repetitions)
    check_room(config, read_manifest(Path(bundle))["graph"]["max_context"])  # before the model loads
    runtime = open_runtime(bundle, backend=backend, threads=threads, expected_target=target,
                           ignore_target=ignore_target, verbose=not as_json)
    gating = getattr(runtime.backend, "gating", None)  # a power-gated bundle's FFN skipping (off unless asked)
    thermal = runtime.bundle.manifest["target"].get("thermal") or {}
    zones, throttle_c = thermal.get("zones") or (), thermal.get("firmware_throttle_c")
    before = snapshot(zones)
    results = run_bench(runtime, config)
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
                "threads": runtime.threads, "power_gating": gating, "results": [result.to_json() for result in results],
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
