"""``edgesdk thermal report`` on the telemetry files a board user actually has: empty, a single record,
no temperature at all (a machine without sensors), and a file still being written (a torn last line).

The figure is written as SVG with its text kept as text (``svg.fonttype: none``), so the tests read
what the plot says instead of trusting that a PNG was written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.errors import EdgeSDKError

matplotlib = pytest.importorskip("matplotlib")

from edgesdk.thermal.report import render  # noqa: E402  (needs matplotlib)

META = {"type": "meta", "version": 1, "profile": "rpi5", "mode": "board", "guarded": True, "ambient_c": None,
        "limits": {"resume_c": 70.0, "soft_c": 75.0, "hard_c": 78.0, "throttle_c": 80.0, "shutdown_c": 110.0}}


def step(t: float, kind: str = "decode", temp_c: float | None = 61.5, level: str = "normal") -> dict:
    return {"type": "step", "t": t, "kind": kind, "tokens": 1, "duration_s": 0.1, "wait_s": 0.0, "tok_s": 10.0,
            "temp_c": temp_c, "zones": {} if temp_c is None else {"cpu-thermal": temp_c}, "level": level,
            "budget": 1.0, "sensor_ok": temp_c is not None}


def write(path: Path, records: list[dict], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


def svg_text(paths: list[Path], out: Path) -> str:
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        written = render(paths, out)
    return written.read_text()


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="edgesdk")


def test_an_empty_file_is_a_clear_error(tmp_path):
    empty = tmp_path / "run.jsonl"
    empty.write_text("")
    result = invoke("thermal", "report", empty)
    assert result.exit_code == 1
    assert f"no step records (with a numeric t and tokens) in {empty}" in result.stderr
    assert "fix: record one with 'edgesdk run ... --telemetry FILE'" in result.stderr
    assert not (tmp_path / "run.png").exists()


def test_a_single_record_renders_its_rate_as_a_point(tmp_path):
    one = write(tmp_path / "one.jsonl", [META, step(0.5, "prefill")])
    svg = svg_text([one], tmp_path / "one.svg")
    assert ">one<" in svg  # the run's legend entry
    assert "soft limit 75 °C" in svg
    result = invoke("thermal", "report", one)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "one.png").read_bytes()[:4] == b"\x89PNG"


def test_a_run_without_any_temperature_says_so_in_the_legend(tmp_path):
    """A run on a machine with no sensor records ``temp_c: null`` throughout: its line draws nothing,
    and the legend used to list it as if it did."""
    cold = write(tmp_path / "nosensor.jsonl", [META, step(0.5, "prefill", None), step(0.6, temp_c=None)])
    warm = write(tmp_path / "board.jsonl", [META, step(0.5, "prefill"), step(0.6, temp_c=62.0)])
    svg = svg_text([cold, warm], tmp_path / "both.svg")
    assert "nosensor (no temperature recorded)" in svg
    assert ">board<" in svg  # a run with temperatures keeps its plain label
    assert "board (no temperature recorded)" not in svg


def test_some_null_temperatures_are_gaps_not_a_missing_run(tmp_path):
    gaps = write(tmp_path / "gaps.jsonl", [META, step(0.5, "prefill", None), step(0.6), step(0.7, temp_c=None)])
    svg = svg_text([gaps], tmp_path / "gaps.svg")
    assert ">gaps<" in svg
    assert "no temperature recorded" not in svg


def test_a_file_still_being_written_renders_its_whole_records(tmp_path):
    """The writer is mid-line (its last record not yet flushed whole): the report uses every whole record
    and, once the line is finished, the next report has that record too."""
    path = tmp_path / "live.jsonl"
    records = [META, *(step(0.5 + i, temp_c=60.0 + i) for i in range(5))]
    last = json.dumps(step(6.0, temp_c=70.0)) + "\n"
    with open(path, "w", encoding="utf-8") as writer:
        writer.write("".join(json.dumps(r) + "\n" for r in records) + last[:37])
        writer.flush()
        assert ">live<" in svg_text([path], tmp_path / "partial.svg")
        writer.write(last[37:])
    from edgesdk.thermal.telemetry import load

    assert [r["t"] for r in load(path)[1]] == [0.5, 1.5, 2.5, 3.5, 4.5, 6.0]
    assert ">live<" in svg_text([path], tmp_path / "whole.svg")


def test_meta_only_and_torn_only_files_are_errors_naming_them(tmp_path):
    meta_only = write(tmp_path / "meta.jsonl", [META])
    torn = write(tmp_path / "torn.jsonl", [], tail='{"type":"step","t":0.5,"ki')
    with pytest.raises(EdgeSDKError, match="no step records") as error:
        render([meta_only, torn], tmp_path / "x.png")
    assert str(meta_only) in str(error.value)
    assert str(torn) in str(error.value)
