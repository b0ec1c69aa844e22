"""What the reports tell their user, review 45.

* ``edgesdk thermal report`` wrote its figure straight over ``--out``: a full disk or a file-size limit
  while writing left a truncated image where the report rendered before was (now: a new file renamed
  over ``--out`` once whole).
* Overlaid runs whose limits differ (two boards, a board whose trips lowered the profile's) drew the
  first file's limits only, as if they held for every run.
* The bundle report named the sample text's token count from ``p`` while its distribution and
  entropies cover the whole windows only.

The thermal figures are written as SVG with text kept as text, so the tests read what the plot says.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from edgesdk.build import report as build_report

matplotlib = pytest.importorskip("matplotlib")

from edgesdk.thermal.report import render  # noqa: E402  (needs matplotlib)

LIMITS_PI5 = {"resume_c": 70.0, "soft_c": 75.0, "hard_c": 78.0, "throttle_c": 80.0, "shutdown_c": 110.0}
LIMITS_ORIN = {"resume_c": 80.0, "soft_c": 85.0, "hard_c": 90.0, "throttle_c": 99.0, "shutdown_c": 104.5}


def telemetry(path: Path, profile: str, limits: dict, steps: int = 400) -> Path:
    meta = {"type": "meta", "version": 1, "profile": profile, "mode": "board", "guarded": True, "limits": limits}
    records = [meta] + [{"type": "step", "t": 0.1 * (i + 1), "kind": "decode", "tokens": 1, "duration_s": 0.1,
                         "wait_s": 0.0, "tok_s": 10.0, "temp_c": 60.0 + i * 0.01, "level": "normal"}
                        for i in range(steps)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def svg_text(paths: list[Path], out: Path) -> str:
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        return render(paths, out).read_text()


def test_a_write_that_fails_leaves_the_report_rendered_before_whole(tmp_path):
    run = telemetry(tmp_path / "run.jsonl", "rpi5", LIMITS_PI5)
    out = render([run], tmp_path / "run.png")
    before = out.read_bytes()
    assert len(before) > 30_000
    # the same render again under a file-size limit (as a full disk): writing stops at 20,000 bytes
    code = textwrap.dedent(f"""
        import resource
        from edgesdk.errors import EdgeSDKError
        from edgesdk.thermal.report import render
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, resource.RLIM_INFINITY))
        try:
            render([{str(run)!r}], {str(out)!r})
        except EdgeSDKError as error:
            print(error)
        """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert f"--out {out}: cannot write the figure" in result.stdout, result.stdout + result.stderr
    assert out.read_bytes() == before  # not a 20,000-byte torn PNG
    assert "the file there is left as it was" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.jsonl", "run.png"]  # no partial file left


def test_a_new_report_keeps_the_usual_permissions_and_format(tmp_path):
    run = telemetry(tmp_path / "run.jsonl", "rpi5", LIMITS_PI5)
    svg = render([run], tmp_path / "run.svg")
    assert svg.read_text().startswith("<?xml")
    png = render([run], tmp_path / "run")  # no suffix: .png added
    assert png.name == "run.png"
    assert png.read_bytes().startswith(b"\x89PNG")
    assert png.stat().st_mode & 0o777 == svg.stat().st_mode & 0o777 == (tmp_path / "run.jsonl").stat().st_mode & 0o777


def test_runs_with_different_limits_each_show_their_own(tmp_path):
    pi = telemetry(tmp_path / "pi.jsonl", "rpi5", LIMITS_PI5)
    orin = telemetry(tmp_path / "orin.jsonl", "orin-nano-8gb", LIMITS_ORIN)
    svg = svg_text([pi, orin], tmp_path / "both.svg")
    for run, limits in (("pi", LIMITS_PI5), ("orin", LIMITS_ORIN)):
        assert f"{run}: firmware throttle {limits['throttle_c']:g} °C" in svg
        assert f"{run}: hard (pause) {limits['hard_c']:g} °C" in svg
        assert f"{run}: soft limit {limits['soft_c']:g} °C" in svg


def test_runs_that_share_their_limits_show_them_once(tmp_path):
    guarded = telemetry(tmp_path / "guarded.jsonl", "rpi5", LIMITS_PI5)
    unguarded = telemetry(tmp_path / "unguarded.jsonl", "rpi5", LIMITS_PI5)
    svg = svg_text([guarded, unguarded], tmp_path / "both.svg")
    assert svg.count("firmware throttle 80 °C") == 1
    assert ": firmware throttle" not in svg


def test_the_sample_text_s_token_count_is_the_one_its_windows_cover():
    # a held-out slice of 10 tokens: P and the entropies cover its one whole window of 8
    row = {"stage": "power", "sample_power": {"p": [0.1] * 10, "P": [0.125] * 8, "entropy": [2.0794], "window": 8}}
    text = "\n".join(build_report._power_lines(row))
    assert "Power distribution of the first 8 held-out tokens" in text
