"""First use of the CLI: bench's table with llama-bench's size and params columns (edgesdk/cli_bench.py,
edgesdk/runtime/bench.py), ``edgesdk targets`` alone listing the targets (edgesdk/cli.py), and env's cuda_runtime
row saying what was found rather than "yes" beside no CUDA device (edgesdk/envinfo.py)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.envinfo import format_env
from edgesdk.runtime.bench import BenchResult, format_table, params_label, size_label

BENCH_ARGS = ["-t", "1", "-p", "4", "-n", "0", "-r", "1", "--no-warmup"]


def _table(stdout: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in stdout.splitlines()
            if line.startswith("| ")]


def test_bench_table_has_llama_bench_s_size_and_params_columns(tiny_bundle):
    """llama-bench's table reads model | size | params | backend | threads | test | t/s; edgesdk's had no size nor
    params, which -o json gave. The row's figures are the record's model_size and model_n_params, as -o md shows
    them."""
    runner = CliRunner()
    table = runner.invoke(main, ["bench", str(tiny_bundle.path), *BENCH_ARGS])
    assert table.exit_code == 0, table.output + table.stderr
    rows = _table(table.stdout)
    assert rows[0] == ["bundle", "size", "params", "backend", "threads", "test", "t/s"]
    assert rows[1] == ["---", "---:", "---:", "---", "---:", "---:", "---:"]
    record = json.loads(runner.invoke(main, ["bench", str(tiny_bundle.path), *BENCH_ARGS, "-o", "json"]).stdout)[0]
    assert record["model_size"] > 0
    assert record["model_n_params"] > 0
    bundle, size, params, backend, threads, test, rate = rows[2]
    assert (bundle, backend, threads, test) == (tiny_bundle.path.name, "ort-cpu", "1", "pp4")
    assert (size, params) == (size_label(record["model_size"]), params_label(record["model_n_params"]))
    assert size.endswith(" MiB")
    assert params.endswith(" M")
    assert " ± " in rate
    md = _table(runner.invoke(main, ["bench", str(tiny_bundle.path), *BENCH_ARGS, "-o", "md"]).stdout)
    assert md[2][1:3] == [size, params]  # llama-bench's own table, -o md, shows the same figures


def test_bench_table_of_several_bundles_gives_each_its_size(tiny_bundle):
    result = CliRunner().invoke(main, ["bench", str(tiny_bundle.path), "-m", str(tiny_bundle.path), *BENCH_ARGS])
    assert result.exit_code == 0, result.output + result.stderr
    rows = _table(result.stdout)[2:]
    assert len(rows) == 2
    assert rows[0][:3] == rows[1][:3]
    assert rows[0][1].endswith(" MiB")
    assert rows[0][2].endswith(" M")


def test_size_and_params_are_shown_as_llama_bench_shows_them():
    assert size_label(None) == params_label(None) == "?"
    assert size_label(145_000_000) == "138.28 MiB"
    assert size_label(3 * 2**30) == "3.00 GiB"
    assert params_label(134_515_008) == "134.52 M"
    assert params_label(1_711_376_384) == "1.71 B"
    result = BenchResult("tg8", 8, (10.0, 12.0))
    rows = _table(format_table([result], "ort-cpu", 2, "b", rows=[("b", "ort-cpu", None, 2_000_000_000)]))
    assert rows[2] == ["b", "?", "2.00 B", "ort-cpu", "2", "tg8", "11.00 ± 1.41"]


def test_targets_alone_lists_the_targets():
    """``edgesdk targets`` printed its usage and exited 2; it lists them, as ``targets list``."""
    runner = CliRunner()
    alone = runner.invoke(main, ["targets"])
    assert alone.exit_code == 0, alone.output
    listed = runner.invoke(main, ["targets", "list"])
    assert listed.exit_code == 0, listed.output
    assert alone.output == listed.output
    assert any(line.startswith("host ") for line in alone.output.splitlines())
    shown = runner.invoke(main, ["targets", "show", "host"])
    assert shown.exit_code == 0
    assert shown.output.startswith("name: host")


def _gpu_rows(gpu: dict) -> dict[str, str]:
    lines = format_env({"gpu": gpu}).splitlines()
    gpu_lines = lines[lines.index("gpu:") + 1:lines.index("board:")]
    return {key.strip(): value.strip() for key, _, value in (line.partition(" : ") for line in gpu_lines)}


def test_env_cuda_runtime_says_a_library_was_found_not_that_cuda_works():
    """A CUDA runtime library on a host with no GPU read "cuda_runtime : yes" beside "cuda_device : no"."""
    base = {"nvidia_smi": None, "device_nodes": [], "tensorrt": False, "libnvinfer": None}
    alone = _gpu_rows({"cuda_device": False, "cuda_runtime": True, **base, "libcudart": "libcudart.so.12"})
    assert alone["cuda_runtime"] == "library found (libcudart.so.12), but no CUDA device to run on"
    assert alone["cuda_device"] == "no"
    with_device = _gpu_rows({"cuda_device": True, "cuda_runtime": True, **base, "libcudart": "libcudart.so.12"})
    assert with_device["cuda_runtime"] == "library found (libcudart.so.12)"
    none = _gpu_rows({"cuda_device": False, "cuda_runtime": False, **base, "libcudart": None})
    assert none["cuda_runtime"] == "no libcudart found"


def test_env_json_keeps_cuda_runtime_a_flag():
    result = CliRunner().invoke(main, ["env", "--json"])
    assert result.exit_code == 0, result.output
    gpu = json.loads(result.output)["gpu"]
    assert gpu["cuda_runtime"] is (gpu["libcudart"] is not None)
    text = CliRunner().invoke(main, ["env"]).output
    row = next(line for line in text.splitlines() if line.strip().startswith("cuda_runtime"))
    assert row.split(" : ", 1)[1] not in ("yes", "no")


def test_models_alone_lists_the_aliases(monkeypatch, tmp_path):
    """`edgesdk models` printed its usage and exited 2, as `targets` did."""
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    runner = CliRunner()
    alone = runner.invoke(main, ["models"])
    assert alone.exit_code == 0, alone.output
    assert alone.output == runner.invoke(main, ["models", "list"]).output
    assert "[default]" in alone.output
