"""The gated backend names the bundle setting it cannot use."""

from __future__ import annotations

import pytest

from edgesdk.errors import RuntimeBackendError
from edgesdk.runtime.ort_fused_backend import OrtFusedBackend
from edgesdk.runtime.ort_gated_backend import OrtGatedBackend


def test_an_unusable_smoothing_width_in_the_bundle_is_named_with_its_fix(monkeypatch, tmp_path):
    """The fix spoke only of the entropy target whatever setting failed (smooth 0 here)."""
    monkeypatch.setattr(OrtFusedBackend, "__init__", lambda self, *args, **kwargs: None)  # no session needed
    graph = {"power": {"entropy_target": 1.5, "window": 8, "smooth": 0, "floor": 0.01}}
    with pytest.raises(RuntimeBackendError, match="smooth") as info:
        OrtGatedBackend(tmp_path / "model.onnx", graph, threads=1)
    assert "smooth=0" in str(info.value)
    assert "smooth 2" in info.value.fix
