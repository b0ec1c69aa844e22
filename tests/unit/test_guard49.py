"""Thermal guard review 49.

* A prefill no longer than a decode step (a one-token prompt: a regenerated answer, a turn the KV cache holds all but
  the last token of) was held, on a board above the bucket's bound (half a degree under the soft limit), until the
  board cooled under it or for up to one time constant (238 s on a Pi 5), while a decode step at the same temperature
  ran at once; a prompt of 0 tokens was not held at all.
* A prefill's telemetry record said only ``tokens: 1`` and ``tok_s`` = 1 / time to first token: not the prompt tokens
  it computed nor their rate (llama.cpp's ``prompt eval time = ... ms / N tokens (... tokens per second)``,
  llama-server's ``timings.prompt_n`` / ``prompt_per_second``), and the status line printed that 1 / TTFT as the
  run's "tok/s" (0.1 tok/s for a 400-token prompt run at 100 tok/s).
* A critical pause ended only below ``resume_c``: a board that idles above it (a Pi 5 in a 46 °C room idles at
  72.6 °C, over its 70 °C resume point) stayed paused for ever after one excursion to the hard limit, though a guard
  that first read it at that temperature paced it.
"""

from __future__ import annotations

import pytest

from edgesdk.profile import get_profile
from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.hooked_pass import hooked_pass
from edgesdk.thermal.guard import Guard, Limits
from edgesdk.thermal.plan import _StubDecoder
from edgesdk.thermal.sensors import Reading
from edgesdk.thermal.simulator import SimulatedBoard, SimulatedSensor, WorkModel
from edgesdk.thermal.telemetry import Telemetry
from edgesdk.thermal.watch import ThermalHook, settle_time_s

PROFILE = get_profile("rpi5")  # resume 70 °C, hot from 71.5 °C, setpoint 73 °C, soft 75 °C, hard 78 °C
ZONE = PROFILE.thermal.zones[0]


def learned_guard(temp: float) -> Guard:
    """A guard that has learned a 100 tok/s prefill and a 10 tok/s decode, now reading ``temp``."""
    guard = Guard(Limits.resolve(PROFILE.thermal)[0], PROFILE.thermal_model)
    guard.observe(0.0, Reading(time=0.0, zones={ZONE: 60.0}))
    guard.begin(16, 400)
    guard.spend("prefill", 1, 4.0)
    guard.spend("decode", 1, 0.1)
    guard.observe(1.0, Reading(time=1.0, zones={ZONE: temp}))
    assert (guard.prefill_tok_s, guard.unpaced_tok_s) == (100.0, 10.0)
    return guard


@pytest.mark.parametrize("prompt_tokens", [0, 1, 5])
def test_a_prefill_no_longer_than_a_decode_step_is_not_held(prompt_tokens):
    guard = learned_guard(76.0)  # above soft - 0.5, under the hard limit: hot, paced, not paused
    assert guard.level.value == "hot"
    assert not guard.paused
    guard.begin(16, prompt_tokens)
    assert guard.wait_s("prefill") == 0.0  # before the fix: held (poll_s, again and again) for 1 and 5 tokens
    assert not guard.holding
    assert guard.wait_s("decode") == 0.0  # as a decode step at the same temperature


def test_a_short_prefill_on_a_hot_board_goes_before_the_board_cools():
    guard = learned_guard(76.0)
    guard.begin(16, 1)
    t, temp = 1.0, 76.0
    while guard.wait_s("prefill") > 0.0:
        t, temp = t + guard.config.poll_s, temp - 0.05  # an idle Pi 5 cools ~0.1 °C/s from 76 °C
        guard.observe(t, Reading(time=t, zones={ZONE: temp}))
        assert t < 5.0  # before the fix: ~30 s, until the board was under 74.5 °C
    assert not guard.holding


@pytest.mark.parametrize("prompt_tokens", [11, 400, 4000])
def test_a_prefill_longer_than_the_bucket_is_still_held(prompt_tokens):
    guard = learned_guard(76.0)
    guard.begin(16, prompt_tokens)
    assert guard.wait_s("prefill") == guard.config.poll_s
    assert guard.holding


class _Status:
    def __init__(self):
        self.texts: list[str] = []

    def update(self, text: str, level: str | None = None, force: bool = False, paused: bool | None = None,
               streams: bool = False) -> None:
        self.texts.append(text)

    def warn(self, message: str) -> None:
        pass


def simulated_hook() -> tuple[ThermalHook, Telemetry, _Status]:
    board = SimulatedBoard.from_profile(PROFILE, 25.0, work=WorkModel(decode_tok_s=10.0, prefill_tok_s=100.0))
    sensor = SimulatedSensor(board, ZONE)
    guard = Guard(Limits.resolve(PROFILE.thermal, sensor.trips(PROFILE, ZONE))[0], PROFILE.thermal_model)
    telemetry, status = Telemetry(), _Status()
    return ThermalHook(board, sensor.read, guard, board, telemetry, status), telemetry, status


def test_a_prefill_record_says_the_prompt_tokens_it_computed_and_their_rate():
    hook, telemetry, status = simulated_hook()
    generate(_StubDecoder(), [2] * 400, SamplingConfig(max_new_tokens=3), stop_ids=set(), hook=hook)
    prefill, *decodes = [r for r in telemetry.records if r["kind"] != "wait"]
    assert prefill["kind"] == "prefill"
    assert prefill["duration_s"] == pytest.approx(4.0)  # 400 tokens at 100 tok/s on the simulated board
    assert prefill["prompt_tokens"] == 400  # before the fix: no such field
    assert prefill["prompt_tok_s"] == pytest.approx(100.0)
    assert prefill["tokens"] == 1  # the answer's first token: the run's token count is the answer's
    assert sum(r["tokens"] for r in telemetry.records) == 3
    assert all("prompt_tokens" not in r for r in decodes)
    first = status.texts[0]
    assert "prompt 100.0 tok/s" in first
    assert "0.2 tok/s" not in first  # before the fix: 1 / (4 s) printed as the run's rate
    assert any("10.0 tok/s" in text for text in status.texts[1:])  # a decode record's rate, as before


def test_an_embedding_pass_record_says_its_prompt_tokens():
    hook, telemetry, status = simulated_hook()
    hooked_pass(hook, 1000, lambda: None)
    (record,) = telemetry.records
    assert (record["kind"], record["tokens"], record["tok_s"]) == ("prefill", 0, 0.0)
    assert record["prompt_tokens"] == 1000
    assert record["prompt_tok_s"] == pytest.approx(100.0)
    assert "prompt 100.0 tok/s" in status.texts[-1]


TAU_S = PROFILE.thermal_model.resistance_c_per_w * PROFILE.thermal_model.capacity_j_per_c  # 237.5 s


@pytest.mark.parametrize(("idle_c", "paused"), [(72.0, False), (76.9, False), (77.5, True)])
def test_a_pause_ends_after_one_time_constant_on_a_board_that_idles_above_resume(idle_c, paused):
    """A board paused at the hard limit that settles above ``resume_c`` (70 °C) but more than ``hysteresis_c`` under
    the hard limit (78 °C) is paced again after one time constant; one within the hysteresis stays paused."""
    guard = Guard(Limits.resolve(PROFILE.thermal)[0], PROFILE.thermal_model)
    guard.observe(0.0, Reading(time=0.0, zones={ZONE: 79.0}))
    assert guard.paused
    t = 0.0
    while t < TAU_S - 1:
        t += 0.5
        guard.observe(t, Reading(time=t, zones={ZONE: idle_c}))
        assert guard.paused  # never before one time constant
    for _ in range(10):
        t += 0.5
        guard.observe(t, Reading(time=t, zones={ZONE: idle_c}))
    assert guard.paused is paused  # before the fix: paused for ever at 72 and 76.9 °C
    if not paused:
        assert guard.level.value == "hot"  # paced: at the rate controller's floor above the setpoint
        assert guard.pacing


def test_a_simulated_board_in_a_hot_room_generates_again_after_a_pause():
    """A bare Pi 5 at 46 °C ambient idles at 72.6 °C, above the 70 °C resume point: started at 79 °C (past the hard
    limit), the guard pauses it. Before the fix the pause never ended (BoardNeverCooled after 5 RC on a simulated
    board; for ever on a real one); now it ends after one time constant and the answer is paced under the hard
    limit."""
    board = SimulatedBoard.from_profile(PROFILE, 46.0, work=WorkModel(decode_tok_s=10.0, prefill_tok_s=100.0),
                                        start_c=79.0)
    sensor = SimulatedSensor(board, ZONE)
    guard = Guard(Limits.resolve(PROFILE.thermal, sensor.trips(PROFILE, ZONE))[0], PROFILE.thermal_model)
    telemetry = Telemetry()
    hook = ThermalHook(board, sensor.read, guard, board, telemetry, max_pause_s=settle_time_s(board))
    answer, _ = generate(_StubDecoder(), [2] * 16, SamplingConfig(max_new_tokens=8), stop_ids=set(), hook=hook)
    assert len(answer) == 8
    paused = sum(r["wait_s"] for r in telemetry.records if r["kind"] == "wait" and r["paused"])
    assert TAU_S - 1 <= paused <= TAU_S + 1
    after = [r["temp_c"] for r in telemetry.records if r["t"] > paused]
    assert max(after) < PROFILE.thermal.hard_limit_c
