"""The guard with its CPU clock cap (--clock-cap) at slow decode rates: an answer streams at the capped speed.

On a simulated bare Pi 5 at 35 °C the capped guard's p95 inter-token was 390 ms at 10 tok/s and 285 ms at 15 (147 and
98 ms unguarded): its hold let a request start once the answer fitted at the capped clock's power, but the bucket's
depth was counted at the uncapped power, a third of the tokens that fit, so each answer's last 40 tokens were paced
0.4-0.7 s apart. And an answer started uncapped (the board cooled out of the guard's hot band) was timed at the decode
rate learned capped, 1.3x slower, so the hold took it for longer and hotter than it is.
"""

from __future__ import annotations

import pytest

from edgesdk.profile import get_profile
from edgesdk.thermal.guard import CLOCK_CAP_RATIO, Guard, GuardConfig, Level, Limits
from edgesdk.thermal.plan import simulate
from edgesdk.thermal.sensors import Reading
from edgesdk.thermal.simulator import WorkModel

PI5 = get_profile("rpi5")
ZONE = "cpu-thermal"
CAPPED = GuardConfig(hot_clock_ratio=CLOCK_CAP_RATIO)


def _capped_token_s(decode_tok_s: float) -> float:
    """A decode step's seconds at the capped clock on the simulated board (its clock-bound share slows by f0/f)."""
    return WorkModel(decode_tok_s=decode_tok_s).seconds("decode", 1, CLOCK_CAP_RATIO)


@pytest.mark.parametrize("decode_tok_s", [10.0, 15.0, 20.0])
def test_capped_guard_p95_no_worse_than_unguarded_at_slow_rates(decode_tok_s):
    capped = simulate(PI5, 30, 35.0, True, decode_tok_s, config=CAPPED)
    unguarded = simulate(PI5, 30, 35.0, False, decode_tok_s).summary
    paced = simulate(PI5, 30, 35.0, True, decode_tok_s).summary
    s = capped.summary
    # was 390 / 285 ms at 10 / 15 tok/s; now the p95 gap is one capped step (130 / 86.7 / 65 ms)
    assert s.p95_inter_token_ms <= unguarded.p95_inter_token_ms, (s.p95_inter_token_ms, unguarded.p95_inter_token_ms)
    assert s.p95_inter_token_ms <= 1.05e3 * _capped_token_s(decode_tok_s)
    # the cap still buys its tokens: about 45 % of the unguarded run's, where pacing alone gets 28-32 %
    assert s.tokens >= 1.3 * paced.tokens
    assert s.max_temp_c <= PI5.thermal.soft_limit_c
    assert s.throttle_s == 0
    assert not capped.paused_at_end


def _reading(t: float, temp_c: float) -> Reading:
    return Reading(time=t, zones={ZONE: temp_c}, throttled=None)


def test_answer_held_times_an_uncapped_answer_at_the_uncapped_rate():
    """A request starting uncapped, after answers whose last tokens ran capped: the hold times it at the rate learned
    uncapped (10 tok/s), not at the latest rate of every clock (the capped 7.7 tok/s)."""
    limits, _ = Limits.resolve(PI5.thermal)
    guard = Guard(limits, PI5.thermal_model, CAPPED)
    idle_c = 35.0 + PI5.thermal_model.resistance_c_per_w * PI5.thermal_model.idle_w
    guard.observe(0.0, _reading(0.0, idle_c))  # the ambient taken as 35 °C
    guard.begin(256, 128)
    guard.spend("prefill", 1, 128 / 40.0)
    for _ in range(256):
        guard.spend("decode", 1, 0.1)  # uncapped: 10 tok/s
    guard.observe(1.0, _reading(1.0, 72.5))
    assert guard.level is Level.HOT
    assert guard.clock_ratio == CLOCK_CAP_RATIO
    guard.clock_applied = CLOCK_CAP_RATIO  # as the hook reports the cap the board applied
    for _ in range(256):
        guard.spend("decode", 1, _capped_token_s(10.0))  # capped: 7.7 tok/s
    guard.observe(20.0, _reading(20.0, 67.5))
    guard.clock_applied = None  # the cap given back
    assert guard.level is Level.NORMAL
    assert guard.clock_ratio is None
    guard.begin(256, 128)
    # 128 + 256 tokens uncapped, 28.8 s from 67.5 °C, end at 73.6 °C, under the 74.5 °C bound (at 7.7 tok/s, 36.5 s,
    # 75.1 °C: held)
    assert not guard.answer_held
    guard.observe(21.0, _reading(21.0, 69.0))  # 74.9 °C at the end at 10 tok/s: held
    assert guard.answer_held
