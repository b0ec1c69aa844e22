"""The guard's clock cap: cpufreq on a temporary sysfs tree, the guard's request, the simulated
board's clock and power under a cap, and what the cap buys over 30 simulated minutes."""

from __future__ import annotations

import os

import pytest

from edgesdk.profile import get_profile
from edgesdk.thermal.cpufreq import CpuFreqCap
from edgesdk.thermal.guard import CLOCK_CAP_RATIO, Guard, GuardConfig, Limits
from edgesdk.thermal.plan import compare
from edgesdk.thermal.sensors import Reading
from edgesdk.thermal.simulator import SimulatedBoard, WorkModel, power_ratio
from tests._utils.sysfs import make_cpufreq_policy

PROFILE = get_profile("rpi5")
PI5_KHZ = [1_500_000 + 100_000 * i for i in range(10)]  # the Pi 5's table: 1.5 to 2.4 GHz


def ceiling(policy) -> int:
    return int((policy / "scaling_max_freq").read_text())


def test_cap_takes_the_lowest_offered_clock_at_or_above_the_ratio_and_gives_the_ceiling_back(tmp_path):
    policy = make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, PI5_KHZ)
    cap = CpuFreqCap(tmp_path)
    assert cap.available
    assert "policy0 2.4 GHz" in cap.describe()
    cap.set_ratio(CLOCK_CAP_RATIO)
    assert ceiling(policy) == 1_500_000
    cap.set_ratio(0.7)  # 1.68 GHz wanted: the next offered step up
    assert ceiling(policy) == 1_700_000
    cap.set_ratio(None)
    assert ceiling(policy) == 2_400_000


def test_cap_is_relative_to_the_ceiling_found_and_never_raises_it(tmp_path):
    """nvpmodel (or the user) set 2.0 GHz: half of that is asked for, and 2.0 GHz comes back, not 2.4."""
    policy = make_cpufreq_policy(tmp_path, 0, 2_000_000, 1_500_000, PI5_KHZ)
    cap = CpuFreqCap(tmp_path)
    assert cap.policies[0].frequencies[-1] == 2_000_000
    cap.set_ratio(0.8)
    assert ceiling(policy) == 1_600_000
    cap.close()
    assert ceiling(policy) == 2_000_000


def test_a_ceiling_lowered_between_caps_is_the_new_ceiling_and_never_raised(tmp_path):
    """nvpmodel (or the user) lowers the ceiling to 1.2 GHz while the cap is off: the next cap is
    relative to 1.2 GHz, never above it, and its end gives 1.2 GHz back, not the 2.4 GHz of the first."""
    table = [600_000 + 100_000 * i for i in range(19)]  # 0.6 to 2.4 GHz
    policy = make_cpufreq_policy(tmp_path, 0, 2_400_000, 600_000, table)
    cap = CpuFreqCap(tmp_path)
    cap.set_ratio(CLOCK_CAP_RATIO)
    assert ceiling(policy) == 1_500_000
    cap.set_ratio(None)
    assert ceiling(policy) == 2_400_000
    (policy / "scaling_max_freq").write_text("1200000\n")
    cap.set_ratio(CLOCK_CAP_RATIO)
    assert ceiling(policy) == 800_000  # 0.625 x 1.2 GHz, next offered step up
    cap.set_ratio(None)
    assert ceiling(policy) == 1_200_000
    (policy / "scaling_max_freq").write_text("700000\n")  # below what the cap would pick
    cap.set_ratio(0.9)
    assert ceiling(policy) == 700_000
    cap.close()
    assert ceiling(policy) == 700_000


def test_pinned_minimum_is_left_alone(tmp_path):
    """jetson_clocks pins scaling_min_freq to the maximum: capping below it would fight it."""
    policy = make_cpufreq_policy(tmp_path, 0, 1_984_000, 1_984_000, [729_600, 1_190_400, 1_984_000])
    cap = CpuFreqCap(tmp_path)
    before = (policy / "scaling_max_freq").stat().st_mtime_ns
    cap.set_ratio(CLOCK_CAP_RATIO)
    assert ceiling(policy) == 1_984_000
    assert (policy / "scaling_max_freq").stat().st_mtime_ns == before  # not even rewritten


def test_driver_without_a_table_caps_between_its_limits(tmp_path):
    policy = make_cpufreq_policy(tmp_path, 0, 2_000_000, 400_000)
    cap = CpuFreqCap(tmp_path)
    cap.set_ratio(0.5)
    # no scaling_available_frequencies (intel_pstate, amd-pstate, cppc_cpufreq): any kHz value between the limits
    # is a ceiling the driver honours, so the cap is the ratio itself (it used to round up to the maximum: no cap)
    assert ceiling(policy) == 1_000_000
    cap.set_ratio(0.1)  # 0.2 GHz wanted: the hardware minimum
    assert ceiling(policy) == 400_000
    cap.close()
    assert ceiling(policy) == 2_000_000


def test_someone_else_writing_the_ceiling_wins(tmp_path):
    policy = make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, PI5_KHZ)
    warnings = []
    cap = CpuFreqCap(tmp_path, warn=warnings.append)
    cap.set_ratio(CLOCK_CAP_RATIO)
    (policy / "scaling_max_freq").write_text("1800000\n")  # e.g. nvpmodel switched modes
    cap.set_ratio(None)
    assert ceiling(policy) == 1_800_000  # not restored over theirs
    assert "changed to 1800000 kHz by someone else" in warnings[0]
    cap.set_ratio(CLOCK_CAP_RATIO)
    assert ceiling(policy) == 1_800_000  # and never touched again


def test_every_policy_is_capped(tmp_path):
    """Jetson Orin has one policy per CPU cluster."""
    table = [729_600, 1_190_400, 1_497_600, 1_984_000]
    policies = [make_cpufreq_policy(tmp_path, i, 1_984_000, 729_600, table) for i in (0, 4)]
    cap = CpuFreqCap(tmp_path)
    cap.set_ratio(CLOCK_CAP_RATIO)
    assert [ceiling(p) for p in policies] == [1_497_600, 1_497_600]
    cap.close()
    assert [ceiling(p) for p in policies] == [1_984_000, 1_984_000]


def test_a_killed_run_is_undone_by_the_next(tmp_path):
    policy = make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, PI5_KHZ)
    state = tmp_path / "cache" / "clock-cap.json"
    CpuFreqCap(tmp_path, state).set_ratio(CLOCK_CAP_RATIO)  # never closed: the process was killed
    assert ceiling(policy) == 1_500_000
    assert state.exists()
    after = CpuFreqCap(tmp_path, state)
    assert ceiling(policy) == 2_400_000
    assert after.policies[0].ceiling_khz == 2_400_000  # the real ceiling, not the leftover cap
    assert "a previous run was stopped while it capped the clock" in after.notes[0]
    assert not state.exists()


def test_a_leftover_state_file_never_overrides_a_later_setting(tmp_path):
    policy = make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, PI5_KHZ)
    state = tmp_path / "clock-cap.json"
    CpuFreqCap(tmp_path, state).set_ratio(CLOCK_CAP_RATIO)
    (policy / "scaling_max_freq").write_text("2000000\n")  # the user set 2.0 GHz after the crash
    CpuFreqCap(tmp_path, state)
    assert ceiling(policy) == 2_000_000


def test_no_cpufreq_says_so(tmp_path):
    cap = CpuFreqCap(tmp_path)
    assert not cap.available
    assert "no cpufreq policies under" in cap.describe()
    cap.set_ratio(CLOCK_CAP_RATIO)  # nothing to do, no error


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root may write a read-only file")
def test_read_only_ceiling_means_unavailable(tmp_path):
    policy = make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, PI5_KHZ)
    (policy / "scaling_max_freq").chmod(0o444)
    cap = CpuFreqCap(tmp_path)
    assert not cap.available
    assert "not writable (run as root)" in cap.describe()


def test_a_run_that_cannot_cap_leaves_the_clock_to_one_that_can(tmp_path):
    """No cpufreq here (or not root): this run caps nothing, so it must not hold the one-capping-run
    lock; a run that can cap starts while it goes on and is not told another run is capping."""
    from edgesdk.thermal.cpufreq import _held_elsewhere

    state = tmp_path / "cache" / "clock-cap.json"
    state.parent.mkdir()
    cannot = CpuFreqCap(tmp_path / "no-cpufreq", state)
    assert not cannot.available
    assert not _held_elsewhere(state)
    make_cpufreq_policy(tmp_path / "fs", 0, 2_400_000, 1_500_000, PI5_KHZ)
    can = CpuFreqCap(tmp_path / "fs", state)
    assert can.available, can.describe()
    can.close()
    cannot.close()


def test_guard_asks_for_the_cap_only_while_pacing():
    limits, _ = Limits.resolve(PROFILE.thermal)
    guard = Guard(limits, PROFILE.thermal_model, GuardConfig(hot_clock_ratio=CLOCK_CAP_RATIO, min_dwell_s=0.0))
    steps = [(0.0, 60.0, None), (1.0, 71.0, None), (2.0, 73.5, CLOCK_CAP_RATIO), (3.0, 78.5, CLOCK_CAP_RATIO),
             (4.0, 65.0, None)]
    for now, temp, wanted in steps:
        guard.observe(now, Reading(time=now, zones={"cpu-thermal": temp}))
        assert guard.clock_ratio == wanted, (temp, guard.level)
        assert guard.state()["clock_cap"] == wanted
    guard.observe(10.0, None)  # sensor failed: paced at a fixed rate, and capped
    assert guard.clock_ratio == CLOCK_CAP_RATIO
    plain = Guard(limits, PROFILE.thermal_model, GuardConfig())
    plain.observe(0.0, Reading(time=0.0, zones={"cpu-thermal": 74.0}))
    assert plain.pacing
    assert plain.clock_ratio is None


def test_simulated_cap_lowers_clock_and_power_and_is_not_a_throttle():
    board = SimulatedBoard.from_profile(PROFILE, 35.0, start_c=60.0, work=WorkModel(decode_tok_s=10.0))
    board.set_ratio(CLOCK_CAP_RATIO)
    assert board.clock == pytest.approx(CLOCK_CAP_RATIO)
    assert board.compute("decode", 1) == pytest.approx(0.1 * (0.5 / CLOCK_CAP_RATIO + 0.5))  # 1.3x longer
    m = PROFILE.thermal_model
    assert board.power_w == pytest.approx(m.idle_w + (m.active_w - m.idle_w) * power_ratio(CLOCK_CAP_RATIO))
    assert board.throttled_s == 0.0
    assert not board.throttling
    board.set_ratio(0.1)  # cpufreq offers nothing below the lowest operating point
    assert board.clock == pytest.approx(1.5 / 2.4)
    board.set_ratio(None)
    assert board.clock == 1.0


def test_cap_buys_tokens_and_costs_stream_speed_over_30_minutes():
    """rpi5 at 35 °C, back-to-back 128+256-token requests: the same limits are held, and the capped
    guard makes far more tokens than the pacing-only one; its tokens stream slower (1.5 GHz)."""
    paced = compare(PROFILE, 30, 35, 35.0)
    capped = compare(PROFILE, 30, 35, 35.0, config=GuardConfig(hot_clock_ratio=CLOCK_CAP_RATIO))
    p, c = paced["guarded"].summary, capped["guarded"].summary
    assert c.max_temp_c <= PROFILE.thermal.soft_limit_c
    assert c.throttle_s == 0.0
    assert c.paused_s == 0.0
    assert c.tokens > 1.3 * p.tokens
    assert c.mean_ttft_s < p.mean_ttft_s
    assert c.p95_inter_token_ms > 1.2 * p.p95_inter_token_ms
    assert c.tokens < capped["unguarded"].summary.tokens


# A kernel file that reads as a number and that no one, root included, may write (mode 0444 sysctl):
# a scaling_max_freq linked to it stands for a ceiling this process cannot give back.
READ_ONLY_NUMBER = "/proc/sys/kernel/ngroups_max"
needs_read_only_number = pytest.mark.skipif(not os.path.exists(READ_ONLY_NUMBER), reason="needs Linux /proc/sys")


def make_unwritable(policy):
    """Swap the policy's scaling_max_freq for a link to a file nobody can write; returns what it reads."""
    (policy / "scaling_max_freq").unlink()
    (policy / "scaling_max_freq").symlink_to(READ_ONLY_NUMBER)
    return ceiling(policy)


@needs_read_only_number
def test_a_ceiling_that_cannot_be_given_back_stays_recorded_until_one_can(tmp_path):
    """The cap was written, then the ceiling could not be written back (at close, and by the next
    run, not root): the state file keeps the original until a run that can write it gives it back."""
    import json

    stuck_khz = int(open(READ_ONLY_NUMBER).read())
    top = round(stuck_khz / CLOCK_CAP_RATIO)  # the cap picks exactly the read-only number
    policy = make_cpufreq_policy(tmp_path, 0, top, stuck_khz, [stuck_khz, top])
    state = tmp_path / "cache" / "clock-cap.json"
    warnings = []
    cap = CpuFreqCap(tmp_path, state, warn=warnings.append)
    cap.set_ratio(CLOCK_CAP_RATIO)
    assert ceiling(policy) == stuck_khz
    assert make_unwritable(policy) == stuck_khz
    cap.close()
    assert f"still at {stuck_khz} kHz: the next edgesdk run gives {top} kHz back" in warnings[-1]
    assert json.loads(state.read_text()) == {str(policy / "scaling_max_freq"): {"original": top, "written": stuck_khz}}

    notes = CpuFreqCap(tmp_path, state).notes  # the next run cannot write it either
    assert f"could not restore {policy / 'scaling_max_freq'} to {top} kHz" in notes[0]
    assert f"echo {top} | sudo tee {policy / 'scaling_max_freq'}" in notes[0]
    assert state.exists()

    (policy / "scaling_max_freq").unlink()
    (policy / "scaling_max_freq").write_text(f"{stuck_khz}\n")  # writable again (a run as root)
    notes = CpuFreqCap(tmp_path, state).notes
    assert ceiling(policy) == top
    assert "restored policy0 scaling_max_freq" in notes[0]
    assert not state.exists()


CAPPING_RUN = """
import sys
from edgesdk.thermal.cpufreq import CpuFreqCap
cap = CpuFreqCap(sys.argv[1], sys.argv[2])
cap.set_ratio(0.625)
print(cap.available, flush=True)
sys.stdin.read()
"""


def test_a_run_still_capping_keeps_its_cap_and_the_clock_to_itself(tmp_path):
    """Another run (or 'thermal sensors') while a capping run goes on leaves its cap and state alone
    and does not cap too (it would read the cap as the board's ceiling); once that run is killed, the
    next one gives the ceiling back."""
    import subprocess
    import sys

    from edgesdk.thermal.cpufreq import recover

    policy = make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, PI5_KHZ)
    state = tmp_path / "cache" / "clock-cap.json"
    running = subprocess.Popen([sys.executable, "-c", CAPPING_RUN, str(tmp_path), str(state)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert running.stdout.readline().strip() == "True"
        assert ceiling(policy) == 1_500_000
        assert recover(state) == ["the CPU clock is capped by another edgesdk run that is still going; left to it"]
        assert recover(state) == []  # said once
        assert ceiling(policy) == 1_500_000
        assert state.exists()
        second = CpuFreqCap(tmp_path, state)
        assert not second.available
        assert "another edgesdk run that caps the clock is still going" in second.describe()
        second.set_ratio(CLOCK_CAP_RATIO)
        second.close()
        assert ceiling(policy) == 1_500_000
        assert state.exists()
    finally:
        running.kill()  # SIGKILL: no cleanup, the cap and the state file stay
        running.wait(timeout=30)
    assert ceiling(policy) == 1_500_000
    assert "a previous run was stopped while it capped the clock" in recover(state)[0]
    assert ceiling(policy) == 2_400_000
    assert not state.exists()


@pytest.mark.parametrize("content", ["null", "[]", '{"a": 1}', '{"/x": {"original": "2400000"}}'])
def test_a_state_file_this_code_did_not_write_is_ignored(tmp_path, content):
    from edgesdk.thermal.cpufreq import recover

    state = tmp_path / "clock-cap.json"
    state.write_text(content)
    assert recover(state) == []
    assert not state.exists()
