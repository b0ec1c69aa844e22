"""Review of the ONNX graphs a bundle ships (export/qdq_graph.py, export/fused_graph.py, export/gated_graph.py,
export/bundle_weights.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("onnx")
torch = pytest.importorskip("torch")

from edgesdk.errors import ExportError  # noqa: E402
from edgesdk.export.decoder_weights import decoder_weights_from_hf  # noqa: E402
from edgesdk.export.qdq_graph import QDQConfig, emit_qdq_decoder  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_qdq_export_refuses_a_non_finite_linear_weight_by_name(value):
    """A NaN weight got a channel scale of 1 and codes cast from NaN, an infinite one a NaN channel: the QDQ graph
    was written with a channel of garbage, without a word about which of the model's linears held it."""
    model = tiny_llama(layers=2)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[3, 5] = value  # torch (out, in)
    with pytest.raises(ExportError) as refused:
        emit_qdq_decoder(decoder_weights_from_hf(model), 64, QDQConfig())
    assert "model.layers.1.mlp.down_proj.weight" in str(refused.value)
    assert "output 3, input 5" in str(refused.value)


def test_qdq_export_refuses_a_non_finite_head_row_by_name():
    model = tiny_llama(layers=1, tie=False)
    with torch.no_grad():
        model.lm_head.weight[7, 2] = float("nan")
    with pytest.raises(ExportError, match=r"lm_head\.weight holds nan at output 7, input 2"):
        emit_qdq_decoder(decoder_weights_from_hf(model), 64, QDQConfig(embedding_bits=8))


@pytest.mark.parametrize("scale", [None, "0.05", True, [0.05]])
def test_an_activation_scale_of_the_wrong_json_type_is_refused_by_name(scale):
    """A null, quoted, boolean or listed scale in a hand-edited config.json failed with numpy's "ufunc 'isfinite'
    not supported" (or a list comparison's TypeError), naming neither the linear nor the fix; True passed as 1.0."""
    with pytest.raises(ExportError, match="model.layers.0.self_attn.q_proj") as refused:
        QDQConfig(activation_scales={"model.layers.0.self_attn.q_proj": scale})
    assert "qat stage" in refused.value.fix
