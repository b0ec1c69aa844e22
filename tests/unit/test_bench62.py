"""``edgesdk bench``, review 62: Ctrl-C in the middle of a run printed none of the tests that had finished (edgesdk's
table and --json come at the end; -o json left its array open), where llama-bench's rows stay on the screen as each
test ends; a ``-t`` count past the runtime's bound, or a later bundle built for another target, was refused only once
the earlier thread counts or bundles had run every test, their results thrown away."""

from __future__ import annotations

import hashlib
import json
import shutil
import time

import pytest

from edgesdk.bundle import MANIFEST, MANIFEST_DIGEST
from tests.unit.test_cli import invoke

DELAY = 7  # --delay: the cool-off before each test, where the Ctrl-C lands (no real sleep is taken)


@pytest.fixture
def ctrl_c_before_second_test(monkeypatch):
    """A Ctrl-C (KeyboardInterrupt) in the --delay before the second test; the first cool-off returns at once."""
    waits = []

    def sleep(seconds):
        if seconds == DELAY:
            waits.append(seconds)
            if len(waits) == 2:
                raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", sleep)
    return waits


def _bench(bundle, *args):
    return invoke("bench", bundle, "-p", 4, "-n", 2, "-r", 1, "-t", 1, "--no-warmup", "--delay", DELAY, *args)


def test_ctrl_c_prints_the_table_of_the_tests_that_finished(tiny_bundle, ctrl_c_before_second_test):
    result = _bench(tiny_bundle.path)
    assert result.exit_code == 130, result.output
    rows = [line for line in result.stdout.splitlines()
            if line.startswith("| ") and "| t/s |" not in line and "---" not in line]
    assert len(rows) == 1, result.stdout
    assert "| pp4 |" in rows[0]  # the pp4 test ran; tg2 was stopped
    assert "1 of 2 tests finished before Ctrl-C" in result.stderr
    assert "stopped (Ctrl-C)" in result.stderr


def test_ctrl_c_closes_llama_bench_json_array(tiny_bundle, ctrl_c_before_second_test):
    result = _bench(tiny_bundle.path, "-o", "json")
    assert result.exit_code == 130, result.output
    records = json.loads(result.stdout)  # the array is closed: valid JSON of the finished tests
    assert [(record["n_prompt"], record["n_gen"]) for record in records] == [(4, 0)]


def test_ctrl_c_gives_json_of_the_finished_tests(tiny_bundle, ctrl_c_before_second_test):
    result = _bench(tiny_bundle.path, "--json")
    assert result.exit_code == 130, result.output
    body = json.loads(result.stdout)
    assert [test["test"] for test in body["results"]] == ["pp4"]
    assert body["bundle_id"] == tiny_bundle.bundle_id


def test_ctrl_c_before_any_test_finished_prints_no_table(tiny_bundle, monkeypatch):
    def sleep(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", sleep)
    result = _bench(tiny_bundle.path)
    assert result.exit_code == 130, result.output
    assert "| pp4 |" not in result.stdout
    assert "stopped (Ctrl-C)" in result.stderr


def test_a_thread_count_past_the_bound_is_refused_before_any_test_runs(tiny_bundle):
    from edgesdk.runtime.ort_backend import MAX_THREADS

    result = invoke("bench", tiny_bundle.path, "-p", 4, "-n", 0, "-r", 1, "--no-warmup", "-t", f"1,{MAX_THREADS + 1}",
                    "-o", "jsonl")
    assert result.exit_code == 2, result.output
    assert result.stdout == ""  # the -t 1 tests did not run first
    assert f"{MAX_THREADS + 1} threads" in result.stderr
    assert "'-t' / '--threads'" in result.stderr


def test_a_later_bundle_for_another_target_is_refused_before_any_test_runs(tiny_bundle, tmp_path):
    other = tmp_path / "other-target"
    shutil.copytree(tiny_bundle.path, other)
    manifest = json.loads((other / MANIFEST).read_text())
    manifest["target"]["name"] = "rpi5"
    raw = json.dumps(manifest).encode()
    (other / MANIFEST).write_bytes(raw)
    (other / MANIFEST_DIGEST).write_text(hashlib.sha256(raw).hexdigest() + "\n")  # a bundle whole, for another board
    result = invoke("bench", tiny_bundle.path, "-m", other, "--target", "host", "-p", 4, "-n", 0, "-r", 1, "-t", 1,
                    "--no-warmup", "-o", "jsonl")
    assert result.exit_code != 0, result.output
    assert result.stdout == ""  # the first bundle's tests did not run first
    assert "built for target 'rpi5', not 'host'" in result.stderr
    assert str(other) in result.stderr


def test_a_run_that_is_not_stopped_exits_0(tiny_bundle):
    result = invoke("bench", tiny_bundle.path, "-p", 4, "-n", 2, "-r", 1, "-t", 1, "--no-warmup", "-o", "json")
    assert result.exit_code == 0, result.output
    assert [(record["n_prompt"], record["n_gen"]) for record in json.loads(result.stdout)] == [(4, 0), (0, 2)]


def test_json_beside_o_is_refused_in_one_sentence(tmp_path):
    """Click put the option before the message: "Invalid value for '--json': and -o csv both say ..."."""
    result = invoke("bench", tmp_path, "--json", "-o", "csv")
    assert result.exit_code == 2
    assert "Error: --json and -o csv both say how to print the results: pass one" in result.output
