"""Thermal guard: a power gate's skipped FFN blocks save only the FFNs' share of a decode step's power (attention, the
embeddings and the LM head are read whatever it skips), and an unguarded record books the budget set on the gate as
it stands."""

from __future__ import annotations

import json

import pytest

from edgesdk.power.controller import ControllerConfig, TauController
from edgesdk.thermal.guard import Guard, Level, ffn_weight_share
from edgesdk.thermal.sensors import Reading
from edgesdk.thermal.simulator import SimulatedBoard
from edgesdk.thermal.watch import open_session
from tests.unit.test_guard_leads60 import (
    MAX_CONTEXT,
    MODEL,
    RPI5,
    _configure,
    _Decoder,
    _limits,
    _measured_fraction,
    _run,
)

# SmolLM2-135M's facts, as its bundle's manifest holds them (model.after)
SMOLLM2 = {"layers": 30, "hidden_size": 576, "attention_heads": 9, "kv_heads": 3, "intermediate_size": 1536,
           "vocab_size": 49152, "tie_word_embeddings": True}


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    """A real gated backend (a tiny llama with power adapters), gating on, and its model's facts."""
    from edgesdk.export.onnx_export import ExportConfig, export_model
    from edgesdk.runtime.ort_gated_backend import OrtGatedBackend
    from tests.unit.test_power_export import _gated_model

    folder = tmp_path_factory.mktemp("gated")
    model, _, _ = _gated_model("llama-gqa")
    config = model.config
    facts = {"layers": config.num_hidden_layers, "hidden_size": config.hidden_size,
             "attention_heads": config.num_attention_heads, "kv_heads": config.num_key_value_heads,
             "intermediate_size": config.intermediate_size, "vocab_size": config.vocab_size}
    spec = export_model(model, folder, ExportConfig(form="ort-fused", max_context=MAX_CONTEXT)).to_json()
    backend = OrtGatedBackend(folder / "model.onnx", spec, threads=1)
    yield backend, facts
    backend.close()


def _gated_board(ffn_share: float, fraction: float, start_c: float | None = None) -> SimulatedBoard:
    """A bare Pi 5 in a 20 °C room whose decode runs ``fraction`` of the FFN blocks, the FFNs ``ffn_share`` of the
    weights a token reads: the rest of the dynamic power is drawn whatever the gate skips (the thermal simulator
    models no gate)."""
    dynamic = (1.0 - ffn_share + ffn_share * fraction) * (MODEL.active_w - MODEL.idle_w)
    return SimulatedBoard(MODEL.model_copy(update={"active_w": MODEL.idle_w + dynamic}),
                          RPI5.thermal.firmware_throttle_c, ambient_c=20.0, start_c=start_c)


def test_the_ffn_share_of_the_weights_a_token_reads_comes_from_the_model_facts():
    # 30 x 3 x 576 x 1536 of 30 x 3 x 576 x 1536 + 30 x (2 x 576^2 + 2 x 576 x 192) + 49152 x 576
    assert ffn_weight_share(SMOLLM2) == pytest.approx(79_626_240 / (79_626_240 + 26_542_080 + 28_311_552))
    assert 0.59 < ffn_weight_share(SMOLLM2) < 0.6
    # a pruned model: the per-layer widths and heads, the graph's head_dim (the facts hold none)
    pruned = {**SMOLLM2, "layers": 2, "intermediate_sizes": [1536, 768], "kv_heads_per_layer": [3, 1],
              "attention_heads_per_layer": [9, 3]}
    ffn, attention = 3 * 576 * (1536 + 768), 576 * 64 * 2 * ((9 + 3) + (3 + 1))
    assert ffn_weight_share(pruned, head_dim=64) == pytest.approx(ffn / (ffn + attention + 49152 * 576))
    for missing in ("layers", "hidden_size", "intermediate_size", "vocab_size", "kv_heads"):
        assert ffn_weight_share({k: v for k, v in SMOLLM2.items() if k != missing}) is None
    assert ffn_weight_share({**SMOLLM2, "hidden_size": "576"}) is None
    assert ffn_weight_share(None) is None
    assert Guard(_limits(), MODEL).ffn_share == 1.0  # facts not given: all of the power taken as the FFNs'
    assert Guard(_limits(), MODEL, model_facts=SMOLLM2).ffn_share == ffn_weight_share(SMOLLM2)


def test_skipped_ffn_blocks_leave_attention_and_the_head_drawing_power(gated):
    """At ``--compute-budget`` 1.0 the gate skips about half the FFN blocks of this model, whose FFNs are about half
    of the weights a token reads: the board draws about three quarters of the dynamic power, not half. Modelled as
    drawing nothing outside the FFNs, its warming was put down to a room warmer by several degrees (every heating
    prediction made from it, the bucket's depth, a held prefill, fell short); with the model's facts the ambient
    re-estimate lands within 2 °C."""
    backend, facts = gated
    _configure(backend, 1.0)
    fraction = _measured_fraction(backend)
    assert 0.2 < fraction < 0.8  # the gate skips blocks at budget 1.0
    share = ffn_weight_share(facts, backend.head_dim)
    assert 0.3 < share < 0.7  # attention and the head are a large share of this model's weights

    def guarded(model_facts: dict | None) -> tuple[Guard, SimulatedBoard, list[str]]:
        board = _gated_board(share, fraction)
        warnings: list[str] = []
        guard = Guard(_limits(), MODEL, budget_target=backend, warn=warnings.append, model_facts=model_facts)

        def read() -> Reading:
            return Reading(board.t, {"cpu-thermal": float(round(board.temp_c))}, source="sysfs cpu-thermal")

        _run(guard, board, read, 900.0, _Decoder(backend))
        return guard, board, warnings

    guard, board, warnings = guarded(facts)
    assert guard.ffn_share == share
    assert abs(guard.ambient_c - board.ambient_c) < 2.0
    assert warnings == []
    assert guard.sensor_ok
    assert guard.level is Level.NORMAL
    # all of the power taken as the FFNs' (the model before): the room taken for a warmer one
    guard, board, _ = guarded(None)
    assert guard.ambient_c - board.ambient_c > 3.0


def test_a_gate_that_reports_no_share_still_draws_the_power_of_attention_and_the_head():
    """A gate that reports no executed share under budget 0.3, on SmolLM2-135M, whose attention and LM head draw 41 %
    of a decode step's dynamic power whatever the gate skips: computing half the time the board settles near 59 °C at
    the least (idle near 47 °C), so a sensor stuck at 50 °C is frozen. Its least power was taken as none (no FFN
    block, nothing else read either), which let 50 °C hold still: never judged."""
    gate = TauController(ControllerConfig(compute_budget=0.3))
    board = _gated_board(ffn_weight_share(SMOLLM2), 0.3, start_c=47.0)
    warnings: list[str] = []
    guard = Guard(_limits(), MODEL, budget_target=gate, warn=warnings.append, model_facts=SMOLLM2)
    guard.observe(board.t, Reading(board.t, {"cpu-thermal": 47.0}))  # the ambient guessed from it: 20.4 °C
    least, most = guard._gate_shares("decode")
    assert least == pytest.approx(1.0 - ffn_weight_share(SMOLLM2))
    assert most == pytest.approx(least + 0.3 * ffn_weight_share(SMOLLM2))

    def read() -> Reading:  # read right once, then stuck at 50 °C
        return Reading(board.t, {"cpu-thermal": 50.0}, source="sysfs cpu-thermal")

    _run(guard, board, read, 300.0)
    assert not guard.sensor_ok
    assert len(warnings) == 1
    assert "frozen" in warnings[0]
    assert "50 °C" in warnings[0]
    assert guard.pacing


def test_open_session_hands_the_model_facts_to_the_guard():
    session = open_session(RPI5, guard=True, simulate=True, status=False, model_facts=SMOLLM2,
                           budget_target=TauController(ControllerConfig(compute_budget=0.5)))
    try:
        assert session.hook.guard.ffn_share == ffn_weight_share(SMOLLM2)
        assert session.hook.guard._gate_shares("decode")[0] == pytest.approx(1.0 - ffn_weight_share(SMOLLM2))
    finally:
        session.close()


def test_an_unguarded_record_books_the_budget_set_on_the_gate_as_it_stands(gated, tmp_path):
    """``--telemetry`` without the guard: the hook took the gate's budget when the session opened, so a gate
    configured after it (``configure()`` replaces the controller's settings) was recorded at the old budget."""
    backend, _ = gated
    _configure(backend, 0.6)
    path = tmp_path / "run.jsonl"
    session = open_session(RPI5, guard=False, simulate=True, status=False, telemetry_path=str(path),
                           budget_target=backend)
    try:
        hook = session.hook
        _configure(backend, 0.4)
        hook.begin(4, 2)
        hook.before_step("decode")
        hook.after_step("decode", 1, 0.1)
        assert hook.compute_budget == 0.4
    finally:
        session.close()
    steps = [record for record in map(json.loads, path.read_text().splitlines()) if record.get("kind") == "decode"]
    assert [(step["level"], step["budget"]) for step in steps] == [("unguarded", 0.4)]


def test_run_s_thermal_session_hands_the_bundle_s_model_facts_to_the_guard(tiny_bundle):
    """``run`` / ``serve`` open their session through ``open_thermal``: the guard gets the bundle's model facts."""
    import signal

    from edgesdk.cli_options import open_thermal
    from edgesdk.runtime.session import open_runtime

    handlers = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGHUP)}
    runtime = open_runtime(tiny_bundle.path, threads=1)
    try:
        session = open_thermal(runtime, watch_thermal=False, simulate_thermal=True, no_guard=False, clock_cap=False,
                               telemetry=None, ambient=None, thermal_target=None, sim_speed=1.0, status=False)
        try:
            facts = tiny_bundle.manifest["model"]["after"]
            assert session.hook.guard.ffn_share == ffn_weight_share(facts) < 1.0
        finally:
            session.close()
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
