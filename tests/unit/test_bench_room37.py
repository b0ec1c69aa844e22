"""``edgesdk bench``: tests too long for the bundle's context are refused before the model loads, and a
power-gated bundle's bench says whether its gates skipped FFN blocks."""

from __future__ import annotations

import json
import shutil

from click.testing import CliRunner

from edgesdk.bundle import read_manifest
from edgesdk.cli import main
from tests.unit.test_power_export import power_bundle  # noqa: F401 (a fixture)


def test_a_bench_too_long_for_the_context_is_refused_before_the_model_loads(tiny_bundle, tmp_path):
    """The check reads the manifest's max_context: with the weights gone, loading would fail on them instead."""
    copy = tmp_path / "b"
    shutil.copytree(tiny_bundle.path, copy)
    graph = read_manifest(copy)["graph"]
    (copy / graph["file"]).unlink()
    max_context = graph["max_context"]
    result = CliRunner().invoke(main, ["bench", str(copy), "-p", str(max_context + 1), "-n", "4", "--threads", "1"])
    assert result.exit_code != 0
    assert f"the bench needs {max_context + 1} positions; the bundle's max_context is {max_context}" in result.output
    result = CliRunner().invoke(main, ["bench", str(copy), "-p", "0", "-n", str(max_context), "--threads", "1"])
    assert f"the bench needs {max_context + 1} positions" in result.output


def test_a_power_gated_bundle_s_bench_says_its_gates_are_off(power_bundle, tiny_bundle):  # noqa: F811
    args = ["-p", "8", "-n", "4", "-r", "1", "--threads", "1", "--ignore-target"]
    table = CliRunner().invoke(main, ["bench", str(power_bundle.path), *args])
    assert table.exit_code == 0, table.output
    assert "power gates: off: every FFN block runs" in table.output
    as_json = CliRunner().invoke(main, ["bench", str(power_bundle.path), *args, "--json"])
    assert json.loads(as_json.stdout)["power_gating"] is False
    plain = CliRunner().invoke(main, ["bench", str(tiny_bundle.path), *args, "--json"])
    assert json.loads(plain.stdout)["power_gating"] is None
    assert "power gates" not in CliRunner().invoke(main, ["bench", str(tiny_bundle.path), *args]).output
