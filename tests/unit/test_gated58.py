"""The power-gated ONNX Runtime backend on real exported graphs of tiny models."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.errors import RuntimeBackendError  # noqa: E402
from edgesdk.export.onnx_export import ExportConfig, export_model  # noqa: E402
from edgesdk.runtime.ort_backend import ClosedSession  # noqa: E402
from edgesdk.runtime.ort_gated_backend import OrtGatedBackend  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402
from tests.unit.test_gated46 import _gated  # noqa: E402


def _constructed(traceback, cls):
    """The instance of ``cls`` whose ``__init__`` frame ``traceback`` passes through."""
    while traceback is not None:
        frame = traceback.tb_frame
        if frame.f_code is cls.__init__.__code__:
            return frame.f_locals["self"]
        traceback = traceback.tb_next
    raise AssertionError(f"{cls.__name__}.__init__ is not on the traceback")


def test_a_bundle_with_unusable_power_settings_gives_its_session_back_when_refused(tmp_path):
    """The session (the model's weights) was opened before the power settings were read: refused, it stayed held by
    the error's traceback (kept at a REPL, or by a server's log), as the base class already avoids for providers
    that did not start."""
    model, _, _ = _gated(tiny_llama(layers=2))
    spec = export_model(model, tmp_path, ExportConfig(form="ort-fused", weights="fp32", max_context=32)).to_json()
    spec["power"] = {**spec.get("power", {}), "smooth": 0}
    with pytest.raises(RuntimeBackendError, match="smooth=0") as caught:
        OrtGatedBackend(tmp_path / "model.onnx", spec, threads=1)
    backend = _constructed(caught.value.__traceback__, OrtGatedBackend)
    assert isinstance(backend.session, ClosedSession)
    assert backend._buffers == []  # the KV cache went with it
