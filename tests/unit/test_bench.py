"""``edgesdk bench``: llama-bench's pp / tg figures for a bundle, on the tiny host bundle."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.bench import BenchConfig, prompt_ids, run_bench
from edgesdk.runtime.session import open_runtime


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    return open_runtime(tiny_bundle.path, threads=1)


def test_bench_times_every_repetition_of_both_tests(runtime):
    results = run_bench(runtime, BenchConfig(prompt_tokens=48, new_tokens=16, repetitions=3))
    assert [r.test for r in results] == ["pp48", "tg16"]
    for result in results:
        assert len(result.samples) == 3
        assert all(s > 0 for s in result.samples)
        assert result.mean == pytest.approx(sum(result.samples) / 3)
    assert runtime.backend.position == 0  # left reset for whoever runs next


def test_prompt_is_real_text_of_the_asked_length(runtime):
    ids = prompt_ids(runtime.tokenizer, 200)
    assert len(ids) == 200
    assert "board" in runtime.tokenizer.decode(ids)


def test_tg_decodes_every_step_even_past_an_end_token(runtime):
    """No stop token: each repetition decodes exactly N steps, whatever the model writes."""
    from edgesdk.runtime import bench

    steps = []
    original = runtime.backend.decode
    runtime.backend.decode = lambda token: (steps.append(token), original(token))[1]
    try:
        bench.run_bench(runtime, BenchConfig(prompt_tokens=0, new_tokens=9, repetitions=2, warmup=False))
    finally:
        del runtime.backend.decode
    assert len(steps) == 18


def test_too_long_for_the_context_is_refused_with_the_limit(runtime):
    limit = runtime.backend.max_context
    with pytest.raises(EdgeSDKError, match=f"max_context is {limit}"):
        run_bench(runtime, BenchConfig(prompt_tokens=limit + 1, new_tokens=0))
    with pytest.raises(ValueError, match="not both 0"):
        BenchConfig(prompt_tokens=0, new_tokens=0)


def test_bench_command_prints_a_table_or_json(tiny_bundle):
    runner = CliRunner()
    table = runner.invoke(main, ["bench", str(tiny_bundle.path), "-p", "16", "-n", "8", "-r", "2", "--threads", "1"])
    assert table.exit_code == 0, table.output
    rows = [line for line in table.output.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| bundle | size | params | backend | threads | test | t/s |")
    assert "| pp16 |" in rows[2]
    assert "| tg8 |" in rows[3]
    as_json = runner.invoke(main, ["bench", str(tiny_bundle.path), "-p", "0", "-n", "4", "-r", "2", "--json",
                                   "--threads", "1"])
    assert as_json.exit_code == 0, as_json.output
    body = json.loads(as_json.output)
    assert body["threads"] == 1
    assert [r["test"] for r in body["results"]] == ["tg4"]
    assert len(body["results"][0]["samples"]) == 2
    # The process's peak resident memory so far, as getrusage gives it (the runner runs in this process).
    import resource

    assert 20 < body["peak_rss_mib"] <= resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 + 0.1
    assert "peak RSS" in table.output
    off = runner.invoke(main, ["bench", str(tiny_bundle.path), "-p", "0", "-n", "0"])
    assert off.exit_code == 2
    assert "every test is off (-p 0 -n 0" in off.output


def test_run_stats_report_the_peak_resident_memory(tiny_bundle):
    result = CliRunner().invoke(main, ["run", str(tiny_bundle.path), "--prompt", "hi", "-n", "3", "--stats",
                                       "--threads", "1"])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.stderr.splitlines() if line.startswith("[ort-cpu] prompt"))
    assert int(line.rsplit("peak RSS ", 1)[1].split()[0]) > 20
