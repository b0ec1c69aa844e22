"""Issue 5 acceptance, fast version: 30 simulated minutes on rpi5 at 35 °C, guarded vs unguarded.

Workload: 128-token prompts, 256-token answers, back to back; SmolLM2-135M on a Pi 5 modelled at
35 tok/s decode and 140 tok/s prefill at full clock (edgesdk/thermal/plan.py). The full report,
telemetry and PNG come from ``tests/benchmarks/test_thermal_acceptance.py``.
"""

from __future__ import annotations

import pytest

from edgesdk.profile import get_profile
from edgesdk.thermal.plan import Workload, compare, simulate

PROFILE = get_profile("rpi5")
DECODE_TOK_S = 35.0


@pytest.fixture(scope="module")
def runs():
    return compare(PROFILE, minutes=30, ambient_c=35, decode_tok_s=DECODE_TOK_S)


def test_guard_holds_the_soft_limit_and_the_firmware_never_throttles(runs):
    guarded = runs["guarded"].summary
    assert guarded.max_temp_c <= PROFILE.thermal.soft_limit_c
    assert guarded.throttle_s == 0.0
    assert guarded.paused_s == 0.0  # pacing alone was enough: no critical pause
    assert guarded.requests >= 40
    assert guarded.tokens > 0


def test_unguarded_run_heat_soaks_into_the_firmware_throttle(runs):
    unguarded = runs["unguarded"].summary
    assert unguarded.max_temp_c > PROFILE.thermal.firmware_throttle_c + 5  # past 85 °C: Arm and GPU throttled
    assert unguarded.throttle_s > 0.9 * 1800 - 300  # throttled from minute ~3 to the end


def test_guard_streams_smoother_but_slower(runs):
    guarded, unguarded = runs["guarded"].summary, runs["unguarded"].summary
    assert guarded.p95_inter_token_ms == pytest.approx(1000 / DECODE_TOK_S, rel=0.01)  # full clock, no pacing gaps
    assert unguarded.p95_inter_token_ms > 1.3 * guarded.p95_inter_token_ms
    assert guarded.mean_ttft_s > 10 * unguarded.mean_ttft_s  # the waiting moved before the first token
    assert guarded.tokens < unguarded.tokens


@pytest.mark.xfail(strict=True, reason=(
    "physically out of reach on a bare Pi 5 at 35 °C: the board idles at 62 °C, so holding 75 °C leaves "
    "~1.3 W for work while the firmware, sitting at ~86 °C, spends ~2.5 W more efficiently (lower V); "
    "see the closing note of issue 5"))
def test_issue_criteria_p95_two_times_lower_and_ninety_percent_of_the_tokens(runs):
    guarded, unguarded = runs["guarded"].summary, runs["unguarded"].summary
    assert unguarded.p95_inter_token_ms >= 2 * guarded.p95_inter_token_ms
    assert guarded.tokens >= 0.9 * unguarded.tokens


@pytest.mark.parametrize(("ambient", "think_s"), [(25, 0.0), (40, 0.0), (35, 20.0)])
def test_guard_holds_across_ambients_and_workloads(ambient, think_s):
    run = simulate(PROFILE, 15, ambient, True, DECODE_TOK_S, workload=Workload(think_s=think_s))
    assert run.summary.max_temp_c <= PROFILE.thermal.soft_limit_c
    assert run.summary.throttle_s == 0.0


def test_guard_holds_when_its_thermal_model_is_wrong():
    """The real board has 15 % more thermal resistance and 20 % less heat capacity than the profile says."""
    m = PROFILE.thermal_model
    board = PROFILE.model_copy(update={"thermal_model": m.model_copy(update={
        "resistance_c_per_w": m.resistance_c_per_w * 1.15, "capacity_j_per_c": m.capacity_j_per_c * 0.8})})
    run = simulate(PROFILE, 20, 35, True, DECODE_TOK_S, board_profile=board)
    assert run.summary.max_temp_c <= PROFILE.thermal.soft_limit_c + 0.5
    assert run.summary.throttle_s == 0.0
