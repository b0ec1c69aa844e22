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


def test_an_ffn_activation_set_to_none_is_refused_by_the_exporter_as_by_the_loader():
    """The exporter took hidden_act None as SiLU where the loader refuses it: transformers' configs refuse None
    ("Field 'hidden_act' expected str"), so it is no activation. Both read the config through one check, which takes
    an absent field as the architecture's default."""
    from types import SimpleNamespace

    from edgesdk.errors import ModelSourceError
    from edgesdk.models.loader import check_architecture, ffn_activation_mismatch

    model = tiny_llama(layers=1)
    model.config.__dict__["hidden_act"] = None  # past the config's own check, as an older transformers let it be
    with pytest.raises(ExportError, match=r"the model's config sets hidden_act None; the exported graphs compute "
                                          r"silu\(gate\) \* up"):
        decoder_weights_from_hf(model)
    with pytest.raises(ModelSourceError, match=r"uses hidden_act None in its FFN"):
        check_architecture(model.config, "tiny")
    assert ffn_activation_mismatch(SimpleNamespace(model_type="llama")) is None
    assert ffn_activation_mismatch(SimpleNamespace(model_type="gemma3_text")) is None
    assert ffn_activation_mismatch(SimpleNamespace(model_type="gemma3_text", hidden_activation=None)) == \
        ("hidden_activation", None, "gelu_pytorch_tanh")
