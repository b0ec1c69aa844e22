"""``edgesdk bench`` against llama-bench (ggml-org/llama.cpp tools/llama-bench/llama-bench.cpp), review 51: its -o / -oe
output formats and their field names, -m given several times, -pg, --delay, --progress and the test parameters that
were read as other options; and ``edgesdk run`` saying the LLAMA_ARG_* variables it does not read (LLAMA_ARG_CTX_SIZE
against the bundle's context), as serve says them."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import statistics
import time

import pytest

from tests.unit.test_cli import assert_ok, invoke

pytest.importorskip("torch")

# llama-bench's test::get_fields that mean the same for a bundle, then the samples its JSON forms add
FIELDS = ["build_commit", "cpu_info", "gpu_info", "backends", "model_filename", "model_type", "model_size",
          "model_n_params", "n_threads", "n_prompt", "n_gen", "n_depth", "test_time", "avg_ns", "stddev_ns", "avg_ts",
          "stddev_ts"]


def _bench(bundle, *args, p=8, n=4):
    """bench with -p P -n N (given again, -p and -n add tests, as llama-bench's lists)."""
    return invoke("bench", bundle, "-p", p, "-n", n, "-r", 2, "-t", 1, *args)


def _check_record(record: dict, n_prompt: int, n_gen: int, bundle) -> None:
    assert list(record) == FIELDS + ["samples_ns", "samples_ts"]
    assert (record["n_prompt"], record["n_gen"], record["n_depth"], record["n_threads"]) == (n_prompt, n_gen, 0, 1)
    assert record["model_filename"] == str(bundle)
    assert record["backends"] == "ort-cpu"
    assert record["model_n_params"] > 0
    assert record["model_size"] > 0
    assert len(record["samples_ns"]) == len(record["samples_ts"]) == 2
    # llama-bench's get_ts: 1e9 * (n_prompt + n_gen) / ns of each repetition; avg_ts / stddev_ts their mean and stdev
    for ns, ts in zip(record["samples_ns"], record["samples_ts"], strict=True):
        assert ts == pytest.approx(1e9 * (n_prompt + n_gen) / ns, rel=1e-3)
    assert record["avg_ts"] == pytest.approx(statistics.fmean(record["samples_ts"]))
    assert record["stddev_ts"] == pytest.approx(statistics.stdev(record["samples_ts"]))
    assert record["avg_ns"] == pytest.approx(statistics.fmean(record["samples_ns"]), abs=1)
    assert time.strptime(record["test_time"], "%Y-%m-%dT%H:%M:%SZ")


def test_o_json_and_jsonl_print_llama_bench_s_records(tiny_bundle):
    """'llama-bench -o json' is what scripts parse: 'edgesdk bench -o json' was "No such option '-o'"."""
    result = _bench(tiny_bundle.path, "-o", "json")
    assert_ok(result)
    records = json.loads(result.stdout)  # stdout holds the array alone; the conditions went to stderr
    assert [(r["n_prompt"], r["n_gen"]) for r in records] == [(8, 0), (0, 4)]
    _check_record(records[0], 8, 0, tiny_bundle.path)
    _check_record(records[1], 0, 4, tiny_bundle.path)
    assert "conditions:" in result.stderr
    lines = _bench(tiny_bundle.path, "-o", "jsonl", n=0)
    assert_ok(lines)
    (record,) = [json.loads(line) for line in lines.stdout.splitlines()]
    _check_record(record, 8, 0, tiny_bundle.path)


def test_o_csv_md_and_sql_print_llama_bench_s_forms(tiny_bundle):
    table = _bench(tiny_bundle.path, "-o", "csv")
    assert_ok(table)
    assert table.stdout.splitlines()[0] == ",".join(FIELDS)  # the header, unquoted; every value quoted
    rows = list(csv.DictReader(io.StringIO(table.stdout)))
    assert [(row["n_prompt"], row["n_gen"]) for row in rows] == [("8", "0"), ("0", "4")]
    assert float(rows[0]["avg_ts"]) > 0
    assert rows[0]["model_filename"] == str(tiny_bundle.path)
    md = _bench(tiny_bundle.path, "-o", "md")
    assert_ok(md)
    lines = md.stdout.splitlines()
    assert [cell.strip() for cell in lines[0].strip("|").split("|")] == \
        ["model", "size", "params", "backend", "threads", "test", "t/s"]
    assert [line.split("|")[6].strip() for line in lines[2:4]] == ["pp8", "tg4"]
    assert lines[-1].startswith("build: edgesdk ")
    sql = _bench(tiny_bundle.path, "-o", "sql")
    assert_ok(sql)
    db = sqlite3.connect(":memory:")
    db.executescript(sql.stdout)
    assert db.execute("SELECT n_prompt, n_gen FROM llama_bench ORDER BY rowid").fetchall() == [(8, 0), (0, 4)]
    assert db.execute("SELECT min(avg_ts) FROM llama_bench").fetchone()[0] > 0
    none = _bench(tiny_bundle.path, "-o", "none", n=0)
    assert_ok(none)
    assert none.stdout == ""


def test_oe_prints_the_records_to_stderr_beside_the_table(tiny_bundle):
    result = _bench(tiny_bundle.path, "-oe", "jsonl", n=0)
    assert_ok(result)
    assert "| pp8 |" in result.stdout
    records = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert [(r["n_prompt"], r["n_gen"]) for r in records] == [(8, 0)]
    both = _bench(tiny_bundle.path, "-o", "json", "--json")
    assert both.exit_code == 2
    assert "pass one" in both.stderr


def test_m_given_again_benchmarks_each_bundle_in_turn(tiny_bundle):
    """llama-bench's -m is given once or more (each a comma-separated list): every test runs on each model."""
    path = str(tiny_bundle.path)
    result = invoke("bench", "-m", path, "-m", f"{path},{path}", "-p", 4, "-n", 0, "-r", 1, "-t", 1, "-o", "jsonl")
    assert_ok(result)
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["model_filename"] for r in records] == [path] * 3
    table = invoke("bench", path, "-m", path, "-p", 4, "-n", 0, "-r", 1, "-t", 1)
    assert_ok(table)
    assert sum("| pp4 |" in line for line in table.stdout.splitlines()) == 2
    several = invoke("bench", path, "-m", path, "-p", 4, "-n", 0, "-r", 1, "--json")
    assert several.exit_code == 2
    assert "-o jsonl" in several.stderr
    nothing = invoke("bench", "-p", 4)
    assert nothing.exit_code == 2
    assert "Missing argument 'BUNDLE'" in nothing.stderr


def test_pg_times_a_prompt_and_the_tokens_generated_after_it_together(tiny_bundle):
    """llama-bench's -pg PP,TG (test_prompt then test_gen between t_start and t_ns): was refused."""
    result = _bench(tiny_bundle.path, "-pg", "8,4", "-pg", "6,0", "-o", "jsonl", p=0, n=0)
    assert_ok(result)
    combined, prompt_only = [json.loads(line) for line in result.stdout.splitlines()]
    assert (combined["n_prompt"], combined["n_gen"]) == (8, 4)
    for ns, ts in zip(combined["samples_ns"], combined["samples_ts"], strict=True):
        assert ts == pytest.approx(1e9 * 12 / ns, rel=1e-3)
    assert (prompt_only["n_prompt"], prompt_only["n_gen"]) == (6, 0)
    table = _bench(tiny_bundle.path, "-pg", "8,4")
    assert_ok(table)
    assert "| pp8+tg4 |" in table.stdout
    bad = _bench(tiny_bundle.path, "-pg", "8,4,2")
    assert bad.exit_code == 2
    assert "is not PP,TG" in bad.stderr


def test_a_combined_test_prefills_the_prompt_then_decodes_n_steps(tiny_bundle):
    from edgesdk.errors import EdgeSDKError
    from edgesdk.runtime.bench import BenchConfig, run_bench
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(tiny_bundle.path, threads=1)
    backend, prefills, steps = runtime.backend, [], []
    prefill, decode = backend.prefill, backend.decode
    backend.prefill = lambda ids, *a, **k: (prefills.append(len(ids)), prefill(ids, *a, **k))[1]
    backend.decode = lambda token, *a, **k: (steps.append(token), decode(token, *a, **k))[1]
    try:
        (result,) = run_bench(runtime, BenchConfig(prompt_tokens=8, new_tokens=4, repetitions=2, warmup=False,
                                                   combined=True))
    finally:
        del backend.prefill, backend.decode
    assert (result.test, result.tokens) == ("pp8+tg4", 12)
    assert prefills == [8, 8]
    assert len(steps) == 8
    assert result.to_json()["n_prompt"] == 8
    assert result.to_json()["n_gen"] == 4
    limit = backend.max_context
    with pytest.raises(EdgeSDKError, match=f"the bench needs {limit + 1} positions"):
        run_bench(runtime, BenchConfig(prompt_tokens=limit - 3, new_tokens=4, combined=True))


def test_delay_and_progress(tiny_bundle):
    start = time.monotonic()
    result = _bench(tiny_bundle.path, "--delay", 1, "--progress", n=0)
    assert_ok(result)
    assert time.monotonic() - start >= 1.0
    said = [line.split(": ", 1)[1] for line in result.stderr.splitlines() if line.startswith("edgesdk bench: ")]
    assert said == ["benchmark 1/1: starting", "benchmark 1/1: warmup prompt run", "benchmark 1/1: prompt run 1/2",
                    "benchmark 1/1: prompt run 2/2"]


def test_llama_bench_s_other_test_parameters_are_read_by_name(tiny_bundle):
    """-d 0, -lm mmap, --no-host 0, -dio 0 ... were read as other options (-lm as -l) or left a stray value."""
    result = _bench(tiny_bundle.path, "-d", "0", "-lm", "mmap", "--no-host", "0", "-dio", "0",
                    "-v", "--prio", "0", "-C", "0x0", "--offline", "-o", "none", n=0)
    assert_ok(result)
    for flag in ("-d", "-lm", "--no-host", "-dio", "-v", "--prio", "-C", "--offline"):
        assert f"edgesdk: {flag} is accepted for llama.cpp's scripts" in result.stderr
    for args, said in ((["-d", "0,512"], "runs each test from an empty cache"), (["-C", "0x3"], "taskset"),
                       (["--numa", "distribute"], "--numa is llama.cpp's --numa, which edgesdk bench does not have"),
                       (["--prio", "2"], "nice or chrt")):
        refused = _bench(tiny_bundle.path, *args)
        assert refused.exit_code == 2
        assert said in " ".join(refused.stderr.split())


def test_run_says_llama_arg_ctx_size_is_not_what_runs(tiny_bundle):
    """llama-cli acts on LLAMA_ARG_CTX_SIZE as on -c; run checked -c against the bundle's context and ignored the
    variable (and every other LLAMA_ARG_* it has no option for) silently."""
    from edgesdk.bundle import read_manifest

    max_context = read_manifest(tiny_bundle.path)["graph"]["max_context"]
    args = ("run", tiny_bundle.path, "-p", "Once", "-n", 2, "-t", 1)
    other = invoke(*args, env={"LLAMA_ARG_CTX_SIZE": str(max_context * 16), "LLAMA_ARG_N_GPU_LAYERS": "99"})
    assert_ok(other)
    stderr = " ".join(other.stderr.split())
    assert f"LLAMA_ARG_CTX_SIZE='{max_context * 16}' is not read" in stderr
    assert f"is {max_context} tokens, fixed when it was built" in stderr
    assert "LLAMA_ARG_N_GPU_LAYERS (llama.cpp's --gpu-layers) is accepted" in stderr  # as -ngl 99 is
    for same in ("0", str(max_context)):
        quiet = invoke(*args, env={"LLAMA_ARG_CTX_SIZE": same})
        assert_ok(quiet)
        assert "LLAMA_ARG_CTX_SIZE" not in quiet.stderr
    over = invoke(*args, "-c", max_context, env={"LLAMA_ARG_CTX_SIZE": str(max_context * 16)})
    assert_ok(over)
    assert "LLAMA_ARG_CTX_SIZE is set, but -c on the command line goes over it" in over.stderr
