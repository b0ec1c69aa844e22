"""The gated backend names the bundle setting it cannot use."""

from __future__ import annotations

import pytest

from edgesdk.errors import RuntimeBackendError
from edgesdk.runtime.ort_fused_backend import OrtFusedBackend
from edgesdk.runtime.ort_gated_backend import OrtGatedBackend


def test_an_unusable_smoothing_width_in_the_bundle_is_named_with_its_fix(monkeypatch, tmp_path):
    """The fix spoke only of the entropy target whatever setting failed (smooth 0 here)."""
    # no session needed; the name is what close() (giving back the refused backend's session) reads
    monkeypatch.setattr(OrtFusedBackend, "__init__", lambda self, *args, **kwargs: setattr(self, "name", "ort-cpu"))
    graph = {"power": {"entropy_target": 1.5, "window": 8, "smooth": 0, "floor": 0.01}}
    with pytest.raises(RuntimeBackendError, match="smooth") as info:
        OrtGatedBackend(tmp_path / "model.onnx", graph, threads=1)
    assert "smooth=0" in str(info.value)
    assert "smooth 2" in info.value.fix


@pytest.mark.parametrize("gating", [False, True])
def test_stats_go_on_over_a_context_shift(tmp_path, gating):
    """A context shift rewinds or resets the backend, which starts the controller over: --stats counted only the
    decode steps since the last shift (24 of 177 blocks here)."""
    from edgesdk.export.onnx_export import ExportConfig, export_model
    from edgesdk.runtime.generate import ContextShift, SamplingConfig, generate
    from tests.unit.test_power_export import _gated_model

    model, _, _ = _gated_model("llama-gqa")
    spec = export_model(model, tmp_path, ExportConfig(form="ort-fused", max_context=32)).to_json()
    backend = OrtGatedBackend(tmp_path / "model.onnx", spec, threads=1)
    backend.gating = gating
    answer, stats = generate(backend, list(range(5, 15)), SamplingConfig(max_new_tokens=60), set(),
                             shift=ContextShift(keep=4))
    assert stats.context_shifts >= 2
    # every decode step's blocks but the shifts' passes, which are prefills of the moved tokens (not counted)
    decoded = len(answer) - 1 - stats.context_shifts
    assert backend.stats()["blocks_total"] == decoded * spec["num_layers"]
