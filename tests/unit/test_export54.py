"""Review of the ONNX graph export (export/): errors about a weight the block layout cannot store name it."""

from __future__ import annotations

import pytest

pytest.importorskip("onnx")
torch = pytest.importorskip("torch")

from edgesdk.errors import ExportError  # noqa: E402
from edgesdk.export.decoder_weights import decoder_weights_from_hf  # noqa: E402
from edgesdk.export.fused_graph import FusedConfig, emit_fused_decoder  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


def _refusal(model, config: FusedConfig) -> str:
    with pytest.raises(ExportError) as refused:
        emit_fused_decoder(decoder_weights_from_hf(model), 64, config)
    return str(refused.value)


def test_non_finite_weight_is_named_by_its_layer_and_linear():
    """A NaN in one decoder linear was reported as "the (112, 64) weight ... at input 5, output 3": which of the
    model's dozens of linears of that shape the user had to find by exporting again in fp32."""
    model = tiny_llama(layers=2)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[3, 5] = float("nan")  # torch (out, in)
    message = _refusal(model, FusedConfig(weights="int8"))
    assert "layers.1.mlp.down (model.layers.1.mlp.down_proj)" in message
    assert "at input 5, output 3" in message


def test_fused_unit_names_every_linear_it_concatenates():
    model = tiny_llama(layers=2)
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight[0, 0] = float("inf")
    message = _refusal(model, FusedConfig(weights="int8"))
    assert ("layers.0.attn.qkv (model.layers.0.self_attn.q_proj | model.layers.0.self_attn.k_proj | "
            "model.layers.0.self_attn.v_proj, concatenated along outputs)") in message


@pytest.mark.parametrize("tie", [True, False])
def test_oversized_head_or_embedding_block_is_named(tie):
    """absmax / 7 past float16's 65504 at 4 bits: the error names the embedding table (tied) or the LM head."""
    model = tiny_llama(layers=1, tie=tie)
    with torch.no_grad():
        (model.model.embed_tokens if tie else model.lm_head).weight[7, 2] = 1.0e6
    message = _refusal(model, FusedConfig(weights="int4"))
    assert "output 7, block 0) has absmax 1e+06" in message
    expected = "embed_tokens (model.embed_tokens.weight transposed" if tie else "lm_head (lm_head.weight)"
    assert expected in message
