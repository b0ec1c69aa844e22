"""A zone that fails a read keeps its last good reading for a short hold, and the guard never takes a failed read
of the hottest zone for a cooler board.

A Jetson's ``tj-thermal`` runs about 10 °C above ``cpu-thermal``: one failed read of it (EIO from an I2C sensor,
ENODATA) made the poll's hottest zone ``cpu-thermal``, a 10 °C drop the guard acted on. The failing ``temp`` file
is a directory here (its read fails with an OSError, as an EIO or ENODATA read does) or a missing file.
"""

from __future__ import annotations

import pytest

from edgesdk.profile import get_profile
from edgesdk.thermal.guard import Guard, GuardConfig, Level, Limits
from edgesdk.thermal.sensors import HOLD_S, Combined, SysfsThermal
from tests._utils.sysfs import make_zone

PROFILE = get_profile("orin-nano-8gb")  # resume 80, soft 85, hard 90: hot from 81.5 °C


class Board:
    """``cpu-thermal`` and ``tj-thermal`` on disk, 10 °C apart, and a hand-driven clock."""

    def __init__(self, root):
        self.cpu = make_zone(root, 0, "cpu-thermal", "74000\n")
        self.tj = make_zone(root, 1, "tj-thermal", "84000\n")
        self.now = 0.0
        self.sysfs = SysfsThermal(root, ["cpu-thermal", "tj-thermal"], clock=lambda: self.now)

    def fail_tj(self, how: str = "directory") -> None:
        (self.tj / "temp").unlink()
        if how == "directory":
            (self.tj / "temp").mkdir()

    def mend_tj(self, temp_c: float) -> None:
        if (self.tj / "temp").is_dir():
            (self.tj / "temp").rmdir()
        (self.tj / "temp").write_text(f"{round(temp_c * 1000)}\n")

    def read(self, dt: float):
        self.now += dt
        return self.sysfs.read()


@pytest.fixture
def board(tmp_path):
    return Board(tmp_path)


@pytest.mark.parametrize("how", ["directory", "missing"])
def test_a_failed_read_of_the_hottest_zone_holds_its_last_good_reading(board, how):
    assert board.read(0.5).max_c == 84.0
    board.fail_tj(how)
    reading = board.read(0.5)
    assert reading.zones == {"cpu-thermal": 74.0, "tj-thermal": 84.0}
    assert reading.max_c == 84.0  # was 74.0: the failed read looked like a 10 °C drop
    assert reading.held == {"tj-thermal": 0.5}
    assert reading.lost == {}
    reading = board.read(HOLD_S - 0.5)  # the hold counts from the last good read
    assert reading.max_c == 84.0
    assert reading.held == {"tj-thermal": HOLD_S}


def test_past_the_hold_the_zone_is_no_data_and_its_last_reading_is_kept_as_lost(board):
    board.read(0.5)
    board.fail_tj()
    board.read(0.5)
    reading = board.read(HOLD_S)  # HOLD_S + 0.5 s after the last good read
    assert reading.zones == {"cpu-thermal": 74.0, "tj-thermal": None}
    assert reading.held == {}
    assert reading.lost == {"tj-thermal": 84.0}
    board.mend_tj(85.0)
    reading = board.read(0.5)
    assert reading.zones == {"cpu-thermal": 74.0, "tj-thermal": 85.0}
    assert (reading.held, reading.lost) == ({}, {})


def test_an_offline_zone_and_a_zone_never_read_are_not_held(board):
    board.read(0.5)
    (board.tj / "temp").write_text("-256000\n")  # rail-gated: offline, no failed read
    reading = board.read(0.5)
    assert reading.zones["tj-thermal"] is None
    assert (reading.held, reading.lost) == ({}, {})
    board.fail_tj()  # failing after the offline value: there is no good reading since to hold
    reading = board.read(0.5)
    assert reading.zones["tj-thermal"] is None
    assert (reading.held, reading.lost) == ({}, {})


def test_garbage_text_is_a_failed_read_held_like_an_error(board):
    board.read(0.5)
    (board.tj / "temp").write_text("\x00\x00garbage\n")
    reading = board.read(0.5)
    assert reading.max_c == 84.0
    assert reading.held == {"tj-thermal": 0.5}


def test_combined_sensors_keep_the_held_and_lost_zones(board):
    combined = Combined([board.sysfs], ["sysfs"])
    board.read(0.5)
    board.fail_tj()
    board.now += 0.5
    assert combined.read().held == {"tj-thermal": 0.5}
    board.now += HOLD_S
    assert combined.read().lost == {"tj-thermal": 84.0}


def make_guard(warnings: list[str]) -> Guard:
    limits, _ = Limits.resolve(PROFILE.thermal)
    return Guard(limits, PROFILE.thermal_model, GuardConfig(), warn=warnings.append)


def test_the_guard_never_sees_a_drop_from_a_failed_read_of_the_hottest_zone(board):
    warnings: list[str] = []
    guard = make_guard(warnings)
    assert guard.observe(board.now + 0.5, board.read(0.5)) is Level.HOT
    guard.spend("decode", 1, 0.05)  # unpaced rate known: 20 tok/s
    paced = guard.fraction
    board.fail_tj()
    for _ in range(int(HOLD_S / 0.5)):  # 0.5 s .. HOLD_S after the last good read: within the hold
        guard.observe(board.now + 0.5, board.read(0.5))
        assert guard.temp_c == 84.0  # was 74.0
        assert guard.sensor_ok
        assert guard.level is Level.HOT
        assert guard.fraction <= paced  # the controller did not open up for a cooler board
    state = guard.state()
    assert state["held_zones"] == {"tj-thermal": HOLD_S}
    assert "lost_zones" not in state
    for _ in range(4):  # past the hold: the zone is lost, and it was the hottest
        guard.observe(board.now + 0.5, board.read(0.5))
        assert not guard.sensor_ok
        assert guard.temp_c == 84.0  # the last temperature taken, never the cooler zone's 74 °C
        assert guard.fraction <= min(paced, GuardConfig().fallback_fraction)
        assert guard.pacing
    state = guard.state()
    assert state["lost_zones"] == {"tj-thermal": 84.0}
    assert not state["sensor_ok"]
    assert len(warnings) == 1
    assert "tj-thermal (last read 84 °C)" in warnings[0]
    assert "74 °C" in warnings[0]
    board.mend_tj(83.0)  # the zone reads again: acted on at once
    guard.observe(board.now + 0.5, board.read(0.5))
    assert guard.sensor_ok
    assert guard.temp_c == 83.0
    assert "held_zones" not in guard.state()
    assert "lost_zones" not in guard.state()


def test_the_hottest_zone_lost_stays_unknown_when_the_zones_left_warm_past_its_last_reading(board):
    warnings: list[str] = []
    guard = make_guard(warnings)
    guard.observe(board.now + 0.5, board.read(0.5))
    board.fail_tj()
    board.read(HOLD_S + 0.5)
    (board.cpu / "temp").write_text("84500\n")  # the CPU warms past tj's last reading; tj is hotter still
    guard.observe(board.now + 0.5, board.read(0.5))
    assert not guard.sensor_ok
    assert "the hottest zone then" in warnings[0]


def test_a_cooler_zone_lost_changes_nothing(board):
    warnings: list[str] = []
    guard = make_guard(warnings)
    guard.observe(board.now + 0.5, board.read(0.5))
    (board.cpu / "temp").unlink()
    board.read(0.5)
    reading = board.read(HOLD_S + 0.5)
    assert reading.lost == {"cpu-thermal": 74.0}
    guard.observe(board.now + 0.5, reading)
    assert guard.sensor_ok
    assert guard.temp_c == 84.0
    assert warnings == []
    assert guard.state()["lost_zones"] == {"cpu-thermal": 74.0}


def test_an_unguarded_run_s_records_say_which_zone_is_held(board):
    """The guard's state carries held_zones into each step record; a run without a guard wrote the held value as an
    ordinary reading."""
    from edgesdk.runtime.hooked_pass import hooked_pass
    from edgesdk.thermal.simulator import SimulatedBoard
    from edgesdk.thermal.telemetry import Telemetry
    from edgesdk.thermal.watch import ThermalHook

    clock = SimulatedBoard.from_profile(PROFILE, 30.0)
    board.now = clock.now()
    board.sysfs.clock = clock.now
    assert board.sysfs.read().max_c == 84.0  # a good reading of tj-thermal
    board.fail_tj()
    telemetry = Telemetry()
    hook = ThermalHook(clock, board.sysfs.read, None, None, telemetry)
    hooked_pass(hook, 4, lambda: clock.sleep(0.1))
    hook.end(None)
    steps = [record for record in telemetry.records if record.get("level") == "unguarded"]
    assert steps
    assert all(record["zones"]["tj-thermal"] == 84.0 for record in steps)
    assert all(set(record["held_zones"]) == {"tj-thermal"} for record in steps)
