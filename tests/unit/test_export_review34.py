"""Export review: the context a model allows, and what validation says when the exported graph gives NaN."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.errors import ExportError  # noqa: E402
from edgesdk.export.onnx_export import MODEL_FILE, ExportConfig, check_exportable, export_model  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


def test_a_model_whose_positions_are_fewer_than_a_bundle_needs_is_refused_before_any_stage(tmp_path):
    """max_position_embeddings 8 bounds the context under the 16 a bundle needs: check_exportable (run right
    after loading) refuses it naming the model's limit, where the export refused it after every stage with
    'max_context 8 is too short, use --max-context 16 or more' to a build given --max-context 4096."""
    model = tiny_llama(max_positions=8)
    with pytest.raises(ExportError, match="max_position_embeddings is 8") as refused:
        check_exportable(model.config, ExportConfig(max_context=4096))
    assert "--max-context" not in refused.value.fix
    assert "max_position_embeddings is 16 or more" in refused.value.fix
    with pytest.raises(ExportError, match="max_position_embeddings is 8"):
        export_model(model, tmp_path, ExportConfig(max_context=4096))
    assert not (tmp_path / MODEL_FILE).exists()


def test_a_context_option_under_the_minimum_still_names_the_option():
    model = tiny_llama()
    with pytest.raises(ExportError, match="max_context 8 is too short") as refused:
        check_exportable(model.config, ExportConfig(max_context=8))
    assert "--max-context 16" in refused.value.fix


def test_a_graph_giving_nan_where_the_model_is_finite_is_called_an_exporter_fault(tmp_path):
    """NaN logits from the graph alone (the model's are finite) are not a diverged stage: the error says the
    graph computes something else, where its fix told the user to check the stages' lr and rebuild."""
    import numpy as np
    import onnx

    from edgesdk.export.validate import ValidationConfig, validate_export

    model = tiny_llama()
    spec = export_model(model, tmp_path, ExportConfig(max_context=32))
    proto = onnx.load(str(tmp_path / MODEL_FILE), load_external_data=False)
    norm = next(t for t in proto.graph.initializer if t.name == "final_norm.weight")
    norm.CopyFrom(onnx.numpy_helper.from_array(np.full(model.config.hidden_size, np.nan, np.float32), norm.name))
    onnx.save_model(proto, str(tmp_path / MODEL_FILE))
    with pytest.raises(ExportError, match="the exported graph gives non-finite values") as raised:
        validate_export(model, tmp_path / MODEL_FILE, spec, ValidationConfig(prompts=1, decode_steps=1))
    assert "PyTorch model's are finite" in raised.value.problem
    assert "exporter bug" in raised.value.fix
    assert "--resume" not in raised.value.fix
