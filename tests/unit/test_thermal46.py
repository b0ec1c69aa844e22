"""Thermal guard review 46: a bad read of the hottest zone (0 °C from a glitching sensor) is no data, not a cold board.

Linux sysfs thermal zones and the Raspberry Pi firmware mailbox can answer a read with a wrong value; a board
cannot cool by tens of degrees between two polls (rpi5 RC = 238 s). Before the fix a single 0 °C read lifted a
critical pause and dropped a hot board to normal, and a sensor glitching every few polls wound the rate
controller's integral up until the board ran unpaced into the hard limit.
"""

from __future__ import annotations

from edgesdk.profile import get_profile
from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.thermal.guard import Guard, Limits
from edgesdk.thermal.plan import _StubDecoder
from edgesdk.thermal.sensors import Reading
from edgesdk.thermal.simulator import PastHorizon, SimulatedBoard, SimulatedSensor, WorkModel
from edgesdk.thermal.telemetry import Telemetry, summarize
from edgesdk.thermal.watch import HorizonReached, ThermalHook

PROFILE = get_profile("rpi5")  # resume 70 °C, hot from 71.5 °C, setpoint 73 °C, soft 75 °C, critical at 78 °C
ZONE = PROFILE.thermal.zones[0]


def make_guard(warnings: list[str] | None = None) -> Guard:
    limits, _ = Limits.resolve(PROFILE.thermal)
    return Guard(limits, PROFILE.thermal_model, warn=None if warnings is None else warnings.append)


class Feed:
    """Observes one reading per poll (0.5 s apart) on the guard."""

    def __init__(self, guard: Guard):
        self.guard, self.t = guard, 0.0

    def __call__(self, temp: float, *, same_reading: Reading | None = None) -> Reading:
        self.t += 0.5
        reading = same_reading or Reading(time=self.t, zones={ZONE: temp}, source="sysfs")
        self.guard.observe(self.t, reading)
        return reading


def test_a_single_zero_read_does_not_lift_a_critical_pause():
    warnings: list[str] = []
    guard = make_guard(warnings)
    feed = Feed(guard)
    for _ in range(40):  # 20 s at 79 °C: critical, past the 10 s dwell
        feed(79.0)
    assert guard.paused
    feed(0.0)
    assert guard.paused
    assert guard.level.value == "critical"
    assert guard.temp_c == 79.0
    assert any("held as a bad read" in w and "0 °C" in w for w in warnings)
    feed(79.0)
    assert guard.paused


def test_glitches_every_other_poll_do_not_wind_up_the_rate_controller():
    clean, glitchy = make_guard(), make_guard()
    feed_clean, feed_glitchy = Feed(clean), Feed(glitchy)
    for _ in range(40):
        feed_clean(73.5)
        feed_glitchy(73.5)
    for i in range(40):
        feed_clean(73.5)
        feed_glitchy(0.0 if i % 2 else 73.5)
    assert glitchy.level.value == "hot"
    assert glitchy.pacing
    # the bad reads change nothing: the controller holds the rate it holds on the clean sensor
    assert abs(glitchy.fraction - clean.fraction) < 1e-9
    assert abs(glitchy._integral - clean._integral) < 1e-9


def test_a_real_drop_is_taken_once_a_second_reading_confirms_it():
    guard = make_guard()
    feed = Feed(guard)
    for _ in range(40):
        feed(79.0)
    first = feed(50.0)
    assert guard.paused  # one poll at the hotter value: the safe side
    feed(50.0, same_reading=first)  # the same reading observed again (a step between two polls) confirms nothing
    assert guard.paused
    feed(50.5)
    assert not guard.paused
    assert guard.level.value == "normal"
    assert guard.temp_c == 50.5


def test_small_drops_and_rises_are_taken_at_once():
    guard = make_guard()
    feed = Feed(guard)
    for _ in range(40):
        feed(79.0)
    feed(100.0)  # a rise: taken (hot is the safe side)
    assert guard.temp_c == 100.0
    feed(85.0)  # 15 °C down, inside max_drop_c
    assert guard.temp_c == 85.0


def glitchy_run(every: int) -> tuple[float, dict]:
    """20 simulated minutes of back-to-back requests on a bare Pi 5 at 30 °C; every ``every``-th read is 0 °C."""
    board = SimulatedBoard.from_profile(PROFILE, 30.0, work=WorkModel(decode_tok_s=10.0), horizon_s=1200)
    sensor = SimulatedSensor(board, ZONE)
    reads = [0]

    def read() -> Reading:
        reads[0] += 1
        reading = sensor.read()
        if every and reads[0] % every == 0:
            reading.zones[ZONE] = 0.0
        return reading

    guard = Guard(Limits.resolve(PROFILE.thermal, sensor.trips(PROFILE, ZONE))[0], PROFILE.thermal_model)
    telemetry = Telemetry()
    hook = ThermalHook(board, read, guard, board, telemetry, horizon_s=1200)
    peak = board.temp_c
    try:
        while True:
            generate(_StubDecoder(), [2] * 64, SamplingConfig(max_new_tokens=256), stop_ids=set(), hook=hook)
            peak = max(peak, board.temp_c)
    except (HorizonReached, PastHorizon):
        pass
    return max(peak, board.temp_c), summarize(telemetry.records, 1200, board.throttled_s).levels_s


def test_a_glitching_sensor_keeps_the_board_under_the_soft_limit_in_simulation():
    clean_peak, clean_levels = glitchy_run(0)
    peak, levels = glitchy_run(2)
    assert clean_peak < PROFILE.thermal.soft_limit_c
    assert peak < PROFILE.thermal.soft_limit_c  # before the fix: up to the 78 °C hard limit, 220 s critical
    assert "critical" not in levels


# -- the CPU clock cap on a cpufreq driver without a frequency table ---------------------------------------------
# intel_pstate, amd-pstate and cppc_cpufreq list no scaling_available_frequencies; their scaling_max_freq takes any
# kHz value between cpuinfo_min_freq and the ceiling. The cap rounded the wanted clock up to the next "offered"
# value, which for such a driver was the ceiling itself: --clock-cap said it was capping and capped nothing.


def test_clock_cap_lowers_a_driver_without_a_table_to_the_ratio(tmp_path):
    from edgesdk.thermal.cpufreq import CpuFreqCap
    from edgesdk.thermal.guard import CLOCK_CAP_RATIO
    from tests._utils.sysfs import make_cpufreq_policy

    policy = make_cpufreq_policy(tmp_path, 0, 4_200_000, 800_000)  # an intel_pstate laptop: no table
    cap = CpuFreqCap(tmp_path)
    cap.set_ratio(CLOCK_CAP_RATIO)
    assert int((policy / "scaling_max_freq").read_text()) == 2_625_000
    cap.close()
    assert int((policy / "scaling_max_freq").read_text()) == 4_200_000


def test_clock_cap_without_a_table_stays_at_or_above_the_floor(tmp_path):
    from edgesdk.thermal.cpufreq import CpuFreqCap
    from tests._utils.sysfs import make_cpufreq_policy

    policy = make_cpufreq_policy(tmp_path, 0, 3_000_000, 2_000_000)  # scaling_min_freq 2.0 GHz
    (policy / "cpuinfo_min_freq").write_text("400000\n")
    cap = CpuFreqCap(tmp_path)
    cap.set_ratio(0.5)  # 1.5 GHz wanted, below scaling_min_freq: the kernel would refuse it
    assert int((policy / "scaling_max_freq").read_text()) == 2_000_000
    cap.close()
    assert int((policy / "scaling_max_freq").read_text()) == 3_000_000
