"""Telemetry summaries of multi-token decode steps, the thermal limits' field descriptions, and the clock-cap note."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgesdk.profile import ThermalLimits, get_profile
from edgesdk.thermal.guard import Guard, Level, Limits
from edgesdk.thermal.telemetry import Telemetry, load, summarize
from edgesdk.thermal.watch import ThermalHook, open_session
from tests._utils.sysfs import make_cpufreq_policy, make_zone


class StepClock:
    """A clock that moves only when told: a record's ``t`` is then the compute it booked."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


def decode_records(tmp_path: Path, steps: list[tuple[int, float]]) -> list[dict]:
    """The step records an unguarded run writes for one request: a prefill, then a decode record per
    ``(tokens, compute_s)`` step, as the generation loop reports a prompt-lookup pass (all its tokens at once)."""
    clock = StepClock()
    telemetry = Telemetry(tmp_path / "t.jsonl", {"profile": "rpi5"})
    hook = ThermalHook(clock, lambda: None, telemetry=telemetry)
    hook.begin(4, 16)
    hook.before_step("prefill")
    clock.t += 0.1
    hook.after_step("prefill", 1, 0.1)
    for tokens, seconds in steps:
        hook.before_step("decode")
        clock.t += seconds
        hook.after_step("decode", tokens, seconds)
    telemetry.close()
    return load(tmp_path / "t.jsonl")[1]


def test_a_decode_step_of_three_tokens_is_three_inter_token_gaps(tmp_path):
    """3 tokens in 60 ms (a prompt-lookup pass whose two drafts were taken) are three 20 ms gaps, as llama.cpp's
    ``ms per token`` divides decode time by tokens: not one 60 ms gap that triples the mean and p95."""
    summary = summarize(decode_records(tmp_path, [(1, 0.02), (3, 0.06), (1, 0.02)]))
    assert summary.tokens == 6
    assert summary.mean_inter_token_ms == pytest.approx(20.0)
    assert summary.p95_inter_token_ms == pytest.approx(20.0)


def test_the_inter_token_mean_is_decode_time_over_decoded_tokens(tmp_path):
    """Ten one-token steps of 10 ms and one ten-token pass of 200 ms: 300 ms for 20 tokens, 15 ms a token; the p95
    falls among the pass's 20 ms gaps (half the tokens), where one gap a record put it between 10 and 200 ms."""
    summary = summarize(decode_records(tmp_path, [(1, 0.01)] * 10 + [(10, 0.2)]))
    assert summary.mean_inter_token_ms == pytest.approx(15.0)
    assert summary.p95_inter_token_ms == pytest.approx(20.0)


def test_no_decode_step_has_no_inter_token_figures(tmp_path):
    summary = summarize(decode_records(tmp_path, []))
    assert summary.p95_inter_token_ms is None
    assert summary.mean_inter_token_ms is None
    assert summary.requests == 1


def _description(name: str) -> str:
    return ThermalLimits.model_fields[name].description


def test_each_limit_s_description_names_what_the_guard_does_there():
    """The guard enters warm at resume_c, paces (hot) below the soft limit's setpoint and pauses (critical) at the
    hard limit: each field's description says so, not the level of the field below or above it."""
    profile = get_profile("rpi5")
    guard = Guard(Limits.resolve(profile.thermal)[0], profile.thermal_model)
    limits = profile.thermal
    assert guard.thresholds[Level.WARM] == limits.resume_c
    assert guard.thresholds[Level.CRITICAL] == limits.hard_limit_c
    assert guard.setpoint_c == limits.soft_limit_c - guard.config.setpoint_margin_c
    assert guard.thresholds[Level.HOT] < limits.soft_limit_c
    assert "warm" in _description("resume_c")
    soft = _description("soft_limit_c")
    assert "hot level" in soft
    assert "setpoint_margin_c" in soft
    assert "warm" not in soft
    hard = _description("hard_limit_c")
    assert "critical level" in hard
    assert "pauses" in hard
    assert "paces" not in hard


def test_the_clock_cap_note_says_the_cap_is_a_share_of_the_ceiling_as_it_begins(tmp_path, monkeypatch):
    """A Jetson in a reduced nvpmodel mode: scaling_max_freq 1.5 of 2.4 GHz. The cap is 62.5 % of 1.5 GHz (the
    nearest offered frequency at or above it), not of the 2.4 GHz maximum the note used to name."""
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    table = [600_000 + 100_000 * i for i in range(19)]  # 0.6 to 2.4 GHz
    policy = make_cpufreq_policy(tmp_path / "fs", 0, 1_500_000, 600_000, table)
    make_zone(tmp_path / "thermal", 0, "cpu-thermal", "50000\n")
    session = open_session(get_profile("rpi5"), guard=True, status=False, sysfs_root=str(tmp_path / "thermal"),
                           clock_cap=True, cpufreq_root=str(tmp_path / "fs"))
    try:
        note = next(n for n in session.notes if n.startswith("while pacing"))
        assert "of its maximum" not in note
        assert "62.5% of each policy's scaling_max_freq as the cap begins" in note
        session.cpufreq.set_ratio(0.625)
        assert (policy / "scaling_max_freq").read_text().strip() == "1000000"  # 0.625 x 1.5 GHz = 937.5 MHz, up
    finally:
        session.close()
    assert (policy / "scaling_max_freq").read_text().strip() == "1500000"


def test_a_simulated_board_s_clock_cap_note_names_its_maximum():
    session = open_session(get_profile("rpi5"), guard=True, simulate=True, status=False, clock_cap=True)
    try:
        assert "while pacing, the simulated board's clock is capped at 62.5% of its maximum" in session.notes
    finally:
        session.close()
