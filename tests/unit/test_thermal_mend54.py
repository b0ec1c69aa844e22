"""Thermal mend 54: a clock cap put off is tried again about once a second, not at every reading of the guard."""

from __future__ import annotations

from edgesdk.thermal.cpufreq import RETRY_INTERVAL_S, CpuFreqCap
from tests.unit.test_thermal54 import make_cooling_device, make_policy, max_khz


class SteppedClock:
    """A monotonic clock that moves only when the test moves it (seconds)."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_cap_put_off_is_tried_again_once_a_second_not_at_every_reading(tmp_path):
    """While a kernel cooling device holds the policy below its ceiling, the cap is put off; the guard asks for it
    again at every reading (each token of a decode), and each call redid the whole pass: every policy's
    scaling_max_freq, its cooling devices and affected_cpus read from sysfs again, per token. It is tried again
    once RETRY_INTERVAL_S has gone by; another ratio, or the restore, is done at once."""
    policy = make_policy(tmp_path, ceiling=1_800_000)  # the kernel's limit, read through scaling_max_freq
    device = make_cooling_device(tmp_path, "cpufreq-cpu0", 3)
    clock = SteppedClock()
    cap = CpuFreqCap(tmp_path, tmp_path / "cache" / "clock-cap.json", clock=clock)
    cap.set_ratio(0.625)
    assert max_khz(policy) == 1_800_000  # put off: nothing written while the kernel limits it

    (device / "cur_state").write_text("0\n")  # the limit lifts
    (policy / "scaling_max_freq").write_text("2400000\n")
    clock.now += RETRY_INTERVAL_S / 2
    cap.set_ratio(0.625)  # the guard's next reading: not tried again yet (no sysfs read, nothing written)
    assert max_khz(policy) == 2_400_000
    clock.now += RETRY_INTERVAL_S / 2
    cap.set_ratio(0.625)  # a second after the try that put it off: tried again, and the cap begins
    assert max_khz(policy) == 1_500_000

    cap.close()
    assert max_khz(policy) == 2_400_000


def test_another_ratio_is_applied_at_once_after_a_cap_was_put_off(tmp_path):
    """Only the retry of the same ratio waits: a new ratio from the guard is a pass of its own, done at once."""
    policy = make_policy(tmp_path, ceiling=1_800_000)
    device = make_cooling_device(tmp_path, "cpufreq-cpu0", 3)
    clock = SteppedClock()
    cap = CpuFreqCap(tmp_path, tmp_path / "cache" / "clock-cap.json", clock=clock)
    cap.set_ratio(0.625)
    (device / "cur_state").write_text("0\n")
    (policy / "scaling_max_freq").write_text("2400000\n")
    cap.set_ratio(0.75)  # the same instant, another ratio
    assert max_khz(policy) == 1_800_000  # 0.75 x 2.4 GHz
    cap.close()
    assert max_khz(policy) == 2_400_000
