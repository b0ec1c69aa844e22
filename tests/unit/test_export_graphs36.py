"""ONNX graph forms of the export: configurations refused before any stage, each shown on a real model."""

from __future__ import annotations

import pytest

from edgesdk.errors import ExportError
from edgesdk.export.onnx_export import ExportConfig, check_exportable, export_model
from tests._utils.tiny import tiny_llama

torch = pytest.importorskip("torch")

PARTIAL = {"rope_theta": 10000.0, "partial_rotary_factor": 0.5}


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_a_scaled_rotary_over_part_of_the_head_is_refused_before_any_stage(model_type, tmp_path):
    """transformers' linear (and llama3, yarn, ...) rope functions give frequencies for partial_rotary_factor of the
    head, while these architectures rotate the whole head: the model fails at its first forward, and the standard
    graph was written anyway and failed to load in ONNX Runtime at validation (an ONNXRuntimeError traceback)."""
    model = tiny_llama(model_type=model_type, heads=2, kv_heads=1, hidden=64, head_dim=32,
                       config_overrides={"rope_parameters": {"rope_type": "linear", "factor": 2.0, **PARTIAL}})
    with pytest.raises(RuntimeError), torch.no_grad():  # the premise: PyTorch cannot run it either
        model(torch.arange(4)[None])
    for form in ("standard", "ort-fused"):
        with pytest.raises(ExportError, match=r"partial_rotary_factor 0.5: its table has 8 frequencies for a head "
                                              r"of 32 dimensions \(16 needed\)") as refused:
            check_exportable(model.config, ExportConfig(form=form, max_context=64))
        assert "remove partial_rotary_factor" in refused.value.fix
    with pytest.raises(ExportError, match="partial_rotary_factor"):
        export_model(model, tmp_path, ExportConfig(max_context=64))
    assert not (tmp_path / "model.onnx").exists()


def test_a_default_rotary_with_a_partial_factor_rotates_the_whole_head_and_exports(tmp_path):
    """The families' own default rotary ignores partial_rotary_factor (the table covers the head), so such a model
    runs in PyTorch and exports as it computes."""
    from edgesdk.export.validate import ValidationConfig, validate_export

    model = tiny_llama(heads=2, kv_heads=1, hidden=64, head_dim=32,
                       config_overrides={"rope_parameters": {"rope_type": "default", **PARTIAL}})
    spec = export_model(model, tmp_path, ExportConfig(max_context=64))
    validate_export(model, tmp_path / "model.onnx", spec, ValidationConfig(prompts=1))
