"""What ``edgesdk bench`` records: llama-bench's per-test fields, JSON without infinities, and huge pages."""

from __future__ import annotations

import json
import math

import pytest

from edgesdk.runtime.bench import BenchConfig, BenchResult, run_bench
from edgesdk.runtime.huge_pages import huge_pages_state, thp_mode
from edgesdk.runtime.session import open_runtime
from tests.unit.test_cli import assert_ok, invoke


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    return open_runtime(tiny_bundle.path, threads=1)


def test_json_carries_llama_bench_per_test_fields(runtime):
    """avg_ts / stddev_ts are the mean and sample stdev of each repetition's tok/s (llama-bench's get_ts), and
    samples_ns the timed nanoseconds those rates come from."""
    pp, tg = (result.to_json() for result in run_bench(runtime, BenchConfig(prompt_tokens=12, new_tokens=5,
                                                                                  repetitions=3)))
    assert (pp["n_prompt"], pp["n_gen"], tg["n_prompt"], tg["n_gen"]) == (12, 0, 0, 5)
    for body, tokens in ((pp, 12), (tg, 5)):
        assert len(body["samples_ns"]) == len(body["samples_ts"]) == 3
        for rate, ns in zip(body["samples_ts"], body["samples_ns"], strict=True):
            assert rate == pytest.approx(tokens * 1e9 / ns, rel=1e-6)
        assert body["avg_ts"] == pytest.approx(sum(body["samples_ts"]) / 3)
        rates = body["samples_ts"]
        mean = sum(rates) / 3
        assert body["stddev_ts"] == pytest.approx(math.sqrt(sum((r - mean) ** 2 for r in rates) / 2))
        assert body["avg_ns"] == round(sum(body["samples_ns"]) / 3)


def test_one_repetition_has_a_zero_stdev_as_in_llama_bench(runtime):
    (result,) = run_bench(runtime, BenchConfig(prompt_tokens=0, new_tokens=3, repetitions=1))
    body = result.to_json()
    assert (body["stdev"], body["stddev_ts"], body["stddev_ns"]) == (0.0, 0.0, 0)


def test_a_repetition_too_short_for_the_clock_leaves_valid_json():
    """A 0-second repetition's rate is infinite: statistics.stdev raised AttributeError on it and json.dumps
    wrote Infinity, which no JSON parser takes."""
    result = BenchResult("pp8", 8, (math.inf, 100.0))
    assert math.isnan(result.stdev)
    body = json.loads(json.dumps(result.to_json(), allow_nan=False))
    assert (body["tok_s"], body["stdev"], body["samples"], body["samples_ts"]) == (None, None, [None, 100.0],
                                                                                   [None, 100.0])


def test_huge_pages_state_reads_the_mode_and_the_tunable(tmp_path):
    enabled = tmp_path / "enabled"
    enabled.write_text("always [madvise] never\n")
    state = huge_pages_state({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"}, enabled)
    assert (state["transparent_huge_pages"], state["glibc_hugetlb"]) == ("madvise", "1")
    enabled.write_text("")  # empty, or no such file: unknown
    assert huge_pages_state({}, enabled)["transparent_huge_pages"] is None
    state = huge_pages_state({}, tmp_path / "none")
    assert (state["transparent_huge_pages"], state["glibc_hugetlb"]) == (None, None)


def test_bench_records_huge_pages_in_table_and_json(tiny_bundle):
    """Huge pages move decode speed by up to 1.4x (runtime/huge_pages.py): a figure must say whether it had them."""
    result = invoke("bench", tiny_bundle.path, "-p", 4, "-n", 2, "-r", 1, "--json", "--threads", 1)
    assert_ok(result)
    state = json.loads(result.stdout)["conditions"]["huge_pages"]
    assert state["transparent_huge_pages"] == thp_mode()
    assert state["anon_huge_pages_mib"] is None or state["anon_huge_pages_mib"] >= 0
    result = invoke("bench", tiny_bundle.path, "-p", 4, "-n", 2, "-r", 1, "--threads", 1)
    assert_ok(result)
    assert f"THP {thp_mode() or 'unknown'}" in next(line for line in result.stdout.splitlines()
                                                   if line.startswith("huge pages: "))
