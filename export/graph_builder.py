"""A thin helper over ``onnx.helper`` that names nodes and values and collects initializers."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class GraphBuilder:
    """Accumulates nodes and initializers; every op call returns its output name(s)."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._names: set[str] = set()
        self._counter = 0

    def fresh(self, hint: str) -> str:
        self._counter += 1
        name = f"{hint}_{self._counter}"
        self._names.add(name)
        return name

    def const(self, value: np.ndarray, name: str | None = None) -> str:
        """Register an initializer (weights or small constants)."""
        name = name or self.fresh("const")
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def scalar(self, value: np.generic, name: str | None = None) -> str:
        """Register a rank-0 initializer, which :meth:`const` would store as (1,): Range's start, limit and delta
        must be scalars (ONNX Range; OpenVINO and strict shape inference refuse a (1,) tensor), and a
        per-tensor QuantizeLinear scale or zero point of shape (1,) reads as per-axis to TensorRT."""
        name = name or self.fresh("const")  # const_N: the graph's own small constants, as const()'s
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def i64(self, values: list[int]) -> str:
        return self.const(np.asarray(values, dtype=np.int64))

    def op(self, op_type: str, inputs: list[str], outputs: int | list[str] = 1, domain: str = "",
           name: str | None = None, **attrs) -> str | list[str]:
        """Add a node; returns one output name, or a list when ``outputs`` > 1 or is a list."""
        node_name = name or self.fresh(op_type)
        if isinstance(outputs, int):
            out_names = [f"{node_name}/out{i}" for i in range(outputs)]
        else:
            out_names = outputs
        self.nodes.append(helper.make_node(op_type, inputs, out_names, name=node_name, domain=domain, **attrs))
        if isinstance(outputs, int) and outputs == 1:
            return out_names[0]
        return out_names

    def model(self, name: str, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
              opset: int, extra_opsets: dict[str, int] | None = None, doc: str = "") -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.initializers, doc_string=doc)
        opsets = [helper.make_opsetid("", opset)]
        opsets += [helper.make_opsetid(domain, version) for domain, version in (extra_opsets or {}).items()]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="edgesdk")
        model.ir_version = 8 if opset <= 17 else 9
        return model


def tensor_input(name: str, elem: int, shape: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
