"""Thermal guard review 50.

* A prefill on a board under ``resume_c`` (70 °C on a Pi 5) was never held, whatever the profile's model said it
  would end at: a 4,000-token prompt at 40 tok/s (100 s; the rate ``thermal plan`` models from llama.cpp's TinyLlama
  prompt speed on a Pi 5) started at 69.9 °C ends near 82 °C, past the hard limit and into the firmware's throttle
  (Raspberry Pi documentation, ``frequency-management.adoc``: the Arm cores throttle from 80 °C), though it fits
  under the soft limit from 58 °C and the board idles at 47 °C in a 20 °C room. A prompt that fits from where the
  board settles idle now waits for its start at any level; one too long for any start is held as before.
"""

from __future__ import annotations

from edgesdk.profile import get_profile
from edgesdk.thermal.plan import Workload, simulate
from edgesdk.thermal.sensors import Reading
from tests.unit.test_prefill50 import learned_guard

PROFILE = get_profile("rpi5")  # resume 70 °C, soft 75 °C (a prefill may end at 74.5 °C), hard 78 °C, throttle 80 °C
ZONE = PROFILE.thermal.zones[0]
MODEL = PROFILE.thermal_model
IDLE_20C = 20.0 + MODEL.resistance_c_per_w * MODEL.idle_w  # where a bare Pi 5 settles idle in a 20 °C room




def test_a_prompt_that_fits_from_a_cooler_start_is_held_below_the_resume_point():
    guard = learned_guard(69.9)
    assert guard.level.value == "normal"
    guard.begin(16, 4000)  # 100 s from 69.9 °C: about 82 °C; it fits from about 58 °C
    assert guard.prefill_held  # before the fix: not held below 70 °C
    assert guard.wait_s("prefill") == guard.config.poll_s
    assert guard.holding
    guard.observe(60.0, Reading(time=60.0, zones={ZONE: 57.0}))  # cool enough now: the prefill goes
    assert not guard.prefill_held
    assert guard.wait_s("prefill") == 0.0


def test_a_cool_board_and_a_prompt_too_long_for_any_start_are_not_held_below_the_resume_point():
    guard = learned_guard(55.0)
    guard.begin(16, 4000)  # from 55 °C it ends under 74.5 °C
    assert not guard.prefill_held
    guard = learned_guard(69.9)
    guard.begin(16, 10000)  # 250 s: above the soft limit even from the idle temperature, so not held under 70 °C
    assert not guard.prefill_held
    guard.observe(2.0, Reading(time=2.0, zones={ZONE: 72.0}))
    assert guard.prefill_held  # ... and held above it, as before (up to one time constant)


def test_long_prompts_in_a_cool_room_never_reach_the_firmware_throttle_in_simulation():
    run = simulate(PROFILE, 30, 20.0, True, 10.0, workload=Workload(prompt_tokens=4000, new_tokens=64))
    assert run.board.throttled_s == 0.0  # before the fix: 259 s in the emulated firmware throttle
    assert run.summary.max_temp_c < PROFILE.thermal.soft_limit_c  # before the fix: 81.8 °C
    assert run.summary.paused_s == 0.0  # before the fix: 769 s paused at the hard limit
    assert run.summary.requests >= 5
