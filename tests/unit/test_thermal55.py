"""edgesdk thermal plan / report: a too-short plan's suggested --minutes, runs of a joined telemetry file with no
step record, and the trip points a simulated board reports to the guard."""

from __future__ import annotations

import json
import re

from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.profile import get_profile
from edgesdk.thermal.plan import simulate
from edgesdk.thermal.report import _named_runs


def _plan(*args: str) -> dict:
    result = CliRunner().invoke(main, ["thermal", "plan", "--target", "rpi5", "--decode-tok-s", "35",
                                       "--prefill-tok-s", "1", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _too_short_note(plan: dict) -> str | None:
    return next((note for note in plan["notes"] if "no step was timed" in note), None)


def test_a_too_short_plan_suggests_more_minutes_than_it_had():
    """A 60-minute plan of 10,000-token prompts at 1 tok/s prefill (10,000 s each) was told to "pass a longer
    --minutes (e.g. --minutes 30 ...)": shorter than the 60 it ran, and its seconds read "3.6e+03"."""
    note = _too_short_note(_plan("--prompt-tokens", "10000", "--minutes", "60"))
    assert note is not None
    suggested = float(re.search(r"pass --minutes (\d+(?:\.\d+)?)", note).group(1))
    assert 60 < suggested <= 1440
    assert "e+" not in note
    assert "3,600 simulated s" in note


def test_the_suggested_minutes_time_three_whole_requests():
    """Passed back, the suggested --minutes times requests: no note, and the last third has tokens."""
    note = _too_short_note(_plan("--prompt-tokens", "1000", "--minutes", "1"))
    suggested = re.search(r"pass --minutes (\d+)", note).group(1)
    assert float(suggested) > 30
    plan = _plan("--prompt-tokens", "1000", "--minutes", suggested)
    assert _too_short_note(plan) is None
    assert plan["unguarded"]["requests"] >= 3
    assert plan["unguarded"]["sustained_tok_s"] > 0


def test_a_prompt_no_day_can_time_says_to_shorten_it():
    note = _too_short_note(_plan("--prompt-tokens", "100000", "--minutes", "60"))
    assert "--prompt-tokens" in note
    assert "--prefill-tok-s" in note
    assert not re.search(r"pass --minutes \d", note)


def _write(path, lines: list[dict]) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_a_run_with_no_step_record_between_two_runs_keeps_its_place(tmp_path):
    """A file that runs append to (serve restarted on the same --telemetry): the run in the middle crashed before
    its first step. It was folded into the next run, which took its number and its legend entry vanished."""
    step = {"type": "step", "kind": "decode", "tokens": 1, "temp_c": 50.0, "level": "normal"}
    path = tmp_path / "serve.jsonl"
    _write(path, [{"type": "meta", "label": "first"}, {**step, "t": 1.0}, {**step, "t": 2.0},
                  {"type": "meta", "label": "crashed"},
                  {"type": "meta", "label": "third"}, {**step, "t": 1.0}])
    runs = _named_runs(path)
    assert [meta["label"] for _, meta, _ in runs] == ["first", "crashed", "third"]
    assert [stem for (stem, _), _, _ in runs] == ["serve run 1", "serve run 2", "serve run 3"]
    assert [len(steps) for _, _, steps in runs] == [2, 0, 1]


def test_a_file_of_one_run_is_still_one_run(tmp_path):
    path = tmp_path / "one.jsonl"
    _write(path, [{"type": "meta", "label": "only"}])
    assert [(stem, meta["label"], steps) for (stem, _), meta, steps in _named_runs(path)] == [("one", "only", [])]


def test_the_guard_reads_the_simulated_boards_trip_points():
    """A board whose firmware throttles at 73 °C (its sysfs passive trip), below the profile's 80 °C: a real guard
    reads that trip and lowers its limits; the simulated one read the profile's trips and let the board throttle
    (585 s of 15 minutes at 35 °C ambient)."""
    profile = get_profile("rpi5")
    board = profile.model_copy(update={"thermal": profile.thermal.model_copy(update={"firmware_throttle_c": 73.0})})
    run = simulate(profile, 15, 35, True, 35.0, board_profile=board)
    assert run.telemetry.meta["limits"]["throttle_c"] == 73.0
    assert run.telemetry.meta["limits"]["soft_c"] < 73.0
    assert run.summary.throttle_s == 0.0
    assert run.summary.max_temp_c < 73.0
