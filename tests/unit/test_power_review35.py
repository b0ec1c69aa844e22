"""Power gates: the gated backend's controller, the power stage and the gated graph on unusual input."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgesdk.export.onnx_export import ExportConfig, export_model  # noqa: E402
from edgesdk.runtime.ort_gated_backend import OrtGatedBackend  # noqa: E402
from tests.unit.test_power_export import _gated_model  # noqa: E402


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    """A tiny gated graph (3 layers, gates spread around 0.5) and its spec."""
    model, _, _ = _gated_model("llama-gqa")
    out = tmp_path_factory.mktemp("gated")
    spec = export_model(model, out, ExportConfig(form="ort-fused", max_context=128))
    return out / "model.onnx", spec.to_json()


IDS = np.random.default_rng(0).integers(0, 320, 100)


def test_a_fixed_threshold_leaves_the_controller_where_it_was_for_when_it_takes_the_gate_back(gated):
    """With ``fixed_tau`` in use the controller steered all the same: running every block (tau 0) against a
    budget of 0.5 wound its floor up to tau_max, so once ``fixed_tau`` was cleared every FFN was skipped."""
    backend = OrtGatedBackend(*gated, threads=1)
    backend.configure(backend.controller_config(compute_budget=0.5))
    backend.gating, backend.fixed_tau = True, 0.0
    backend.prefill(IDS[:5])
    for token in IDS[5:45]:
        backend.decode(int(token))
    assert backend.stats()["tau"] == 0.0
    assert backend.controller.entropy is not None  # measured all the same
    backend.fixed_tau = None  # the controller takes the gate back where it left it
    assert backend.tau == pytest.approx(backend.controller.config.tau_init)
    ran = []
    for token in IDS[45:55]:
        backend.decode(int(token))
        ran.append(float((backend.last_gates >= backend.controller.tau).mean()))
    assert np.mean(ran) > 0.2  # wound up, it ran none of them


@pytest.mark.parametrize(("field", "value"), [("window", None), ("entropy_target", [1.5]), ("tau_init", None),
                                            ("tau_init", 1.5)])
def test_bundle_power_settings_that_are_no_usable_number_are_named(gated, field, value):
    """A setting that is no number (null in a hand-edited manifest) was float()'s or int()'s TypeError, a
    traceback instead of the backend's failure to load; a tau_init outside [0, 1] went unnamed in the list."""
    from edgesdk.errors import RuntimeBackendError

    path, graph = gated
    graph = {**graph, "power": {**graph["power"], field: value}}
    with pytest.raises(RuntimeBackendError, match="power settings") as info:
        OrtGatedBackend(path, graph, threads=1)
    assert f"{field}={value!r}" in info.value.problem
    assert "tau_init in (0, 1)" in info.value.fix


@pytest.mark.parametrize(("overrides", "least"), [(["power.tau_train=0.7"], "0.847"),
                                                  (["power.gate_init=-1.0"], "0.000")])
def test_gates_that_would_start_closed_are_refused_before_the_build(overrides, least):
    """sigmoid(gate_init) below tau_train skipped every FFN from the first rollout: tau_train 0.7 with the
    default gate_init 0.5 trained round after round with no FFN block run."""
    from edgesdk.build.recipes import load_recipe
    from edgesdk.errors import BuildError

    with pytest.raises(BuildError) as info:
        load_recipe("power").with_overrides(overrides).validated()
    assert "every FFN would be skipped from the first rollout" in str(info.value)
    assert f"set power.gate_init above {least}" in str(info.value)
    load_recipe("power").with_overrides([*overrides, "power.gate_init=1.5"]).validated()  # opened: taken
