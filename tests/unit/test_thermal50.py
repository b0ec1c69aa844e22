"""Thermal area, review 50: the report, the sensors and the simulator on inputs a board user has."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

matplotlib = pytest.importorskip("matplotlib")

from edgesdk.thermal.report import render  # noqa: E402  (needs matplotlib)

META = {"type": "meta", "version": 2, "profile": "rpi5", "mode": "board", "guarded": True, "ambient_c": None,
        "limits": {"resume_c": 70.0, "soft_c": 75.0, "hard_c": 78.0, "throttle_c": 80.0, "shutdown_c": 110.0}}


def _step(t: float, temp_c: float = 61.5) -> dict:
    return {"type": "step", "t": t, "kind": "decode", "tokens": 1, "duration_s": 0.1, "wait_s": 0.0,
            "tok_s": 10.0, "temp_c": temp_c, "zones": {"cpu-thermal": temp_c}, "level": "normal",
            "budget": 1.0, "sensor_ok": True}


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _svg(paths: list[Path], out: Path) -> str:
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text stays text: the test reads the legend
        return render(paths, out).read_text()


def test_a_file_with_no_step_record_beside_others_keeps_a_legend_entry_saying_so(tmp_path):
    """Overlaying a guarded run and an unguarded one that stopped before its first step drew the guarded run
    alone, with no word about the other file: it read as two runs whose lines coincide."""
    guarded = _write(tmp_path / "g.jsonl", [{**META, "label": "guarded"}, _step(0.5), _step(1.0, 62.0)])
    stopped = _write(tmp_path / "u.jsonl", [{**META, "label": "unguarded", "guarded": False}])
    svg = _svg([guarded, stopped], tmp_path / "both.svg")
    assert ">guarded<" in svg
    assert "unguarded (no step records)" in svg


def test_an_empty_file_sharing_a_label_still_tells_the_runs_apart(tmp_path):
    """Labels are chosen over every file given: two files labelled alike are named by their files even when
    one of them has no step record."""
    first = _write(tmp_path / "first.jsonl", [{**META, "label": "guarded"}, _step(0.5)])
    second = _write(tmp_path / "second.jsonl", [{**META, "label": "guarded"}])
    svg = _svg([first, second], tmp_path / "both.svg")
    assert "guarded (first)" in svg
    assert "guarded (second) (no step records)" in svg
