"""Review 50 of the quantization area (compress/measure.py, smooth.py, qat.py, fake_quant.py, build/sparse_step.py,
accuracy.py, weights_file.py): the defects found, each with a test that fails on the code before its fix."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress import fake_quant  # noqa: E402
from edgesdk.compress.measure import weight_bytes  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402

QDQ_SUFFIXES = (".weight_quantized", ".weight_scale", ".weight_zero_point")  # export/qdq_graph.py _dequantize


def _qdq_linear_bytes(model, path) -> int:
    """The bytes of the decoder linears in the standard form's INT8 QDQ graph: codes, scales and zero points."""
    import onnx

    from edgesdk.export.onnx_export import ExportConfig, export_model

    path.mkdir()
    export_model(model, path, ExportConfig(form="standard", weights="int8", max_context=64))
    graph = onnx.load(path / "model.onnx").graph
    return sum(onnx.numpy_helper.to_array(t).nbytes for t in graph.initializer if t.name.endswith(QDQ_SUFFIXES))


def test_weight_bytes_of_per_channel_weights_count_the_zero_points_the_qdq_graph_stores(tmp_path):
    """The QDQ graph's DequantizeLinear of a weight reads three initializers: INT8 codes, a float32 scale per output
    channel and an INT8 zero point per output channel (ONNX gives the zero point the scale's shape). The report's
    weight bytes counted codes and scales only, a byte per output channel short: widening the FFN by 16 channels
    adds 32 gate/up rows, whose zero points were missing from the figure."""
    scheme = fake_quant.QuantScheme(weight_bits=8, granularity="channel", activations="none", embedding_bits=None)
    narrow = tiny_llama(seed=0)  # intermediate 112
    wide = copy.deepcopy(narrow)
    for layer in wide.model.layers:  # 16 channels more: same structure otherwise
        for linear, dim in ((layer.mlp.gate_proj, 0), (layer.mlp.up_proj, 0), (layer.mlp.down_proj, 1)):
            pad = (0, 16) if dim == 1 else (0, 0, 0, 16)
            linear.weight = torch.nn.Parameter(torch.nn.functional.pad(linear.weight.detach(), pad, value=0.5))
    exported = _qdq_linear_bytes(wide, tmp_path / "wide") - _qdq_linear_bytes(narrow, tmp_path / "narrow")
    assert weight_bytes(wide, scheme) - weight_bytes(narrow, scheme) == exported
    # and the whole of it: every decoder linear's codes, scales and zero points, the rest (norms, the float
    # embedding / LM head) at 4 bytes a parameter
    linears = fake_quant.decoder_linears(narrow).values()
    rest = 4 * (sum(p.numel() for p in narrow.parameters()) - sum(m.weight.numel() for m in linears))
    assert weight_bytes(narrow, scheme) - rest == _qdq_linear_bytes(narrow, tmp_path / "again")
