"""A user journey's run / thermal / eval findings: ``--telemetry DIR`` and ``thermal report DIR``, ``eval
--reference`` of a bundle whose source model has moved (``--reference-model``), and the report's time unit of a
sub-second run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgesdk.cli import main


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="edgesdk")


def assert_ok(result):
    assert result.exit_code == 0, f"exit {result.exit_code}\n{result.output}\n{result.exception!r}"


@pytest.fixture(scope="module")
def telemetry_dir(tiny_bundle, tmp_path_factory):
    """A directory holding what a real 'edgesdk run --simulate-thermal --telemetry tele/run.jsonl -n 8' of the tiny
    model writes: a run well under a second."""
    folder = tmp_path_factory.mktemp("tele")
    env = {**os.environ, "EDGESDK_HUGE_PAGES": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run([sys.executable, "-m", "edgesdk", "run", str(tiny_bundle.path), "--threads", "1", "-p",
                             "hi", "-n", "8", "--ignore-eos", "--simulate-thermal", "--telemetry",
                             str(folder / "run.jsonl")], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return folder


def test_run_telemetry_of_a_directory_names_a_file_in_it(tiny_bundle, tmp_path):
    """``run --telemetry DIR`` got click's "File 'tele' is a directory", with no word of what to pass."""
    folder = tmp_path / "tele"
    folder.mkdir()
    result = invoke("run", tiny_bundle.path, "--threads", "1", "-p", "hi", "-n", "2", "--simulate-thermal",
                    "--watch-thermal", "--telemetry", folder)
    assert result.exit_code == 2, result.output
    assert f"{folder} is a directory, and --telemetry writes one JSONL file" in result.output
    assert f"e.g. --telemetry {folder / 'run.jsonl'}" in result.output
    assert "File '" not in result.output
    assert list(folder.iterdir()) == []


def test_thermal_report_of_a_directory_draws_its_telemetry_files(telemetry_dir):
    """``thermal report DIR`` was refused as click refuses a directory; it draws the .jsonl files in it, named."""
    pytest.importorskip("matplotlib")
    shutil.copy(telemetry_dir / "run.jsonl", telemetry_dir / "again.jsonl")
    try:
        result = invoke("thermal", "report", telemetry_dir)
        assert_ok(result)
    finally:
        (telemetry_dir / "again.jsonl").unlink()
    out = telemetry_dir / "report.png"
    assert result.stdout.strip() == str(out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (f"{telemetry_dir} is a directory; drawing the 2 telemetry files in it: {telemetry_dir / 'again.jsonl'}, "
            f"{telemetry_dir / 'run.jsonl'}") in result.stderr


def test_thermal_report_of_a_directory_with_no_telemetry_says_what_to_pass(tmp_path):
    (tmp_path / "notes.txt").write_text("not telemetry\n")
    result = invoke("thermal", "report", tmp_path)
    assert result.exit_code == 1, result.output
    assert f"{tmp_path} is a directory with no telemetry file (*.jsonl) in it" in result.output
    assert "e.g. edgesdk thermal report telemetry/run.jsonl" in result.output


def _time_axis(path: Path, tmp_path: Path, *files: Path):
    """The bottom axis of the report of ``files``: its label and tick labels as drawn."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from edgesdk.thermal import report

    drawn: list[Figure] = []
    save = report._save_atomically

    def keep(fig, out):
        drawn.append(fig)
        save(fig, out)

    report._save_atomically = keep
    try:
        report.render(list(files), tmp_path / f"{path.stem}.png")
    finally:
        report._save_atomically = save
    axis = drawn[0].axes[2]
    labels = [label.get_text() for label in axis.get_xticklabels()]
    return axis.get_xlabel(), labels, axis.xaxis.get_offset_text().get_text()


def test_report_of_a_sub_second_run_draws_its_time_in_seconds(telemetry_dir, tmp_path):
    """A real run of the tiny model lasts well under a second: its time axis was in minutes, with ticks of
    0.000025 min or a 1e-5 multiplier beside them."""
    from edgesdk.thermal.telemetry import load

    _, steps = load(telemetry_dir / "run.jsonl")
    assert 0 < steps[-1]["t"] < 120
    label, ticks, offset = _time_axis(telemetry_dir / "run.jsonl", tmp_path, telemetry_dir / "run.jsonl")
    assert label == "time (s)"
    assert offset == ""
    assert all("e" not in tick and len(tick.replace("\u2212", "").lstrip("0.")) <= 4 for tick in ticks), ticks


def test_report_time_unit_follows_the_span(tmp_path):
    """Minutes for a run of minutes, hours for a run of hours."""
    import json

    def written(name: str, seconds: float) -> Path:
        meta = {"type": "meta", "version": 2, "profile": "rpi5", "mode": "simulated", "guarded": True,
                "ambient_c": 25.0, "limits": {"soft_c": 75.0, "hard_c": 78.0, "throttle_c": 80.0}}
        steps = [{"type": "step", "t": seconds * (i + 1) / 20, "kind": "decode", "tokens": 1, "temp_c": 50.0 + i,
                  "level": "normal"} for i in range(20)]
        path = tmp_path / name
        path.write_text("".join(json.dumps(record) + "\n" for record in [meta, *steps]))
        return path

    for name, seconds, unit in (("minutes.jsonl", 1800.0, "min"), ("hours.jsonl", 86400.0, "h")):
        path = written(name, seconds)
        assert _time_axis(path, tmp_path, path)[0] == f"time ({unit})"


@pytest.fixture(scope="module")
def moved_bundle(tiny_model_dir, tmp_path_factory):
    """A bundle built from a copy of the tiny model that was then moved: its manifest's source is gone."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    root = tmp_path_factory.mktemp("moved")
    shutil.copytree(tiny_model_dir, root / "tiny-llama")
    bundle = build(BuildConfig(target="host", model=str(root / "tiny-llama"), out=root / "bundle",
                               export=ExportConfig(max_context=128), progress=False))
    (root / "tiny-llama").rename(root / "elsewhere")
    text = root / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    return bundle.path, root / "elsewhere", text


def test_eval_reference_of_a_moved_source_names_reference_model(moved_bundle):
    pytest.importorskip("transformers")
    bundle, _, text = moved_bundle
    result = invoke("eval", bundle, "--text", text, "--reference", "--threads", "1", "--context", "64")
    assert result.exit_code == 3, result.output
    assert "that model cannot be loaded here" in result.output
    assert "or pass the model where it is now, e.g. --reference-model DIR" in result.output


def test_eval_reference_model_scores_the_moved_source(moved_bundle):
    """``--reference-model PATH`` loads the source where it is now (and implies --reference); the manifest records no
    digest of the source, so a note says its shape alone was checked."""
    pytest.importorskip("transformers")
    bundle, moved, text = moved_bundle
    result = invoke("eval", bundle, "--text", text, "--reference-model", moved, "--threads", "1", "--context", "64",
                    "--json")
    assert_ok(result)
    import json

    scored = json.loads(result.stdout)
    assert scored["reference"]["perplexity"] == pytest.approx(scored["bundle"]["perplexity"], rel=1e-3)
    assert (f"--reference-model {moved} has the shape of the model {bundle} was built from (llama, "
            in result.stderr)
    assert "the manifest records no digest of that model's weights" in result.stderr


def test_eval_reference_model_of_another_model_is_refused(moved_bundle, tmp_path):
    pytest.importorskip("transformers")
    from tests._utils.tiny import save_tiny_model_dir

    bundle, _, text = moved_bundle
    other = save_tiny_model_dir(tmp_path / "other", layers=3)
    result = invoke("eval", bundle, "--text", text, "--reference-model", other, "--threads", "1", "--context", "64")
    assert result.exit_code == 3, result.output
    assert f"--reference-model {other} is not the model {bundle} was built from" in result.output
    assert "layers 3 where the manifest records 2" in result.output
    assert "reference (PyTorch)" not in result.output


def test_eval_reference_model_that_is_not_there_names_the_option(moved_bundle, tmp_path):
    pytest.importorskip("transformers")
    bundle, _, text = moved_bundle
    result = invoke("eval", bundle, "--text", text, "--reference-model", tmp_path / "nowhere", "--threads", "1",
                    "--context", "64")
    assert result.exit_code == 3, result.output
    assert f"--reference-model {tmp_path / 'nowhere'}: " in result.output
    assert "--model" not in result.output.replace("--reference-model", "")
