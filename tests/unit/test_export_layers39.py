"""A model without decoder layers is refused by name before export, in either graph form."""

from __future__ import annotations

import pytest

from edgesdk.errors import ExportError
from edgesdk.export.onnx_export import ExportConfig, export_model
from tests._utils.tiny import tiny_llama


@pytest.mark.parametrize("form", ["standard", "ort-fused"])
def test_model_without_decoder_layers_is_refused_naming_num_hidden_layers(tmp_path, form):
    model = tiny_llama(layers=0)
    with pytest.raises(ExportError) as caught:
        export_model(model, tmp_path, ExportConfig(form=form, max_context=32))
    assert "num_hidden_layers 0" in caught.value.problem
    assert "at least one decoder layer" in caught.value.problem
    assert not any(tmp_path.iterdir())  # refused from the config, before any graph is written
