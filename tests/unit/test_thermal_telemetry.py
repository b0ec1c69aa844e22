"""Telemetry files as a killed run leaves them: every record written is on disk, and a torn or odd
tail never stops ``load`` (nor ``thermal report``)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.thermal.telemetry import load

STEP = {"t": 0.0, "kind": "decode", "tokens": 1, "duration_s": 0.1, "wait_s": 0.0, "tok_s": 10.0, "temp_c": 70.0,
        "zones": {"cpu-thermal": 70.0}, "level": "normal", "budget": 1.0, "sensor_ok": True}

KILLED_WRITER = """
import json, os, signal, sys
from edgesdk.thermal.telemetry import Telemetry
telemetry = Telemetry(sys.argv[1], {"profile": "rpi5"}, keep=False)
for i in range(int(sys.argv[2])):
    telemetry.step(**{**json.loads(sys.argv[3]), "t": i * 0.1})
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_run_keeps_every_record_it_wrote(tmp_path):
    path = tmp_path / "killed.jsonl"
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(path), "130", json.dumps(STEP)], capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n")
    assert len(text.splitlines()) == 131  # the meta record and 130 steps
    meta, steps = load(path)
    assert meta["profile"] == "rpi5"
    assert len(steps) == 130


def odd_file(tmp_path):
    path = tmp_path / "odd.jsonl"
    lines = [json.dumps({"type": "meta", "version": 1, "profile": "rpi5"}), json.dumps({"type": "step", **STEP}),
             "3", "null", '"text"', "[1, 2]", json.dumps({"type": "step", **STEP, "t": 1.0})]
    path.write_bytes(("\n".join(lines) + "\n").encode() + b'{"type":"step","t":2.0,"zones":{"cpu-th\xff\xfe\x80 garbage')
    return path


def test_load_skips_scalar_lines_and_a_non_utf8_tail(tmp_path):
    meta, steps = load(odd_file(tmp_path))
    assert meta["profile"] == "rpi5"
    assert [s["t"] for s in steps] == [0.0, 1.0]


def test_report_of_a_file_with_a_torn_non_utf8_tail(tmp_path):
    path = odd_file(tmp_path)
    result = CliRunner().invoke(main, ["thermal", "report", str(path), "-o", str(tmp_path / "odd.png")])
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    assert (tmp_path / "odd.png").stat().st_size > 0
