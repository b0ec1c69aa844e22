"""The thermal guard of ``edgesdk.load(..., watch_thermal=True)`` gets what ``edgesdk run --watch-thermal`` hands its
guard: the bundle's model facts (the FFN share of a decode step's power) and, while the gates skip blocks, the power
gate whose compute budget it lowers; a power-gated bundle, which load() runs with its gates off, gets a note that the
guard paces instead. Real tiny bundles (one power-gated), read through a temporary sysfs thermal zone."""

from __future__ import annotations

import pytest

import edgesdk
from edgesdk.thermal.guard import Level, ffn_weight_share
from edgesdk.thermal.watch import GATES_OFF
from tests._utils.sysfs import make_zone
from tests.unit.test_power_export import power_bundle  # noqa: F401  (the fixture: a tiny power-gated bundle)


@pytest.fixture
def board(tmp_path, monkeypatch):
    """A board whose one ``cpu-thermal`` zone reads ``temp_c`` (45 °C: normal on the rpi5 and host profiles)."""
    monkeypatch.setenv("EDGESDK_CPUFREQ_ROOT", str(tmp_path / "no-cpufreq"))
    monkeypatch.setenv("EDGESDK_THERMAL_ROOT", str(tmp_path / "thermal"))

    def at(temp_c: float) -> None:
        make_zone(tmp_path / "thermal", 0, "cpu-thermal", f"{round(temp_c * 1000)}\n")

    at(45.0)
    return at


def _gates_off_notes(notes: list[str]) -> list[str]:
    return [note for note in notes if GATES_OFF in note]


def test_load_s_guard_takes_the_bundle_s_model_facts(tiny_bundle, board):
    """The guard took the whole of a decode step's power as the FFN blocks' (``ffn_share`` 1.0), where run's guard
    takes the share the bundle's model facts give; a bundle without power gates gets no note about them."""
    facts = tiny_bundle.manifest["model"]["after"]
    with edgesdk.load(tiny_bundle.path, threads=1, watch_thermal=True) as model:
        guard = model._thermal.hook.guard
        assert guard.ffn_share == ffn_weight_share(facts) < 1.0
        assert guard.budget_target is None
        assert _gates_off_notes(model.notes) == []
        assert "thermal sensors: sysfs cpu-thermal" in " ".join(model.notes)


def test_load_says_its_guard_paces_a_power_gated_bundle_whose_gates_are_off(power_bundle, board):  # noqa: F811
    """load() runs a power-gated bundle with its gates off, so its guard paces: a note says so, as ``run`` prints one
    without --gating (it said nothing); the guard sees the gates as generation runs them, off."""
    with edgesdk.load(power_bundle.path, threads=1, watch_thermal=True) as model:
        assert model.runtime.backend.gating is False
        guard = model._thermal.hook.guard
        assert guard.budget_target is None
        notes = _gates_off_notes(model.notes)
        assert len(notes) == 1
        assert notes[0].startswith("watch_thermal: ")
        assert "--gating" in notes[0]
        model.create_completion("hello", max_tokens=4)
        assert model.runtime.backend.gating is False
        assert model.runtime.backend.controller.limit == 1.0  # the guard left the gate alone
    with edgesdk.load(power_bundle.path, threads=1) as plain:  # no guard, no note
        assert _gates_off_notes(plain.notes) == []


def test_the_python_guard_of_a_gated_runtime_lowers_the_gate_s_budget(power_bundle, board):  # noqa: F811
    """With the gates on (as ``run --gating`` sets them), the API's guard gets the gate, as run's does: hot, it lowers
    the gate's compute budget, and its power model reads the FFN share of the model's facts at the gate's head
    size. It got neither: it paced the board while every FFN block ran, and took all of the power as the FFNs'."""
    from edgesdk.api import _open_guard
    from edgesdk.runtime.backend import close_backend
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(power_bundle.path, threads=1, terms="python")
    try:
        backend = runtime.backend
        backend.configure(backend.controller_config(None, None))  # what configure_gates does for --gating
        backend.gating = True
        board(75.0)  # hot on the rpi5 profile (71.5 °C), below critical (78 °C)
        notes: list[str] = []
        session = _open_guard(runtime, notes)
        try:
            guard = session.hook.guard
            assert guard.budget_target is backend
            assert guard.ffn_share == ffn_weight_share(power_bundle.manifest["model"]["after"], backend.head_dim)
            assert guard.ffn_share < 1.0
            assert _gates_off_notes(notes) == []
            assert backend.controller.limit == 1.0
            session.hook.before_step("decode")
            assert guard.level is Level.HOT
            assert backend.controller.limit == guard.config.hot_budget < 1.0
            assert guard.budget_in_force == guard.config.hot_budget
        finally:
            session.close()
    finally:
        close_backend(runtime.backend)
