"""``edgesdk bench``, review 63: with several bundles (``-m A -m B``) each bundle's notes on stderr (its target check,
threads and backend) did not say which bundle they were about, and a power-gated bundle benchmarked after another
had no "power gates" line at all (only the first bundle's gates were read); one bundle's lines stay as they were."""

from __future__ import annotations

from tests.unit.test_cli import assert_ok, invoke
from tests.unit.test_power_export import power_bundle  # noqa: F401 (a fixture)

ARGS = ("-p", 8, "-n", 0, "-r", 1, "-t", 1, "--no-warmup", "--ignore-target")


def test_several_bundles_name_each_bundle_in_its_notes(tiny_bundle, power_bundle):  # noqa: F811
    plain, gated = str(tiny_bundle.path), str(power_bundle.path)
    result = invoke("bench", "-m", plain, "-m", gated, *ARGS)
    assert_ok(result)
    lines = result.stderr.splitlines()
    assert f"edgesdk: {plain}: ort-cpu: used" in lines, result.stderr
    assert f"edgesdk: {gated}: ort-cpu: used" in lines, result.stderr
    assert f"edgesdk: {gated}: target check skipped (--ignore-target); bundle built for rpi5" in lines, result.stderr
    assert "edgesdk: ort-cpu: used" not in lines  # no note left unnamed
    # the gated bundle, benchmarked second, says its gates are off, by its path; the plain one says nothing of gates
    gates = [line for line in result.output.splitlines() if line.startswith("power gates")]
    assert gates == [f"power gates of {gated}: off: every FFN block runs and no adapter scale acts (the loaded "
                     "model)"], result.output


def test_several_bundles_with_llama_bench_records_name_each_bundle_on_stderr(tiny_bundle, power_bundle):  # noqa: F811
    gated = str(power_bundle.path)
    result = invoke("bench", "-m", f"{power_bundle.path},{tiny_bundle.path}", *ARGS, "-o", "jsonl")
    assert_ok(result)
    assert f"edgesdk: {gated}: ort-cpu: used" in result.stderr.splitlines()
    assert f"power gates of {gated}: off" in result.stderr
    assert "power gates" not in result.stdout  # stdout holds llama-bench's records alone


def test_one_bundle_s_notes_and_gates_line_are_unnamed(power_bundle):  # noqa: F811
    result = invoke("bench", power_bundle.path, *ARGS)
    assert_ok(result)
    assert "edgesdk: ort-cpu: used" in result.stderr.splitlines()
    assert str(power_bundle.path) not in result.stderr
    assert "power gates: off: every FFN block runs" in result.output
