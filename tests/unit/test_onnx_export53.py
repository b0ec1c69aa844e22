"""ONNX export settings and graphs: what a caller hands ``export_model`` is refused by name, before any work."""

from __future__ import annotations

import pytest

from edgesdk.errors import ExportError
from edgesdk.export.onnx_export import ExportConfig


@pytest.mark.parametrize(("weights", "block_size"), [("int8", 48), ("int4", 8), ("int4", 0)])
def test_a_fused_block_size_the_quantized_ops_cannot_read_is_refused_naming_the_setting(weights, block_size):
    """Before the fix ExportConfig took any block_size, and export_model failed after loading the model, deep in
    the block quantizer, with a bare ValueError ("block_size must be a power of two >= 16, got 48") naming neither
    the export setting nor a fix."""
    with pytest.raises(ExportError, match=f"export block_size={block_size} with {weights} weights") as refused:
        ExportConfig(form="ort-fused", weights=weights, block_size=block_size)
    assert "export.block_size" in refused.value.fix


@pytest.mark.parametrize(("form", "weights"), [("ort-fused", "fp32"), ("standard", "int8")])
def test_block_size_is_not_checked_where_the_graph_stores_no_blocks(form, weights):
    """Float32 fused weights and the per-channel QDQ form read no block size: a recipe's value stays harmless."""
    assert ExportConfig(form=form, weights=weights, block_size=48).block_size == 48


@pytest.mark.parametrize("block_size", [16, 32, 64, 128])
def test_the_block_sizes_the_ops_take_are_accepted(block_size):
    assert ExportConfig(form="ort-fused", weights="int4", block_size=block_size).block_size == block_size


def _qdq_export_with_activation_scales(tmp_path, scales_of):
    """A tiny Llama carrying a QAT scheme with static per-tensor input scales (``scales_of(linear name)``),
    exported in the standard INT8 QDQ form: (model, graph path, spec)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("torch")
    from edgesdk.compress.fake_quant import CONFIG_KEY, QuantScheme, decoder_linears
    from edgesdk.export.onnx_export import export_model
    from tests._utils.tiny import tiny_llama

    model = tiny_llama(vocab_size=96)
    scheme = QuantScheme(weight_bits=8, granularity="channel", activations="tensor", embedding_bits=None,
                         activation_scales={name: scales_of(name) for name in decoder_linears(model)})
    setattr(model.config, CONFIG_KEY, scheme.to_json())
    spec = export_model(model, tmp_path, ExportConfig(form="standard", weights="int8", max_context=32))
    return model, tmp_path / "model.onnx", spec


def _drop_input_quantization(path, linear: str) -> None:
    """Rewrite the QDQ graph at ``path`` so that ``linear`` reads its input in float: its activation
    QuantizeLinear -> DequantizeLinear pair and their scale / zero point removed."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    quantize = next(n for n in graph.node if n.op_type == "QuantizeLinear" and n.input[1] == f"{linear}.input_scale")
    dequantize = next(n for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] == quantize.output[0])
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name == dequantize.output[0]:
                node.input[index] = quantize.input[0]
    graph.node.remove(quantize)
    graph.node.remove(dequantize)
    for tensor in [t for t in graph.initializer if t.name.startswith(f"{linear}.input_")]:
        graph.initializer.remove(tensor)
    onnx.save_model(model, str(path))


def test_a_qdq_graph_that_leaves_a_recorded_linear_input_in_float_fails_validation(tmp_path):
    """Before the fix validate_qdq checked only the scales the graph holds against the scheme's: a graph
    without layer 0's down_proj input quantization passed (its unfused QDQ logits differed from the
    fake-quantized model by ~9e-2, reported as qdq/* but not gated), although TensorRT would run that
    linear on float activations."""
    from edgesdk.export.validate import ExportMismatchError, ValidationConfig, validate_export

    model, path, spec = _qdq_export_with_activation_scales(tmp_path, lambda name: 0.5)
    _drop_input_quantization(path, "model.layers.0.mlp.down_proj")
    with pytest.raises(ExportMismatchError, match=r"input scale of model\.layers\.0\.mlp\.down_proj \(recorded "
                                                  r"0\.5\): the graph quantizes no input with it"):
        validate_export(model, path, spec, ValidationConfig(prompts=1, decode_steps=1))


def test_linears_sharing_one_input_quantization_pass_validation(tmp_path):
    """q, k and v (and gate, up) with equal recorded scales share one QuantizeLinear named after the first of
    them; v with k's scale shares k's: none of them is missing."""
    from edgesdk.export.validate import ValidationConfig, validate_export

    def scales_of(name: str) -> float:
        return 0.25 if name.endswith(("k_proj", "v_proj")) else 0.5

    model, path, spec = _qdq_export_with_activation_scales(tmp_path, scales_of)
    report = validate_export(model, path, spec, ValidationConfig(prompts=1, decode_steps=1))
    assert max(v for k, v in report.max_abs_diff.items() if k.startswith("logits")) < 1e-3
