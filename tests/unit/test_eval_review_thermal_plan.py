"""Evaluation and the thermal simulator side: telemetry files that stop being writable, plan and report."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from edgesdk.cli_thermal import MAX_MINUTES, check_plan_size
from edgesdk.errors import EdgeSDKError
from edgesdk.profile import get_profile
from edgesdk.thermal.plan import Workload, simulate
from edgesdk.thermal.telemetry import load

# A process whose files may not grow past LIMIT bytes (RLIMIT_FSIZE, as `ulimit -f`, with SIGXFSZ ignored):
# a write past it fails with EFBIG, as a full disk fails one with ENOSPC.
LIMITED = """
import resource, runpy, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
sys.argv = sys.argv[2:]
if sys.argv[0].endswith(".py"):
    runpy.run_path(sys.argv[0], run_name="__main__")
else:
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def limited(limit: int, target: object, *args, timeout=60) -> subprocess.CompletedProcess:
    """``python -m target ARGS`` (or ``python target.py ARGS``) with files limited to ``limit`` bytes."""
    return subprocess.run([sys.executable, "-c", LIMITED, str(limit), str(target), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ))


WRITER = """
import json, sys
from edgesdk.errors import EdgeSDKError
from edgesdk.thermal.telemetry import Telemetry
telemetry = Telemetry(sys.argv[1], {"profile": "rpi5"}, keep=False)
failed = []
for i in range(200):
    try:
        telemetry.step(t=i * 0.1, kind="decode", tokens=1, duration_s=0.1, wait_s=0.0, level="normal")
    except EdgeSDKError as error:
        failed.append(str(error))
telemetry.close()
print(json.dumps(failed))
"""


def test_a_telemetry_file_that_stops_growing_is_one_clear_error_and_stays_readable(tmp_path):
    path = tmp_path / "run.jsonl"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    proc = limited(3000, script, path)
    assert proc.returncode == 0, proc.stderr  # no OSError traceback, from a step or from close
    failed = json.loads(proc.stdout)
    assert len(failed) == 1, failed  # said once; the steps after it write nothing
    meta, steps = load(path)
    assert meta["profile"] == "rpi5"
    assert 0 < len(steps) < 200
    assert f"telemetry file {path}: cannot write step record {len(steps) + 1} (File too large)" in failed[0]
    assert f"the {len(steps)} step records before it" in failed[0]
    assert "fix:" in failed[0]


def test_plan_whose_telemetry_disk_fills_up_ends_with_an_error_naming_the_file(tmp_path):
    proc = limited(20_000, "edgesdk", "thermal", "plan", "--target", "rpi5", "--decode-tok-s", 35, "--minutes", 1,
                   "--telemetry-dir", tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"error: telemetry file {tmp_path / 'rpi5-25C-guarded.jsonl'}: cannot write step "
                                  "record"), proc.stderr
    assert "fix:" in proc.stderr
    meta, steps = load(tmp_path / "rpi5-25C-guarded.jsonl")  # what was written before it stays readable
    assert meta["label"] == "guarded"
    assert steps


@pytest.mark.parametrize(("decode_tok_s", "prompt_tokens", "new_tokens"), [(35, 1, 1), (35, 128, 256), (1000, 7, 3),
                                                                           (123.4, 1, 2)])
def test_the_longest_plan_the_size_check_suggests_is_accepted(decode_tok_s, prompt_tokens, new_tokens):
    """The fix named a limit rounded to 3 digits, up as often as down: 29.76 min was shown as 29.8, and
    --minutes 29.8 was refused in turn (250,320 steps)."""
    workload = Workload(prompt_tokens, new_tokens)
    with pytest.raises(EdgeSDKError) as refused:
        check_plan_size(MAX_MINUTES, decode_tok_s, "given", workload)
    suggested = float(re.search(r"pass --minutes (\S+) or less", refused.value.fix).group(1))
    check_plan_size(suggested, decode_tok_s, "given", workload)  # accepted
    with pytest.raises(EdgeSDKError):  # and it is the limit to 3 significant digits, not much less
        check_plan_size(suggested * 1.01, decode_tok_s, "given", workload)


def svg_texts(path) -> list[str]:
    """The texts of a figure matplotlib wrote as SVG (each glyph run follows a comment holding its text)."""
    return re.findall(r"<!-- (.*?) -->", path.read_text(encoding="utf-8"))


def test_report_of_runs_that_share_a_label_tells_them_apart_and_titles_every_ambient(tmp_path):
    """Two plans' guarded runs (25 and 35 °C) were both 'guarded' in the legend, under the title of the first
    file alone, 'rpi5 (simulated, ambient 25 °C)'."""
    pytest.importorskip("matplotlib")
    from click.testing import CliRunner

    from edgesdk.cli import main

    profile = get_profile("rpi5")
    files = []
    for ambient in (25.0, 35.0):
        files.append(tmp_path / f"rpi5-{ambient:g}C-guarded.jsonl")
        simulate(profile, 0.5, ambient, True, 35.0, telemetry_path=str(files[-1]), label="guarded")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    out = tmp_path / "both.svg"
    result = CliRunner().invoke(main, ["thermal", "report", str(empty), *map(str, files), "-o", str(out)])
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    texts = svg_texts(out)
    assert "guarded (rpi5-25C-guarded)" in texts
    assert "guarded (rpi5-35C-guarded)" in texts
    assert "guarded" not in texts
    assert "rpi5 (simulated, ambient 25 / 35 °C)" in texts  # not '? (?)' from the empty first file
    assert "firmware throttle 80 °C" in texts  # the limits of a run that is drawn


def test_load_skips_lines_json_refuses_with_other_errors_than_a_decode_error(tmp_path):
    """An integer of more than 4,300 digits raises a plain ValueError and deep nesting a RecursionError,
    not JSONDecodeError: load ended in a traceback (and thermal report with it) instead of skipping them."""
    path = tmp_path / "odd.jsonl"
    step = {"type": "step", "t": 1.0, "kind": "decode", "tokens": 1, "level": "normal", "temp_c": 60.0}
    path.write_text("\n".join([json.dumps({"type": "meta", "profile": "rpi5"}), "7" * 5000,
                               '{"type": "step", "t": ' + "1" * 5000 + "}", "[" * 100_000, json.dumps(step)]) + "\n")
    meta, steps = load(path)
    assert meta["profile"] == "rpi5"
    assert steps == [step]
