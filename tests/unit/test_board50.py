"""Review 50 of the board area: edgesdk bench against llama-bench (tools/llama-bench/llama-bench.cpp,
ggml-org/llama.cpp): value lists and repeated -p / -n / -t, --no-warmup, and the other-work figure of a run
shorter than the kernel's clock tick."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.runtime import bench as bench_module
from edgesdk.runtime.bench_conditions import OTHER_CPU_CORES, other_cores, warnings

HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _bench(bundle, *args: str):
    result = CliRunner().invoke(main, ["bench", str(bundle.path), "-r", "1", "--json", *args])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    return body, [(row["test"], row.get("n_threads")) for row in body["results"]]


def test_a_repeated_or_listed_test_size_runs_a_test_for_each(tiny_bundle):
    """llama-bench adds the values of each -p / -n given to its list ("-n 16 -n 32", "-n 16,32": README, "Multiple
    values can be given for each parameter by separating them with ',' or by specifying the parameter multiple
    times") and runs every -p test, then every -n test. bench kept only the last -p 4 -p 6 (pp6 alone, without a
    word) and refused 2,3 as "not a valid integer range"."""
    body, tests = _bench(tiny_bundle, "-t", "1", "-p", "4", "-p", "6", "-n", "2")
    assert [test for test, _ in tests] == ["pp4", "pp6", "tg2"]
    assert body["threads"] == 1
    _, tests = _bench(tiny_bundle, "-t", "1", "-p", "4,6", "-n", "2,3")
    assert [test for test, _ in tests] == ["pp4", "pp6", "tg2", "tg3"]
    _, tests = _bench(tiny_bundle, "-t", "1", "-p", "0", "-n", "2-8*2")  # llama-bench's FIRST-LAST*MULT
    assert [test for test, _ in tests] == ["tg2", "tg4", "tg8"]


def test_a_thread_list_runs_every_test_with_each_count(tiny_bundle):
    """llama-bench's -t 1,2 (README, "Different numbers of threads") gives each thread count its pp and tg rows,
    the threads shown per row (n_threads in its JSON); bench refused "1,2" and kept only the last of -t 1 -t 2."""
    for threads in (["-t", "1", "-t", "2"], ["-t", "1,2"], ["-t", "1-2"]):
        body, tests = _bench(tiny_bundle, *threads, "-p", "4", "-n", "2")
        first, second = body["threads"]  # the threads each opened with (at most the usable cores)
        assert first == 1
        assert tests == [("pp4", first), ("tg2", first), ("pp4", second), ("tg2", second)]


def test_no_warmup_skips_the_warm_up_runs(tiny_bundle, monkeypatch):
    """llama-bench's --no-warmup ("skip warmup runs before benchmarking") was taken for llama-cli's and accepted
    with "changes nothing here: no warm-up run is made here", and bench still made its warm-up runs."""
    seen = []
    real = bench_module.run_bench

    def recording(runtime, config, **options):
        seen.append(config.warmup)
        return real(runtime, config, **options)

    monkeypatch.setattr(bench_module, "run_bench", recording)
    result = CliRunner().invoke(main, ["bench", str(tiny_bundle.path), "-p", "4", "-n", "2", "-r", "1", "-t", "1",
                                       "--no-warmup"])
    assert result.exit_code == 0, result.output
    assert "changes nothing here" not in result.output
    assert seen == [False, False]
    seen.clear()
    assert CliRunner().invoke(main, ["bench", str(tiny_bundle.path), "-p", "4", "-n", "0", "-r", "1", "-t", "1"]
                              ).exit_code == 0
    assert seen == [True]  # the warm-up stays the default


@pytest.mark.parametrize(("text", "values"), [
    ("512", [512]), ("128,256", [128, 256]), ("1-4", [1, 2, 3, 4]), ("1-8+2", [1, 3, 5, 7]),
    ("64-512*2", [64, 128, 256, 512]), ("16,", [16]), ("8-1", []), ("0", [0]),
])
def test_llama_bench_s_list_forms(text, values):
    """tools/llama-bench/llama-bench.cpp parse_int_range: first[-last[(+|*)step]], comma-separated."""
    assert bench_module.parse_int_range(text) == values


@pytest.mark.parametrize("text", ["1-8+0", "0-8*2", "1-8*1", ",16", "16,,32", "a", "1.5", "-4"])
def test_llama_bench_s_bad_lists_are_refused(text):
    """Where llama-bench throws "invalid range format" or "invalid range" (a step that never ends the range)."""
    with pytest.raises(ValueError, match="llama-bench|forward"):
        bench_module.parse_int_range(text)


def test_cli_refuses_a_bad_list_by_option():
    result = CliRunner().invoke(main, ["bench", "no-such-bundle", "-p", "1-8+0"])
    assert result.exit_code == 2
    assert "'-p'" in result.output
    assert "does not move forward" in result.output


def test_a_run_shorter_than_a_clock_tick_is_not_other_work():
    """/proc/stat counts whole ticks (USER_HZ): one tick over a 2 ms run (bench -p 8 -n 0 -r 1 on a small bundle)
    read as 5 cores busy on a 2-core board, with the 'other processes kept 5.0 cores of the 2' warning."""
    before = {"cpus": [0, 1], "cpu_busy_s": 100.0, "own_cpu_s": 1.0, "monotonic_s": 50.0, "load_1min": 0.1}
    after = {**before, "cpu_busy_s": 100.0 + 1 / HZ, "monotonic_s": 50.002}
    assert other_cores(before, after) == 0.0
    assert warnings(before, after, cores=2) == []
    # real other work over a real run is still told, and never as more cores than were counted
    busy = {**before, "cpu_busy_s": 120.0, "monotonic_s": 60.0}
    assert other_cores(before, busy) == pytest.approx(2.0)
    assert other_cores(before, {**busy, "cpu_busy_s": 200.0}) == 2.0
    assert other_cores(before, {**busy, "cpu_busy_s": 100.0 + 10 * OTHER_CPU_CORES}) == pytest.approx(
        OTHER_CPU_CORES)
