"""Thermal, review 62 mends: a clock-cap record over a file that reads no number, the prefill hold at the clock in
force, render() of a directory, a hottest zone lost for good, the legend of a long run, one ambient range check."""

from __future__ import annotations

import json
import math

import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.profile import get_profile
from edgesdk.thermal.cpufreq import recover
from edgesdk.thermal.guard import CLOCK_CAP_RATIO, Guard, GuardConfig, Limits
from edgesdk.thermal.plan import simulate
from edgesdk.thermal.sensors import HOLD_S, Reading, SysfsThermal
from edgesdk.thermal.simulator import SimulatedBoard, WorkModel, check_ambient
from tests._utils.sysfs import make_cpufreq_policy, make_zone

TABLE = [1_500_000, 1_800_000, 2_100_000, 2_400_000]
PI5 = get_profile("rpi5")


def test_a_clock_cap_record_over_a_file_that_reads_no_number_is_left_alone(tmp_path):
    """A record with no held cap: the file read no number (None) and the record no 'held' (None), so the file matched
    the record and recovery wrote the original ceiling over whatever the file now holds."""
    policy = make_cpufreq_policy(tmp_path, 0, 2_400_000, 1_500_000, TABLE)
    (policy / "scaling_max_freq").write_text("garbage\n")
    state = tmp_path / "cache" / "clock-cap.json"
    state.parent.mkdir()
    state.write_text(json.dumps({str(policy / "scaling_max_freq"): {"original": 2_400_000, "written": 1_500_000}}))
    notes = recover(state)
    assert (policy / "scaling_max_freq").read_text() == "garbage\n"
    assert not any("restored" in note for note in notes), notes
    assert not state.exists()


def _reading(t: float, temp_c: float) -> Reading:
    return Reading(time=t, zones={"cpu-thermal": temp_c}, throttled=None)


def test_a_prefill_under_the_clock_cap_is_held_at_the_capped_power():
    """The prefill's hold counted the board at its uncapped power (9 W on a Pi 5) while the guard's clock cap held it
    at 5.9 W: a 2,048-token prompt (51 s at 40 tok/s) from 67 °C was taken to end at 77.4 °C and held for up to RC,
    where at the capped power it ends at 71.7 °C, under the 74.5 °C bound the bucket's depth counts to."""
    limits, _ = Limits.resolve(PI5.thermal)
    guard = Guard(limits, PI5.thermal_model, GuardConfig(hot_clock_ratio=CLOCK_CAP_RATIO))
    model = PI5.thermal_model
    guard.observe(0.0, _reading(0.0, 35.0 + model.resistance_c_per_w * model.idle_w))  # the ambient taken as 35 °C
    guard.begin(256, 128)
    guard.spend("prefill", 1, 128 / 40.0)
    for _ in range(64):
        guard.spend("decode", 1, 0.1)
    guard.observe(1.0, _reading(1.0, 72.5))
    assert guard.clock_ratio == CLOCK_CAP_RATIO
    guard.clock_applied = CLOCK_CAP_RATIO  # as the hook reports the cap the board applied
    for _ in range(64):
        guard.spend("decode", 1, WorkModel(decode_tok_s=10.0).seconds("decode", 1, CLOCK_CAP_RATIO))
    guard.observe(2.0, _reading(2.0, 67.0))
    assert guard.clock_ratio == CLOCK_CAP_RATIO
    guard.begin(256, 2048)
    tau = model.resistance_c_per_w * model.capacity_j_per_c
    kept = math.exp(-2048 / guard.prefill_tok_s / tau)
    capped_end = (35.0 + model.resistance_c_per_w * guard._busy_w) * (1 - kept) + 67.0 * kept
    uncapped_end = (35.0 + model.resistance_c_per_w * model.active_w) * (1 - kept) + 67.0 * kept
    assert capped_end < limits.soft_c - 0.5 < uncapped_end
    assert not guard.prefill_held
    guard.observe(3.0, _reading(3.0, 71.0))  # from 71 °C it ends above the bound at the capped power too: held
    assert guard.prefill_held


def _telemetry(path, count: int):
    """A telemetry file of one guarded run of ``count`` decode steps."""
    meta = {"type": "meta", "version": 2, "profile": "rpi5", "mode": "board", "guarded": True}
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(meta) + "\n")
        for i in range(count):
            handle.write(json.dumps({"type": "step", "kind": "decode", "tokens": 1, "level": "normal",
                                     "t": (i + 1) / 10.0, "temp_c": 60.0 + i / count}) + "\n")
    return path


def test_render_of_a_directory_draws_the_telemetry_files_in_it(tmp_path):
    """The Python API's render() read a directory as a file ('cannot be read (Is a directory)'); only the CLI
    expanded it."""
    pytest.importorskip("matplotlib")
    from edgesdk.thermal.report import render

    runs = tmp_path / "runs"
    runs.mkdir()
    _telemetry(runs / "guarded.jsonl", 20)
    _telemetry(runs / "unguarded.jsonl", 20)
    out = render([runs], tmp_path / "report.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "empty").mkdir()
    with pytest.raises(EdgeSDKError, match="is a directory with no telemetry file"):
        render([tmp_path / "empty"], tmp_path / "x.png")


@pytest.mark.parametrize(("steps", "best"), [(100, True), (12_000, False)])
def test_the_legend_of_a_long_run_goes_in_a_corner(tmp_path, monkeypatch, steps, best):
    """loc='best' tests every point drawn against each place it tries: 3.9 s of a million-point run's render."""
    pytest.importorskip("matplotlib")
    from edgesdk.thermal import report

    saved = {}
    real = report._save_atomically

    def keep(fig, out):
        saved["fig"] = fig
        real(fig, out)

    monkeypatch.setattr(report, "_save_atomically", keep)
    report.render([_telemetry(tmp_path / "run.jsonl", steps)], tmp_path / "run.png")
    legend = saved["fig"].axes[0].get_legend()
    assert (legend._loc == 0) is best  # matplotlib's code of "best"


def test_a_hottest_zone_lost_for_good_is_stood_in_for_by_the_zones_left_plus_its_lead(tmp_path):
    """A hottest zone whose reads failed past the hold left every poll with no data for the rest of the run: the guard
    paced at the fallback rate for good while the other zones read. Past lost_zone_s it goes on with the zones left
    plus the lead the zone had over them (tj-thermal 10 °C above cpu-thermal), said once."""
    orin = get_profile("orin-nano-8gb")  # resume 80, soft 85, hard 90
    cpu = make_zone(tmp_path, 0, "cpu-thermal", "74000\n")
    tj = make_zone(tmp_path, 1, "tj-thermal", "84000\n")
    now = [0.0]
    sysfs = SysfsThermal(tmp_path, ["cpu-thermal", "tj-thermal"], clock=lambda: now[0])
    warnings: list[str] = []
    limits, _ = Limits.resolve(orin.thermal)
    config = GuardConfig()
    guard = Guard(limits, orin.thermal_model, config, warn=warnings.append)

    def poll():
        now[0] += 0.5
        return guard.observe(now[0], sysfs.read())

    poll()
    guard.spend("decode", 1, 0.05)
    (tj / "temp").unlink()
    (tj / "temp").mkdir()  # its reads fail (an OSError, as EIO does)
    while now[0] < 0.5 + HOLD_S + 1.0:
        poll()
    assert not guard.sensor_ok  # lost past the hold, and the hottest: no data
    lost_at = now[0]
    while now[0] < lost_at + config.lost_zone_s - 1.0:
        poll()
        assert not guard.sensor_ok
    assert len(warnings) == 1
    assert "thermal sensor failed" in warnings[0]
    while now[0] < lost_at + config.lost_zone_s + 1.0:
        poll()
    assert guard.sensor_ok
    assert guard.temp_c == 84.0  # cpu-thermal's 74 °C plus tj-thermal's 10 °C lead
    assert guard.state()["lost_margins_c"] == {"tj-thermal": 10.0}
    assert len(warnings) == 2
    assert "tj-thermal (last read 84 °C, 10 °C above the others then)" in warnings[1]
    (cpu / "temp").write_text("70000\n")  # the board cools: the guard sees it
    for _ in range(3):
        poll()
    assert guard.temp_c == 80.0
    assert guard.fraction > config.fallback_fraction or not guard.pacing
    assert len(warnings) == 2  # said once
    (tj / "temp").rmdir()
    (tj / "temp").write_text("79000\n")  # the zone reads again: acted on at once
    poll()
    assert guard.temp_c == 79.0
    assert "lost_margins_c" not in guard.state()


@pytest.mark.parametrize(("ambient", "problem"), [
    (25000, "ambient_c=25000 is not an ambient from -40 to 85 °C, the industrial range a board's parts are rated for "
            "(25000 reads as millidegrees: 25 °C)"),
    (math.nan, "ambient_c=nan is not a finite temperature in °C")])
def test_the_simulated_board_and_the_plan_refuse_an_ambient_in_the_same_words(ambient, problem):
    """plan and the simulated board each had their own ambient check, and the board's named a NaN ambient as out of
    the range; one helper names the caller and the option."""
    with pytest.raises(EdgeSDKError) as board:
        SimulatedBoard.from_profile(PI5, ambient)
    with pytest.raises(EdgeSDKError) as plan:
        simulate(PI5, 1, ambient, True, 20.0)
    assert board.value.problem == f"SimulatedBoard: {problem}"
    assert plan.value.problem == f"simulate: {problem}".replace("ambient_c=25000 is", "ambient_c=25000 (--ambient) is"
                                                                ).replace("nan is", "nan (--ambient) is")
    assert "e.g. ambient_c=35" in board.value.fix
    assert "e.g. ambient_c=35 (--ambient 35)" in plan.value.fix
    with pytest.raises(EdgeSDKError, match=r"check: ambient_c=-41 \(--x\) is not an ambient from -40 to 85"):
        check_ambient(-41, "check", "--x")
