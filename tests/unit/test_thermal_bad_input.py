"""``edgesdk thermal plan | report`` on bad, extreme and garbled input: typed errors, no hangs, no tracebacks."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.profile import get_profile
from edgesdk.thermal.plan import Workload, simulate


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="edgesdk")


PLAN = ("thermal", "plan", "--target", "rpi5", "--decode-tok-s", 35)


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


def test_plan_telemetry_file_that_cannot_be_created_is_a_clear_error(tmp_path):
    (tmp_path / "rpi5-25C-guarded.jsonl").mkdir()  # a directory where the telemetry file goes
    result = invoke(*PLAN, "--minutes", 1, "--telemetry-dir", tmp_path)
    assert result.exit_code == 1, result.output
    assert "--telemetry-dir" in result.stderr
    assert "rpi5-25C-guarded.jsonl" in result.stderr
    assert isinstance(result.exception, SystemExit)


def test_a_simulated_board_stops_at_its_horizon():
    from edgesdk.thermal.simulator import PastHorizon, SimulatedBoard

    board = SimulatedBoard.from_profile(get_profile("rpi5"), horizon_s=10.0)
    board.sleep(4.0)
    with pytest.raises(PastHorizon):
        board.sleep(1e300)  # used to be 2e300 slices of 0.5 s
    assert board.t == pytest.approx(10.0)
