"""Thermal guard: its power model follows the FFN blocks the power gate ran (at compute budget 1.0 too), and the
frozen-sensor check still judges a run under a compute budget below 1."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.power.controller import ControllerConfig, TauController
from edgesdk.profile import get_profile
from edgesdk.thermal.guard import Guard, Level, Limits
from edgesdk.thermal.sensors import Reading
from edgesdk.thermal.simulator import SimulatedBoard, SimulatedSensor

RPI5 = get_profile("rpi5")
MODEL = RPI5.thermal_model
MAX_CONTEXT = 32


def _limits() -> Limits:
    return Limits.resolve(RPI5.thermal, SimulatedSensor.trips(RPI5))[0]


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    """A real gated backend (a tiny llama with power adapters), gating on."""
    from edgesdk.export.onnx_export import ExportConfig, export_model
    from edgesdk.runtime.ort_gated_backend import OrtGatedBackend
    from tests.unit.test_power_export import _gated_model

    folder = tmp_path_factory.mktemp("gated")
    model, _, _ = _gated_model("llama-gqa")
    spec = export_model(model, folder, ExportConfig(form="ort-fused", max_context=MAX_CONTEXT)).to_json()
    backend = OrtGatedBackend(folder / "model.onnx", spec, threads=1)
    yield backend
    backend.close()


def _configure(backend, compute_budget: float) -> None:
    backend.configure(backend.controller_config(None, compute_budget))
    backend.set_compute_budget(1.0)  # no thermal limit left from another test
    backend.gating = True
    backend.fixed_tau = None


class _Decoder:
    """Decodes one token at a time on the real backend, starting a new sequence when the cache is full."""

    def __init__(self, backend):
        self.backend, self.length = backend, MAX_CONTEXT

    def step(self) -> None:
        if self.length >= MAX_CONTEXT - 1:
            self.backend.reset()
            self.backend.prefill(np.arange(5, 9, dtype=np.int64))
            self.length = 4
        self.backend.decode(10 + self.length)
        self.length += 1


def _measured_fraction(backend) -> float:
    """The share of FFN blocks the gate runs over a few sequences, as its statistics count them."""
    decoder, run, total = _Decoder(backend), 0, 0
    for _ in range(3 * MAX_CONTEXT):
        decoder.step()
        if decoder.length == MAX_CONTEXT - 1:
            stats = backend.stats()
            run, total = run + stats["blocks_total"] - stats["blocks_skipped"], total + stats["blocks_total"]
    return run / total


def _gated_board(fraction: float, start_c: float | None = None) -> SimulatedBoard:
    """A bare Pi 5 in a 20 °C room whose decode runs ``fraction`` of the FFN blocks: that share of the dynamic
    power (the thermal simulator models no gate)."""
    dynamic = fraction * (MODEL.active_w - MODEL.idle_w)
    return SimulatedBoard(MODEL.model_copy(update={"active_w": MODEL.idle_w + dynamic}),
                          RPI5.thermal.firmware_throttle_c, ambient_c=20.0, start_c=start_c)


def _run(guard: Guard, board: SimulatedBoard, read, until_s: float, decoder: _Decoder | None = None) -> None:
    """Decode half the time (0.5 s steps, 0.5 s between them) as the guard allows, reading the sensor each poll."""
    guard.observe(board.t, read())
    while board.t < until_s:
        wait = guard.wait_s("decode")
        if wait > 0:
            board.sleep(min(wait, guard.config.poll_s))
        else:
            if decoder is not None:
                decoder.step()
            board.compute("decode", 1, 0.5)  # WorkModel without rates: the measured 0.5 s
            guard.spend("decode", 5, 0.5)
            board.sleep(0.5)
        guard.observe(board.t, read())


def test_the_gated_backend_reports_the_share_of_ffn_blocks_it_ran(gated):
    _configure(gated, 1.0)
    gated.reset()
    assert gated.executed_fraction is None  # no decode step in this sequence yet
    gated.prefill(np.arange(5, 9, dtype=np.int64))
    assert gated.executed_fraction is None  # a prompt's blocks are not counted
    gated.decode(10)
    assert gated.executed_fraction == float(np.mean(gated.controller.executed))
    gated.gating = False  # every block runs
    gated.reset()
    gated.prefill(np.arange(5, 9, dtype=np.int64))
    for token in range(10, 20):
        gated.decode(token)
    assert gated.executed_fraction == 1.0
    gated.gating = True


def test_at_compute_budget_1_the_power_model_follows_the_blocks_the_gate_ran(gated):
    """At ``--compute-budget`` 1.0 the gate's entropy loop still skips FFN blocks (about half of them on this
    model), so the board draws far less than the profile's active power. The guard modelled the power from the
    budget it was handed (1.0: every block), so its ambient re-estimate took the slower warming for a colder room:
    3.6 °C for a bare Pi 5 in a 20 °C room after 15 minutes, and every heating prediction made from it (the bucket's
    depth, a held prefill, a prefill step's length) fell short by that much."""
    _configure(gated, 1.0)
    fraction = _measured_fraction(gated)
    assert 0.2 < fraction < 0.8  # the gate skips blocks at budget 1.0
    board = _gated_board(fraction)
    warnings: list[str] = []
    guard = Guard(_limits(), MODEL, budget_target=gated, warn=warnings.append)
    assert guard.compute_budget == 1.0  # read from the gate, not handed

    def read() -> Reading:
        return Reading(board.t, {"cpu-thermal": float(round(board.temp_c))}, source="sysfs cpu-thermal")

    _run(guard, board, read, 900.0, _Decoder(gated))
    assert abs(guard.ambient_c - board.ambient_c) < 2.0
    assert warnings == []
    assert guard.sensor_ok
    assert guard.level is Level.NORMAL
    assert not guard.pacing


def test_the_guard_reads_the_budget_set_on_the_gate_as_it_stands(gated):
    _configure(gated, 0.6)
    guard = Guard(_limits(), MODEL, budget_target=gated)
    assert guard.compute_budget == 0.6
    assert guard.budget_in_force == 0.6
    _configure(gated, 0.4)  # configure() replaces the controller and its settings
    assert guard.budget_in_force == 0.4
    assert Guard(_limits(), MODEL, budget_target=TauController(ControllerConfig(compute_budget=0.3))).compute_budget \
        == 0.3
    assert Guard(_limits(), MODEL).budget_in_force == 1.0  # no gate in use


def test_a_frozen_sensor_is_found_under_a_compute_budget_below_1(gated):
    """``--compute-budget 0.5``: the frozen-sensor check was skipped for the whole run, so a sensor stuck at the cold
    board's first reading (20 °C) was trusted while the board heated: never paced. With the blocks the gate ran in
    the power model, the run is judged and the stuck sensor found within a couple of minutes."""
    _configure(gated, 0.5)
    fraction = _measured_fraction(gated)
    board = _gated_board(fraction, start_c=20.0)
    warnings: list[str] = []
    guard = Guard(_limits(), MODEL, budget_target=gated, warn=warnings.append)  # the budget read from the gate
    assert guard.budget_in_force == 0.5

    def read() -> Reading:  # stuck at the first reading
        return Reading(board.t, {"cpu-thermal": 20.0}, source="sysfs cpu-thermal")

    _run(guard, board, read, 180.0, _Decoder(gated))
    assert not guard.sensor_ok
    assert guard.frozen_s is not None
    assert len(warnings) == 1
    assert "frozen" in warnings[0]
    assert "20 °C" in warnings[0]
    assert guard.pacing
    assert guard.fraction <= guard.config.fallback_fraction
    assert board.temp_c > 27.0  # the board did heat while the sensor said 20 °C


def test_a_gate_that_reports_no_share_is_judged_on_the_least_move_its_budget_allows():
    """A power gate that reports no executed share runs at most its budget: a run is taken as frozen only where no
    share of the blocks, from none to the budget's, could have held the reading still. A sensor stuck at 70 °C on a
    board that, computing half the time at budget 0.3, settles near 56 °C (and idle near 47 °C) is frozen; it was
    never judged under a budget below 1."""
    gate = TauController(ControllerConfig(compute_budget=0.3))
    board = _gated_board(0.3, start_c=47.0)
    warnings: list[str] = []
    guard = Guard(_limits(), MODEL, budget_target=gate, warn=warnings.append)
    assert guard.compute_budget == 0.3  # read from the gate's settings
    guard.observe(board.t, Reading(board.t, {"cpu-thermal": 47.0}))  # the ambient guessed from it: 20.4 °C

    def read() -> Reading:  # read right once, then stuck at 70 °C
        return Reading(board.t, {"cpu-thermal": 70.0}, source="sysfs cpu-thermal")

    _run(guard, board, read, 180.0)
    assert not guard.sensor_ok
    assert len(warnings) == 1
    assert "frozen" in warnings[0]
    assert "70 °C" in warnings[0]


def test_a_gate_that_reports_no_share_is_not_taken_for_frozen_where_some_share_holds_the_reading():
    """The same gate with the sensor stuck at 50 °C: idle the board settles near 47 °C, at the budget's share near
    56 °C, so some share of the blocks holds it at 50 °C: not judged frozen (it could be a coarse sensor)."""
    gate = TauController(ControllerConfig(compute_budget=0.3))
    board = _gated_board(0.3, start_c=47.0)
    warnings: list[str] = []
    guard = Guard(_limits(), MODEL, budget_target=gate, warn=warnings.append)
    guard.observe(board.t, Reading(board.t, {"cpu-thermal": 47.0}))

    def read() -> Reading:
        return Reading(board.t, {"cpu-thermal": 50.0}, source="sysfs cpu-thermal")

    _run(guard, board, read, 600.0)
    assert guard.sensor_ok
    assert warnings == []
