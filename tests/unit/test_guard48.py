"""Thermal guard review 48.

A prefill paid the guard's token bucket for the one token it yields (none at all for a pass that yields no token:
an embedding, a perplexity window, ``max_tokens`` 0), not for its compute: a hot board serving prompts was never
paced, only paused at the hard limit. And a prefill is one step the guard cannot look into: a long prompt's prefill
(40 s for 4,000 tokens on a Pi 5) started on a warm board ran it past the hard limit into the firmware's throttle
point (Raspberry Pi documentation, ``frequency-management.adoc``: the Arm cores throttle from 80 °C) before the pause
could act.
"""

from __future__ import annotations

from edgesdk.profile import get_profile
from edgesdk.runtime.hooked_pass import hooked_pass
from edgesdk.thermal.guard import Guard, Limits
from edgesdk.thermal.sensors import Reading
from edgesdk.thermal.simulator import PastHorizon, SimulatedBoard, SimulatedSensor, WorkModel
from edgesdk.thermal.telemetry import Telemetry, summarize
from edgesdk.thermal.watch import HorizonReached, ThermalHook

PROFILE = get_profile("rpi5")  # resume 70 °C, hot from 71.5 °C, setpoint 73 °C, soft 75 °C, hard 78 °C
ZONE = PROFILE.thermal.zones[0]


def hot_guard() -> Guard:
    guard = Guard(Limits.resolve(PROFILE.thermal)[0], PROFILE.thermal_model)
    guard.observe(0.0, Reading(time=0.0, zones={ZONE: 74.0}))
    assert guard.pacing
    assert not guard.paused
    return guard


def test_a_prefill_pays_for_its_compute_time():
    guard = hot_guard()
    guard.begin(4)
    guard.spend("decode", 1, 0.1)  # 10 tok/s unpaced
    guard.observe(0.5, Reading(time=0.5, zones={ZONE: 74.0}))
    before = guard.wait_s("prefill")
    guard.spend("prefill", 1, 20.0)  # a long prompt: 20 s at full power, the heat of 200 decode tokens
    rate = guard.rate_limit_tok_s
    assert guard.wait_s("prefill") - before >= 190 / rate  # before the fix: 1 token's worth


def test_a_pass_that_yields_no_token_is_paced_before_any_decode():
    guard = hot_guard()
    guard.begin(0)
    assert guard.unpaced_tok_s is None
    guard.spend("prefill", 0, 10.0)
    assert guard.wait_s("prefill") > 10.0  # before the fix: 0, never paced


def test_the_status_line_says_a_prompt_only_workload_is_paced():
    guard = hot_guard()
    hook = ThermalHook(SimulatedBoard(PROFILE.thermal_model, 80.0), lambda: None, guard)
    hook.reading = Reading(time=0.0, zones={ZONE: 74.0})
    assert "no pacing" not in hook.status_text()
    assert "pacing at" in hook.status_text()


def embedding_run(prompt_tokens: int, horizon_s: float = 1800.0) -> tuple[float, object, float]:
    """Back-to-back passes of ``prompt_tokens`` (an embeddings server) on a bare Pi 5 at 30 °C, 100 tok/s prefill."""
    board = SimulatedBoard.from_profile(PROFILE, 30.0, work=WorkModel(decode_tok_s=10.0, prefill_tok_s=100.0),
                                        horizon_s=horizon_s)
    sensor = SimulatedSensor(board, ZONE)
    guard = Guard(Limits.resolve(PROFILE.thermal, sensor.trips(PROFILE, ZONE))[0], PROFILE.thermal_model)
    telemetry = Telemetry()
    hook = ThermalHook(board, sensor.read, guard, board, telemetry, horizon_s=horizon_s)
    peak = board.temp_c
    try:
        while True:
            hooked_pass(hook, prompt_tokens, lambda: None)
            hook.end(None)
            peak = max(peak, board.temp_c)
    except (HorizonReached, PastHorizon):
        pass
    return max(peak, board.temp_c), summarize(telemetry.records, horizon_s, board.throttled_s), board.throttled_s


def test_an_embeddings_workload_is_held_under_the_soft_limit_in_simulation():
    peak, summary, throttled_s = embedding_run(1000)  # 10 s passes
    assert peak < PROFILE.thermal.soft_limit_c  # before the fix: 78.6 °C, past the hard limit
    assert "critical" not in summary.levels_s  # before the fix: paused about 1190 of 1800 s
    assert summary.paused_s == 0.0
    assert throttled_s == 0.0
    assert summary.levels_s.get("hot", 0.0) > 1000  # paced, not stopped
    assert summary.requests > 30


def test_long_prompts_never_run_the_board_into_the_firmware_throttle_in_simulation():
    peak, summary, throttled_s = embedding_run(4000, 2400.0)  # 40 s passes
    assert peak < PROFILE.thermal.hard_limit_c  # before the fix: 82.5 °C
    assert throttled_s == 0.0  # before the fix: 330 s in the emulated firmware throttle
    assert "critical" not in summary.levels_s
    assert summary.requests >= 10


def held_guard(temp: float = 74.0) -> Guard:
    """A guard that has learned a 100 tok/s prefill and a 10 tok/s decode, about to prefill 4,000 tokens."""
    guard = hot_guard()
    guard.begin(16, 100)
    guard.spend("prefill", 1, 1.0)
    guard.spend("decode", 1, 0.1)
    guard.observe(0.5, Reading(time=0.5, zones={ZONE: temp}))
    guard.begin(16, 4000)
    return guard


def test_a_long_prefill_waits_for_the_board_to_cool():
    guard = held_guard()
    assert guard.prefill_tok_s == 100.0
    assert guard.wait_s("prefill") == guard.config.poll_s  # 40 s from 74 °C would end near 80 °C
    assert guard.holding
    assert "holding the prompt" in ThermalHook(SimulatedBoard(PROFILE.thermal_model, 80.0), lambda: None,
                                               guard).status_text()
    guard.wait_s("decode")  # only a prefill is held (a decode waits for the bucket only)
    assert not guard.holding
    guard.begin(16, 10)  # a short prompt is not held
    guard.wait_s("prefill")
    assert not guard.holding


def test_a_cool_board_never_holds_a_prefill():
    guard = held_guard(60.0)
    assert guard.level.value == "hot"  # entered hot at 74 °C, still in its dwell
    for t in range(1, 200):  # dwell over: back to normal
        guard.observe(t, Reading(time=t, zones={ZONE: 60.0}))
    guard.begin(16, 4000)
    assert guard.wait_s("prefill") == 0.0


def test_the_hold_ends_after_one_time_constant_on_a_board_that_does_not_cool():
    guard = held_guard()
    tau = PROFILE.thermal_model.resistance_c_per_w * PROFILE.thermal_model.capacity_j_per_c
    t = 0.5
    while guard.wait_s("prefill") == guard.config.poll_s:
        t += guard.config.poll_s
        guard.observe(t, Reading(time=t, zones={ZONE: 74.0}))  # an enclosure too hot to cool: the hold is bounded
        assert t < tau + 2
    assert t >= tau - 1
    assert not guard.holding


def test_a_board_without_a_sensor_does_not_hold_its_first_decode():
    """Before a decode step measured the token rate, a decode is not held (it is the step that measures it)."""
    guard = Guard(Limits.resolve(PROFILE.thermal)[0], PROFILE.thermal_model, has_sensor=False)
    guard.observe(0.0, None)
    guard.begin(256, 10)
    assert guard.wait_s("prefill") == 0.0
    guard.spend("prefill", 1, 0.2)
    assert guard.wait_s("decode") == 0.0
    guard.spend("decode", 1, 0.02)  # 50 tok/s: from here on the fallback pace, 25 tok/s
    assert guard.rate_limit_tok_s == 25.0
