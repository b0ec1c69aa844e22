"""Reading a bundle's weights back (export/bundle_weights.py) from real exported graphs of tiny models."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.errors import ExportError  # noqa: E402
from edgesdk.export.bundle_weights import read_bundle_decoder  # noqa: E402
from edgesdk.export.onnx_export import ExportConfig, export_model  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402
from tests.unit.test_gated46 import _gated  # noqa: E402


def test_a_power_gated_bundle_is_refused_for_read_back_with_a_fix_that_drops_the_power_stage(tmp_path):
    """A bundle built with the power stage (recipe power: ort-fused, fp32) has the gated graph form. Its refusal told
    the user to rebuild with a recipe whose export form is ort-fused, which the power recipe already is: the rebuilt
    bundle was refused the same way. The gates are what GGUF cannot carry, so the fix drops the power stage."""
    model, _, _ = _gated(tiny_llama(layers=2))
    spec = export_model(model, tmp_path, ExportConfig(form="ort-fused", weights="fp32", max_context=32))
    manifest = {"graph": {**spec.to_json(), "file": "model.onnx"}}
    with pytest.raises(ExportError) as caught:
        read_bundle_decoder(tmp_path, manifest)
    error = caught.value
    assert "ort-fused-gated" in str(error)
    assert "power stage" in error.fix
    assert "fp32-fused" in error.fix
    assert "export form is ort-fused" not in error.fix


def test_the_plain_fused_bundle_of_the_same_model_still_reads_back(tmp_path):
    model = tiny_llama(layers=2)
    spec = export_model(model, tmp_path, ExportConfig(form="ort-fused", weights="fp32", max_context=32))
    decoder = read_bundle_decoder(tmp_path, {"graph": {**spec.to_json(), "file": "model.onnx"}})
    assert len(decoder.layers) == 2
    down = model.model.layers[1].mlp.down_proj.weight.detach().numpy()
    assert (decoder.layers[1].units["mlp.down"] == down).all()
