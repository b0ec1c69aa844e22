"""The guard's sensor-failure warning over a long run, the clock cap's policies left out or added mid-run, and a
prefill's time at the capped clock: real sysfs trees in tmp_path and the simulated board."""

from __future__ import annotations

import copy
import os

import pytest

from edgesdk.profile import get_profile
from edgesdk.thermal.cpufreq import RESCAN_INTERVAL_S, CpuFreqCap
from edgesdk.thermal.guard import CLOCK_CAP_RATIO, SENSOR_REWARN_S, Guard, GuardConfig, Level, Limits
from edgesdk.thermal.sensors import SysfsThermal
from edgesdk.thermal.simulator import SimulatedBoard, SimulatedSensor, WorkModel
from tests._utils.sysfs import make_cpufreq_policy, make_zone

PROFILE = get_profile("rpi5")  # resume 70, soft 75, hard 78 °C; R 9.5 °C/W, C 25 J/°C, 2.8 to 9.0 W
PI5_KHZ = [1_500_000 + 100_000 * i for i in range(10)]  # 1.5 to 2.4 GHz; the floor is the cap's 1.5 GHz


def ceiling(policy) -> int:
    return int((policy / "scaling_max_freq").read_text())


# -- the sensor-failure warning ------------------------------------------------------------------------------------
class Sensor:
    """One sysfs zone whose ``temp`` can fail (a directory: its read raises, as EIO does) and mend, read on a
    hand-driven clock by the guard."""

    def __init__(self, root):
        self.zone = make_zone(root, 0, "cpu-thermal", "60000\n")
        self.now = 0.0
        self.sysfs = SysfsThermal(root, ["cpu-thermal"], clock=lambda: self.now)
        self.warnings: list[str] = []
        limits, _ = Limits.resolve(PROFILE.thermal, [])
        self.guard = Guard(limits, PROFILE.thermal_model, warn=self.warnings.append)

    def poll(self, seconds: float) -> None:
        for _ in range(round(seconds / 0.5)):
            self.now += 0.5
            self.guard.observe(self.now, self.sysfs.read())

    def fail(self) -> None:
        (self.zone / "temp").unlink()
        (self.zone / "temp").mkdir()

    def mend(self) -> None:
        (self.zone / "temp").rmdir()
        (self.zone / "temp").write_text("60000\n")

    def failed(self) -> list[str]:
        return [w for w in self.warnings if w.startswith("thermal sensor failed")]


def test_a_sensor_that_fails_again_after_reading_for_a_while_is_warned_of_again(tmp_path):
    """A long run: the sensor fails, reads again for minutes, and fails again. The second failure paced the board at
    the fallback rate without a word (the warning was given once per run); a sensor that flaps is still said once."""
    sensor = Sensor(tmp_path)
    sensor.poll(2)
    sensor.fail()
    sensor.poll(5)
    assert not sensor.guard.sensor_ok
    assert len(sensor.failed()) == 1
    sensor.mend()
    sensor.poll(2)  # back for a moment: a flap
    sensor.fail()
    sensor.poll(5)
    assert len(sensor.failed()) == 1
    sensor.mend()
    sensor.poll(SENSOR_REWARN_S + 240)
    assert sensor.guard.sensor_ok
    sensor.fail()
    sensor.poll(5)
    assert not sensor.guard.sensor_ok
    assert sensor.guard.fraction == GuardConfig().fallback_fraction
    assert len(sensor.failed()) == 2, sensor.warnings


# -- the clock cap's policies --------------------------------------------------------------------------------------
def test_a_policy_left_uncapped_beside_capped_ones_is_named_with_why(tmp_path):
    """policy4's ceiling reads no number: the cap went on with policy0 alone and said only "policy0 2.4 GHz", so the
    run looked fully capped while half the CPU ran at full clock."""
    make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, PI5_KHZ)
    other = make_cpufreq_policy(tmp_path, 4, 2_400_000, 1_500_000, PI5_KHZ)
    (other / "scaling_max_freq").write_text("garbage\n")
    cap = CpuFreqCap(tmp_path)
    assert cap.available
    assert cap.describe().endswith("(policy0 2.4 GHz); not capped: policy4: scaling_max_freq unreadable")
    cap.close()


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root may write a read-only file")
def test_a_policy_not_writable_beside_a_writable_one_is_named_with_the_fix(tmp_path):
    make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, PI5_KHZ)
    other = make_cpufreq_policy(tmp_path, 4, 2_400_000, 1_500_000, PI5_KHZ)
    (other / "scaling_max_freq").chmod(0o444)
    cap = CpuFreqCap(tmp_path)
    assert "not capped: policy4: scaling_max_freq not writable (run as root)" in cap.describe()
    cap.close()


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_policy_that_appears_while_capped_is_capped_and_given_back(tmp_path):
    """A CPU brought online mid-run makes its policyN: it was never capped, however long the guard paced."""
    clock = Clock()
    first = make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, PI5_KHZ)
    cap = CpuFreqCap(tmp_path, tmp_path / "cache" / "clock-cap.json", clock=clock)
    cap.set_ratio(CLOCK_CAP_RATIO)
    later = make_cpufreq_policy(tmp_path, 4, 2_400_000, 1_500_000, PI5_KHZ)
    clock.now += RESCAN_INTERVAL_S
    cap.set_ratio(CLOCK_CAP_RATIO)
    assert (ceiling(first), ceiling(later)) == (1_500_000, 1_500_000)
    assert str(later / "scaling_max_freq") in (tmp_path / "cache" / "clock-cap.json").read_text()
    assert "policy4 2.4 GHz" in cap.describe()
    cap.close()
    assert (ceiling(first), ceiling(later)) == (2_400_000, 2_400_000)


def test_a_policy_that_appears_and_cannot_be_capped_is_warned_of_once(tmp_path):
    clock, warnings = Clock(), []
    make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, PI5_KHZ)
    cap = CpuFreqCap(tmp_path, warn=warnings.append, clock=clock)
    cap.set_ratio(CLOCK_CAP_RATIO)
    later = make_cpufreq_policy(tmp_path, 4, 2_400_000, 1_500_000, PI5_KHZ)
    (later / "scaling_max_freq").write_text("garbage\n")
    for _ in range(3):
        clock.now += RESCAN_INTERVAL_S
        cap.set_ratio(CLOCK_CAP_RATIO)
    assert warnings == ["policy4 appeared since the run began (a CPU brought online) but the clock cap leaves it "
                        "uncapped: scaling_max_freq unreadable"]
    assert "not capped: policy4: scaling_max_freq unreadable" in cap.describe()
    cap.close()


def test_a_capped_policy_whose_floor_is_the_cap_is_not_called_pinned_when_a_pass_is_redone(tmp_path):
    """policy4's cluster is offline, so its cap is put off and the pass redone a second later: policy0, capped at its
    1.5 GHz floor (a Pi 5's scaling_min_freq), was then warned of as pinned by jetson_clocks, which it is not."""
    clock, warnings = Clock(), []
    first = make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, PI5_KHZ)
    (first / "affected_cpus").write_text("0 1 2 3\n")
    offline = make_cpufreq_policy(tmp_path, 4, 2_400_000, 1_500_000, PI5_KHZ)
    (offline / "affected_cpus").write_text("\n")
    cap = CpuFreqCap(tmp_path, warn=warnings.append, clock=clock)
    cap.set_ratio(CLOCK_CAP_RATIO)
    clock.now += 2 * RESCAN_INTERVAL_S
    cap.set_ratio(CLOCK_CAP_RATIO)
    assert ceiling(first) == 1_500_000
    assert warnings == []
    cap.close()


# -- a prefill under the cap ---------------------------------------------------------------------------------------
def test_a_capped_prefill_is_timed_at_the_capped_clock(tmp_path):
    """The prefill rate was learned at full clock; under --clock-cap a prefill is compute-bound and takes 1.6x as
    long at the Pi 5's 62.5 %. Its heat was predicted at the capped power but for the uncapped time: a 730-token step
    from 74.25 °C, predicted to end under the bound (soft limit less half a degree), ran 11.7 s, not 7.3 s, and ended
    above it."""
    board = SimulatedBoard.from_profile(PROFILE, 25.0, work=WorkModel(decode_tok_s=10.0, prefill_tok_s=100.0),
                                        firmware=False)
    sensor = SimulatedSensor(board, "cpu-thermal")
    limits, _ = Limits.resolve(PROFILE.thermal, [])
    guard = Guard(limits, PROFILE.thermal_model, GuardConfig(hot_clock_ratio=CLOCK_CAP_RATIO))

    def observe():
        guard.observe(board.now(), sensor.read())
        board.set_ratio(guard.clock_ratio)
        guard.clock_applied = board.cap_ratio

    def step(kind, tokens):
        seconds = board.compute(kind, tokens)
        guard.spend(kind, 1 if kind == "prefill" else tokens, seconds)
        observe()

    observe()
    guard.begin(64, 512)
    step("prefill", guard.prefill_chunk(512))  # at full clock: 100 tok/s learned
    for _ in range(20):
        step("decode", 1)
    board.temp_c = 74.0
    observe()
    for _ in range(20):
        step("decode", 1)  # paced and capped: the capped decode rate learned
    assert guard.level is Level.HOT
    assert board.cap_ratio == CLOCK_CAP_RATIO
    board.temp_c = 74.25
    observe()
    guard.begin(1, 730)
    ran = copy.deepcopy(board)
    ran.compute("prefill", 730)
    assert ran.temp_c > limits.soft_c - 0.5  # it would end above the bound: held
    assert guard.prefill_held
    # a step the guard names runs no longer at the capped clock than the full clock's step bound (7.3 s here)
    step_tokens = guard.prefill_chunk(730)
    assert copy.deepcopy(board).compute("prefill", step_tokens) <= 7.31
