"""Thermal review 48: defects a board user would hit in ``edgesdk thermal`` (report, sensors, simulator)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

matplotlib = pytest.importorskip("matplotlib")

from edgesdk.thermal.report import render  # noqa: E402  (needs matplotlib)

META = {"type": "meta", "version": 2, "profile": "rpi5", "mode": "board", "guarded": True, "ambient_c": None,
        "limits": {"resume_c": 70.0, "soft_c": 75.0, "hard_c": 78.0, "throttle_c": 80.0, "shutdown_c": 110.0}}


def _step(t: float, temp_c: float, kind: str = "decode") -> dict:
    return {"type": "step", "t": t, "kind": kind, "tokens": 1, "duration_s": 0.1, "wait_s": 0.0, "tok_s": 10.0,
            "temp_c": temp_c, "zones": {"cpu-thermal": temp_c}, "level": "normal", "budget": 1.0, "sensor_ok": True}


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _svg(paths: list[Path], out: Path) -> str:
    """The figure as SVG with its text kept as text, so the test reads what the legend says."""
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        return render(paths, out).read_text()


def test_a_run_whose_label_starts_with_an_underscore_is_in_the_legend(tmp_path):
    """matplotlib leaves an artist whose label starts with "_" out of an automatic legend; a run recorded
    to ``_warm.jsonl`` (no meta label: its stem is its label) was drawn, but never named in the legend."""
    hidden = _write(tmp_path / "_warm.jsonl", [META, _step(0.5, 60.0, "prefill"), _step(0.6, 61.0)])
    plain = _write(tmp_path / "cool.jsonl", [META, _step(0.5, 50.0, "prefill"), _step(0.6, 51.0)])
    svg = _svg([hidden, plain], tmp_path / "both.svg")
    assert ">_warm<" in svg
    assert ">cool<" in svg
    assert "soft limit 75 °C" in svg  # the limit lines keep their entries


def test_a_plan_s_telemetry_stays_in_its_directory_whatever_the_profile_s_name(tmp_path):
    """A bundle built before profile names had to be plain names carries its profile's name as written; the
    plan's telemetry files are named after it, and a name holding '/' or '..' wrote them outside the directory."""
    from edgesdk.profile import get_profile
    from edgesdk.thermal.plan import compare

    profile = get_profile("rpi5").model_copy(update={"name": "../lab/pi 5"})
    out = tmp_path / "telemetry"
    out.mkdir()
    compare(profile, minutes=0.5, ambient_c=25, decode_tok_s=30.0, telemetry_dir=str(out))
    assert sorted(path.name for path in out.iterdir()) == ["_lab_pi_5-25C-guarded.jsonl",
                                                           "_lab_pi_5-25C-unguarded.jsonl"]
    assert [path.name for path in tmp_path.iterdir()] == ["telemetry"]
