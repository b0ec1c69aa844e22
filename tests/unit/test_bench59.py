"""``edgesdk thermal report`` writing its figure, review 59: an ``--out`` name near NAME_MAX, and a refused report that
left the ``--out`` directories it had made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.test_cli import assert_error, assert_ok, invoke

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _telemetry(path: Path, steps: int = 3) -> Path:
    lines = [{"type": "meta", "profile": "rpi5", "mode": "guarded"}]
    lines += [{"type": "step", "t": float(i + 1), "tokens": 4, "temp_c": 50.0 + i, "level": "normal"}
              for i in range(steps)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.mark.parametrize("letter", ["r", "é"])  # one byte, two bytes in UTF-8
def test_an_out_name_near_name_max_is_written(tmp_path, letter):
    # 251 bytes of name: one the file system takes; the partial file beside it was '.NAME.PID-RANDOM.partial', over
    # 255 bytes, and the report failed with "File name too long"
    name = letter * (247 // len(letter.encode())) + ".png"
    assert len(name.encode()) <= 255
    out = tmp_path / name
    result = invoke("thermal", "report", _telemetry(tmp_path / "run.jsonl"), "-o", out)
    assert_ok(result)
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, "run.jsonl"])  # no partial file left


def test_a_report_refused_for_want_of_steps_makes_no_out_directory(tmp_path):
    result = invoke("thermal", "report", _telemetry(tmp_path / "run.jsonl", steps=0), "-o",
                    tmp_path / "plots" / "day1" / "run.png")
    assert_error(result, "no step records")
    assert not (tmp_path / "plots").exists()


def test_a_new_out_directory_is_still_made_for_a_figure(tmp_path):
    out = tmp_path / "plots" / "day1" / "run.png"
    assert_ok(invoke("thermal", "report", _telemetry(tmp_path / "run.jsonl"), "-o", out))
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_a_long_non_ascii_out_name_is_cut_at_a_whole_character():
    """The partial's name was cut at a byte, halving an é: a name with a lone surrogate, not valid UTF-8."""
    from pathlib import Path

    from edgesdk.thermal.report import PARTIAL_NAME_BYTES, _partial_path

    partial = _partial_path(Path("plots") / ("a" * (PARTIAL_NAME_BYTES - 1) + "é" * 50 + ".png"))
    partial.name.encode("utf-8")  # a lone surrogate would raise here
    assert partial.name.startswith("." + "a" * (PARTIAL_NAME_BYTES - 1) + ".")
