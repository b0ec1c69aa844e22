"""Review of the exported graphs' weights (export/decoder_weights.py): what a model handed to the exporter directly
carries that the graphs would compute otherwise."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.errors import ExportError  # noqa: E402
from edgesdk.export.decoder_weights import decoder_weights_from_hf  # noqa: E402
from edgesdk.export.onnx_export import ExportConfig, export_model  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


@pytest.mark.parametrize(("model_type", "field", "activation"), [("llama", "hidden_act", "gelu"),
                                                                 ("qwen2", "hidden_act", "relu"),
                                                                 ("gemma3_text", "hidden_activation", "gelu")])
def test_an_ffn_activation_the_graphs_do_not_compute_is_refused_by_name(model_type, field, activation, tmp_path):
    """A model handed to the exporter directly with another FFN activation exported a graph computing SiLU (Gemma's
    tanh GELU) without a word; the validation then blamed the exporter ("this is an exporter bug")."""
    model = tiny_llama(layers=1, model_type=model_type, config_overrides={field: activation})
    with pytest.raises(ExportError, match=rf"the model's config sets {field} '{activation}'; the exported graphs "
                                          rf"compute \w+\(gate\) \* up for a {model_type} model") as refused:
        export_model(model, tmp_path, ExportConfig(max_context=32))
    assert field in refused.value.fix
    assert not (tmp_path / "model.onnx").exists()


@pytest.mark.parametrize(("model_type", "field", "activation"), [("llama", "hidden_act", "silu"),
                                                                 ("llama", "hidden_act", "swish"),
                                                                 ("gemma3_text", "hidden_activation", "gelu_pytorch_tanh")])
def test_the_activations_the_graphs_compute_are_taken(model_type, field, activation):
    model = tiny_llama(layers=1, model_type=model_type, config_overrides={field: activation})
    weights = decoder_weights_from_hf(model)
    assert weights.activation == ("gelu_tanh" if model_type == "gemma3_text" else "silu")
