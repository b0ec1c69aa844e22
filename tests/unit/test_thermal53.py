"""Thermal area, review 53: a stale jetson-stats, the telemetry file's wall-clock start, a simulated Jetson's flags."""

from __future__ import annotations

import json
import sys
import types
from datetime import datetime, timezone

import pytest

from edgesdk.profile import get_profile
from edgesdk.thermal.guard import Guard, Limits
from edgesdk.thermal.sensors import Jtop
from edgesdk.thermal.simulator import SimulatedBoard, SimulatedSensor
from edgesdk.thermal.telemetry import Telemetry, load, started_at

ORIN_NANO = get_profile("orin-nano-8gb")
PI5 = get_profile("rpi5")


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def service(monkeypatch):
    """A stand-in for jetson-stats' client as v7.2 behaves: ``attach`` registers an observer that its reader
    thread calls with every new set of stats (``start`` waits for the first); when the service goes away the
    thread stores the error and ends, the last stats stay readable, and ``ok(spin=True)`` raises that error."""

    class FakeJtop:
        last = None

        def __init__(self, interval=1.0):
            self.observers = []
            self.error: Exception | None = None
            self.temperature = {"cpu": {"temp": 71.0, "online": True}, "tj": {"temp": 74.5, "online": True}}
            self.power = {"rail": {"VDD_SOC": {"online": True, "power": 1800}}, "tot": {"power": 9100}}
            self.nvpmodel = types.SimpleNamespace(name="25W", id=1)
            FakeJtop.last = self

        def attach(self, observer):
            self.observers.append(observer)

        def start(self):
            self.update()

        def update(self):  # the reader thread decoded a new set of stats
            for observer in self.observers:
                observer(self)

        def ok(self, spin=False):
            if self.error is not None:
                raise self.error
            return True

        def close(self):
            pass

    module = types.ModuleType("jtop")
    module.jtop = FakeJtop
    monkeypatch.setitem(sys.modules, "jtop", module)
    return FakeJtop


def test_jtop_whose_service_died_is_no_data_not_its_last_stats(service):
    """A dead jtop.service left the client returning its last stats: the guard read 74.5 °C for ever (caught only
    when the frozen-sensor check judged it frozen, 30 s later, and only while the board worked)."""
    clock = FakeClock()
    sensor = Jtop(interval_s=1.0, zones=["cpu-thermal", "tj-thermal"], clock=clock)
    assert sensor.read().max_c == 74.5
    service.last.error = ConnectionError("Lost connection with jtop server")  # what the reader thread stores
    reading = sensor.read()
    assert reading.max_c is None
    assert reading.power_w == {}
    assert reading.nvpmodel is None


def test_jtop_stats_not_renewed_for_three_intervals_are_no_data(service):
    clock = FakeClock()
    sensor = Jtop(interval_s=0.5, zones=["tj-thermal"], clock=clock)
    clock.t += 1.5  # jtop's own limit: ok() gives up after interval x 3
    assert sensor.read().max_c == 74.5
    clock.t += 0.1
    assert sensor.read().max_c is None
    service.last.update()  # the service answers again
    assert sensor.read().max_c == 74.5


def test_telemetry_meta_records_when_the_run_started_in_utc(tmp_path):
    before = datetime.now(timezone.utc).replace(microsecond=0)
    telemetry = Telemetry(tmp_path / "run.jsonl", {"profile": "rpi5"})
    telemetry.step(t=1.0, kind="decode", tokens=1, duration_s=1.0, wait_s=0.0, level="normal")
    telemetry.close()
    after = datetime.now(timezone.utc)
    meta, steps = load(tmp_path / "run.jsonl")
    assert meta["started"].endswith("+00:00")
    assert before <= started_at(meta) <= after
    assert len(steps) == 1


def test_telemetry_files_without_a_start_time_still_read(tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps({"type": "meta", "version": 2, "profile": "rpi5"}) + "\n"
                    + json.dumps({"type": "step", "t": 1.0, "kind": "decode", "tokens": 1}) + "\n")
    meta, steps = load(path)
    assert started_at(meta) is None
    assert len(steps) == 1
    assert started_at({"started": "yesterday"}) is None
    assert started_at({"started": "2026-05-04T15:12:09.512+02:00"}) == datetime(2026, 5, 4, 13, 12, 9, 512000,
                                                                              tzinfo=timezone.utc)


def test_simulated_jetson_reports_no_raspberry_pi_throttle_flags():
    """A simulated Orin past its 99 °C passive trip reported vcgencmd get_throttled bits, which no Jetson has: the
    guard took them for firmware flags ("the firmware reports arm_freq_capped, throttled") and paced at its fixed
    fallback rate, which the real Jetson sensor path (sysfs zones, jetson-stats) never makes it do."""
    board = SimulatedBoard.from_profile(ORIN_NANO, start_c=101.0)
    sensor = SimulatedSensor(board, ORIN_NANO.thermal.zones[0])
    assert board.throttling  # the emulated clock still falls past the trip
    reading = sensor.read()
    assert reading.throttled is None
    guard = Guard(Limits.resolve(ORIN_NANO.thermal, sensor.trips(ORIN_NANO, sensor.zone))[0], ORIN_NANO.thermal_model)
    guard.observe(board.t, reading)
    assert not guard.firmware_limited


def test_simulated_raspberry_pi_keeps_its_throttle_flags():
    board = SimulatedBoard.from_profile(PI5, start_c=83.0)
    reading = SimulatedSensor(board, PI5.thermal.zones[0]).read()
    assert reading.throttled == {"throttled": True, "arm_freq_capped": True}


def test_jtop_stats_are_stale_after_three_of_the_services_intervals_where_another_client_set_a_slower_one(service):
    """jtop's ``interval`` is the service's (another client may have set it slower, "Another jtop set speed to
    ..."): stats 2.5 s old from a service that sends them every 2 s are not stale, though 3 x the 0.5 s asked for
    has passed."""
    clock = FakeClock()
    service.interval = 2.0
    sensor = Jtop(interval_s=0.5, clock=clock)
    clock.t += 2.5
    assert sensor.read().max_c == 74.5
    clock.t += 4.0
    assert sensor.read().max_c is None


def test_a_start_time_written_with_z_reads_on_every_python():
    """Python 3.10's fromisoformat refuses ``...Z``; a hand-written UTC start in that form still reads."""
    assert started_at({"started": "2026-05-04T13:12:09Z"}) == datetime(2026, 5, 4, 13, 12, 9, tzinfo=timezone.utc)


def test_a_service_slowed_after_start_moves_the_stale_limit(service):
    """Another client may slow the service once this sensor runs: the limit follows its interval at each read."""
    clock = FakeClock()
    sensor = Jtop(interval_s=0.5, clock=clock)
    service.last.interval = 2.0
    clock.t += 2.5
    assert sensor.read().max_c == 74.5
