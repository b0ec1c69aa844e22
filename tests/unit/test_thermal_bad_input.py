"""``edgesdk thermal plan | report`` on bad, extreme and garbled input: typed errors, no hangs, no tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.profile import get_profile
from edgesdk.thermal.plan import Workload, simulate
from edgesdk.thermal.report import _rate_series


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="edgesdk")


def edgesdk_cli(*args, timeout=120) -> subprocess.CompletedProcess:
    """``edgesdk ARGS`` in a fresh interpreter, killed after ``timeout`` s (a plan that never ends fails). A fresh
    interpreter compiling edgesdk's modules took 5 s on one core shared nine ways: 20 s left too little room on a
    loaded CI host; these commands answer in under a second, and a plan that hangs still fails."""
    return subprocess.run([sys.executable, "-m", "edgesdk", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))


PLAN = ("thermal", "plan", "--target", "rpi5", "--decode-tok-s", 35)


# --- defect 5: a horizon with no step inside it -----------------------------------------------------------

@pytest.mark.parametrize("minutes", [0.01, 1e-9])
def test_plan_table_of_a_horizon_with_no_step_shows_a_dash(minutes):
    result = invoke(*PLAN, "--minutes", minutes)
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    for label in ("p95 inter-token", "time to first token"):  # no step timed: no figure
        row = next(line for line in result.stdout.splitlines() if label in line)
        assert row.split()[-2:] == ["-", "-"], row
    # the board's own maximum is its starting temperature (SimulatedBoard.peak_c): it still has a figure
    row = next(line for line in result.stdout.splitlines() if "max temperature" in line)
    assert [float(value) for value in row.split()[-2:]] == [pytest.approx(float(row.split()[-1]))] * 2, row


# --- defects 5, 6, 7: NaN, infinite and out-of-range option values ----------------------------------------

@pytest.mark.parametrize(("option", "value"), [
    ("--minutes", "nan"), ("--minutes", "inf"), ("--minutes", 1e5),
    ("--decode-tok-s", "inf"), ("--decode-tok-s", "nan"), ("--decode-tok-s", 1e13), ("--decode-tok-s", 1e-300),
    ("--prefill-tok-s", "inf"), ("--think-s", "inf"), ("--think-s", "nan"),
    ("--ambient", "nan"), ("--ambient", "inf"), ("--ambient", -500), ("--ambient", 1000),
])
def test_plan_refuses_values_that_hang_or_are_not_physical(option, value):
    """Each of these used to hang (an endless loop of 0 s or 0.5 s slices), crash, or print NaN as JSON."""
    args = {"--minutes": 1, option: value}
    proc = edgesdk_cli(*PLAN, *(x for item in args.items() for x in item), "--json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"Invalid value for '{option}'" in proc.stderr
    assert "finite number" in proc.stderr  # what was expected, with its range
    assert "Traceback" not in proc.stderr


def test_ambient_type_is_reusable_and_names_the_fix():
    from edgesdk.cli_thermal import AMBIENT  # for edgesdk run --ambient too

    assert AMBIENT.convert("35", None, None) == 35.0
    option = click.Option(["--ambient"], type=AMBIENT)
    with pytest.raises(click.BadParameter, match=r"nan is out of range.*-40<=x<=85.*e\.g\. --ambient 35"):
        AMBIENT.convert("nan", option, None)


def test_plan_refuses_more_steps_than_it_can_simulate():
    result = invoke(*PLAN, "--minutes", 1440)
    assert result.exit_code == 1, result.output
    assert "simulated steps" in result.stderr
    assert "fix: pass --minutes" in result.stderr


def test_plan_counts_prefill_steps_too():
    """One-token requests at a fast prefill are one step each: 60 million in a minute. Only decode steps
    were counted (35 tok/s, 2,100), and the plan ran for hours."""
    proc = edgesdk_cli(*PLAN, "--minutes", 1, "--prefill-tok-s", 1e6, "--prompt-tokens", 1, "--new-tokens", 1)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "60,000,000 simulated steps" in proc.stderr
    assert "fix: pass --minutes 0.00417 or less" in proc.stderr


def test_a_step_or_an_idle_wait_past_the_horizon_stops_the_board_there():
    """A 100 s prefill and a 1e5 s think time in a 1-minute plan: the board stops at 60 s (it used to
    run every step and the whole sleep in 0.5 s slices, so --decode-tok-s 1e-300 never ended)."""
    profile = get_profile("rpi5")
    run = simulate(profile, 1.0, 25.0, False, 0.01, workload=Workload(4, 4, think_s=1e5))
    assert run.board.t == pytest.approx(60.0)
    run = simulate(profile, 1.0, 25.0, True, 35.0, workload=Workload(8, 8, think_s=1e5))
    assert run.board.t == pytest.approx(60.0)
    assert run.summary.tokens == 8


def test_levels_cover_the_idle_time_up_to_the_horizon():
    profile = get_profile("rpi5")
    for guarded in (True, False):
        summary = simulate(profile, 1.0, 25.0, guarded, 35.0, workload=Workload(128, 256, think_s=100)).summary
        assert sum(summary.levels_s.values()) == pytest.approx(60.0)


def test_plan_says_when_a_run_passes_the_shutdown_point():
    """At 85 °C ambient a bare Pi 5 idles at 111.6 °C, past its 110 °C shutdown: the plan printed tok/s for
    a board that would have switched off, with no word about it."""
    result = invoke(*PLAN, "--minutes", 1, "--ambient", 85, "--json")
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    notes = [n for n in json.loads(result.stdout)["notes"] if "shutdown point 110 °C" in n]
    assert [n.split()[1] for n in notes] == ["guarded", "unguarded"]
    assert "reached 111.6 °C" in notes[0]
    result = invoke(*PLAN, "--minutes", 1, "--ambient", 35, "--json")
    assert json.loads(result.stdout)["notes"] == []


def test_plan_throttle_time_counts_a_throttled_board_cooling_between_requests():
    """Long requests take the board into the throttle, 200 s pauses cool it back: the firmware throttles
    the first ~95 s of each pause. Counted from the step records (a flag read at each step's end, none in
    a pause), those 95 s were lost: 618 s instead of 1,082."""
    run = simulate(get_profile("rpi5"), 30.0, 40.0, False, 35.0, workload=Workload(128, 4096, think_s=200))
    assert run.summary.throttle_s == pytest.approx(run.board.throttled_s)
    assert run.summary.throttle_s == pytest.approx(1082, abs=5)


# --- defect 8: output paths under a file ------------------------------------------------------------------

def test_plan_telemetry_dir_that_is_a_file_is_a_clear_error(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    result = invoke(*PLAN, "--minutes", 1, "--telemetry-dir", afile)
    assert result.exit_code == 1, result.output
    assert f"--telemetry-dir {afile}" in result.stderr
    assert "fix:" in result.stderr
    assert isinstance(result.exception, SystemExit)


def test_plan_telemetry_file_that_cannot_be_created_is_a_clear_error(tmp_path):
    (tmp_path / "rpi5-25C-guarded.jsonl").mkdir()  # a directory where the telemetry file goes
    result = invoke(*PLAN, "--minutes", 1, "--telemetry-dir", tmp_path)
    assert result.exit_code == 1, result.output
    assert "--telemetry-dir" in result.stderr
    assert "rpi5-25C-guarded.jsonl" in result.stderr
    assert isinstance(result.exception, SystemExit)


# --- defects 8, 9, 10, 11: thermal report ------------------------------------------------------------------

def telemetry_file(path: Path, lines: list[object]) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


META = {"type": "meta", "profile": "rpi5", "mode": "simulated", "ambient_c": 25.0,
        "limits": {"soft_c": 75.0, "hard_c": 78.0, "throttle_c": 80.0}}


@pytest.fixture
def run_jsonl(tmp_path) -> Path:
    steps = [{"type": "step", "t": 0.5 * (i + 1), "kind": "decode", "tokens": 1, "temp_c": 60.0 + i / 100,
              "level": "normal"} for i in range(200)]
    return telemetry_file(tmp_path / "run.jsonl", [META, *steps])


def test_report_without_a_suffix_writes_and_prints_a_png(run_jsonl, tmp_path):
    result = invoke("thermal", "report", run_jsonl, "-o", tmp_path / "noext")
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    assert result.stdout.strip() == str(tmp_path / "noext.png")
    assert (tmp_path / "noext.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("out", "message"), [("plot.xyz", "cannot write '.xyz' files"),
                                              (".", "is a directory"), ("afile/x.png", "cannot create the directory")])
def test_report_output_that_cannot_be_written_is_a_clear_error(run_jsonl, tmp_path, out, message):
    (tmp_path / "afile").write_text("x")
    result = invoke("thermal", "report", run_jsonl, "-o", tmp_path / out)
    assert result.exit_code == 1, result.output
    assert "--out" in result.stderr
    assert message in result.stderr
    assert "fix:" in result.stderr
    assert isinstance(result.exception, SystemExit)


@pytest.mark.parametrize("count", [1000, 1003, 1007])
def test_rate_series_has_no_false_drop_in_its_last_bin(count):
    """10 tok/s throughout, ending on, just past and half past a bin edge: every bin reads 10 tok/s."""
    _, rate = _rate_series([{"t": 0.1 * (i + 1), "tokens": 1} for i in range(count)], 1.0)
    assert rate == pytest.approx(10.0, abs=1.5)
    assert rate[-1] == pytest.approx(10.0, abs=0.5)


def test_report_skips_garbled_step_records_and_meta_fields(tmp_path):
    meta = {**META, "ambient_c": "warm", "limits": {"soft_c": None, "hard_c": "78", "throttle_c": 80.0},
            "label": 7}
    lines = [meta,
             {"type": "step", "kind": "decode", "tokens": 1},                 # no t
             {"type": "step", "t": 1.0, "kind": "decode"},                    # no tokens
             {"type": "step", "t": "2", "kind": "decode", "tokens": 1},       # string t
             '{"type": "step", "t": NaN, "kind": "decode", "tokens": 1}',     # NaN t
             {"type": "step", "t": -3, "kind": "decode", "tokens": 1},        # negative t
             {"type": "step", "t": 4.0, "kind": "decode", "tokens": "1"},     # string tokens
             {"type": "step", "t": True, "kind": "decode", "tokens": 1},      # a bool is no time
             *({"type": "step", "t": 0.5 * (i + 1), "kind": "decode", "tokens": 1, "temp_c": "hot",
                "level": ["x"]} for i in range(20))]
    path = telemetry_file(tmp_path / "garbled.jsonl", lines)
    result = invoke("thermal", "report", path, "-o", tmp_path / "g.png")
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    assert (tmp_path / "g.png").stat().st_size > 0
    only_garbled = telemetry_file(tmp_path / "bad.jsonl", lines[:8])
    result = invoke("thermal", "report", only_garbled, "-o", tmp_path / "b.png")
    assert result.exit_code == 1, result.output
    assert "no step records" in result.stderr


def test_report_of_absurd_numbers_and_dollar_signs_renders(tmp_path):
    """A hand-edited file: numbers no run makes (matplotlib cannot scale an axis to them, and numpy cannot
    read a 400-digit integer) are skipped; a label, profile or title with ``$`` is text, not math."""
    meta = {**META, "label": "cost $x^$", "profile": "p$\\frac$", "limits": {"throttle_c": 1e308}}
    steps = [{"type": "step", "t": 0.5 * (i + 1), "kind": "decode", "tokens": 1, "temp_c": 60.0, "level": "normal"}
             for i in range(20)]
    absurd = [{"type": "step", "t": 11.0, "kind": "decode", "tokens": 1e308},
              '{"type": "step", "t": 1%s, "kind": "decode", "tokens": 1}' % ("0" * 400),
              {"type": "step", "t": 12.0, "kind": "decode", "tokens": 1, "temp_c": 1e300}]
    path = telemetry_file(tmp_path / "absurd.jsonl", [meta, *steps, *absurd])
    for title in ((), ("--title", "budget $\\frac$")):
        result = invoke("thermal", "report", path, "-o", tmp_path / "a.png", *title)
        assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
        assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- defect 12: a BUNDLE that is not there ---------------------------------------------------------------

def test_plan_reads_the_bundle_even_with_target_and_rate_given(tmp_path):
    result = invoke(*PLAN, tmp_path / "missing", "--minutes", 1)
    assert result.exit_code == 5, result.output
    assert "does not exist" in result.stderr
    assert "fix:" in result.stderr


def test_a_simulated_board_stops_at_its_horizon():
    from edgesdk.thermal.simulator import PastHorizon, SimulatedBoard

    board = SimulatedBoard.from_profile(get_profile("rpi5"), horizon_s=10.0)
    board.sleep(4.0)
    with pytest.raises(PastHorizon):
        board.sleep(1e300)  # used to be 2e300 slices of 0.5 s
    assert board.t == pytest.approx(10.0)
