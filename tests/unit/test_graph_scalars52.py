"""The standard graph's Range nodes take scalars, as the ONNX spec says (``start``, ``limit``, ``delta``: "Scalar");
``GraphBuilder.const`` stored 0-d constants as (1,), which ONNX Runtime accepts but OpenVINO and strict
shape inference refuse, and which TensorRT's parser need not take."""

from __future__ import annotations

import onnx
import pytest

pytest.importorskip("torch")

from edgesdk.export.onnx_export import ExportConfig, export_model  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


@pytest.mark.parametrize("weights", ["fp32", "int8"])
def test_every_range_input_the_graph_stores_is_a_scalar(tmp_path, weights):
    export_model(tiny_llama(vocab_size=96, max_positions=64), tmp_path, ExportConfig(weights=weights))
    graph = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False).graph
    stored = {tensor.name: list(tensor.dims) for tensor in graph.initializer}
    ranges = [node for node in graph.node if node.op_type == "Range"]
    assert ranges, "the standard graph computes its positions with Range"
    shapes = {name: stored[name] for node in ranges for name in node.input if name in stored}
    assert shapes
    assert all(dims == [] for dims in shapes.values()), shapes
