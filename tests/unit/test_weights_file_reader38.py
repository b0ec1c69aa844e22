"""model.onnx's initializers as edgesdk.weights_file reads them from the protobuf wire format (the board has no
onnx package) against onnx's own parse of the same bytes: every field the reader uses (dims packed and not,
int64 dims past 2**31 and negative, data_type, name, raw_data, external_data entries, data_location, each typed
data field; node inputs, outputs, names and the subgraphs of an If's branches and of a graphs attribute; graph
inputs; sparse initializers), the wire format's rules (a singular message written twice is merged, a varint's
bits past 64 are dropped) and the bytes it refuses (groups, field number 0, an 11-byte varint)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from google.protobuf.message import DecodeError  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402
from onnx.external_data_helper import set_external_data  # noqa: E402

from edgesdk.errors import BundleError  # noqa: E402
from edgesdk.weights_file import graph_data_problems, read_graph_tensors  # noqa: E402

TYPED_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append(value & 0x7F | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _write(tmp_path, data: bytes):
    path = tmp_path / "model.onnx"
    path.write_bytes(data)
    return path


def _as_onnx_reads_it(model) -> tuple[list[tuple], list[tuple[str, str]]]:
    """The initializers and dangling node inputs of ``model``, from onnx's parse, in the reader's order."""
    tensors, dangling = [], []

    def walk(graph, outer: set[str]) -> None:
        names = (outer | {value.name for value in graph.input} | {tensor.name for tensor in graph.initializer}
                 | {sparse.values.name for sparse in graph.sparse_initializer}
                 | {output for node in graph.node for output in node.output})
        for tensor in graph.initializer:
            external = ({entry.key: entry.value for entry in tensor.external_data}
                        if tensor.data_location == TensorProto.EXTERNAL else None)
            tensors.append((tensor.name, tensor.data_type, list(tensor.dims), external,
                            len(tensor.raw_data) if tensor.raw_data else None,
                            any(len(getattr(tensor, field)) for field in TYPED_FIELDS)))
        for node in graph.node:
            dangling.extend((node.name, value) for value in node.input if value and value not in names)
            for attribute in node.attribute:
                for subgraph in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                    walk(subgraph, names)

    walk(model.graph, set())
    return tensors, dangling


def _as_read(path) -> tuple[list[tuple], list[tuple[str, str]]]:
    tensors, dangling = read_graph_tensors(path)
    return [(t.name, t.data_type, t.dims, t.external, t.inline_bytes, t.typed_data) for t in tensors], dangling


def _every_field_model():
    raw = helper.make_tensor("raw", TensorProto.FLOAT, [2, 3], np.arange(6, dtype=np.float32).tobytes(), raw=True)
    huge = TensorProto(name="huge", data_type=TensorProto.INT8, dims=[2 ** 33, 3], raw_data=b"-")
    set_external_data(huge, "model.onnx.data", offset=64, length=3 * 2 ** 33)
    huge.data_location = TensorProto.EXTERNAL
    huge.ClearField("raw_data")
    negative = TensorProto(name="negative", data_type=TensorProto.FLOAT, dims=[-1, 2 ** 40])
    typed = [helper.make_tensor("floats", TensorProto.FLOAT, [2], [1.0, 2.0]),
             helper.make_tensor("int32s", TensorProto.INT32, [2], [1, -2]),
             helper.make_tensor("strings", TensorProto.STRING, [1], [b"a"]),
             helper.make_tensor("int64s", TensorProto.INT64, [2], [1, -(2 ** 40)]),
             helper.make_tensor("doubles", TensorProto.DOUBLE, [1], [0.5]),
             helper.make_tensor("uint64s", TensorProto.UINT64, [1], [2 ** 63])]
    then_branch = helper.make_graph(
        [helper.make_node("Add", ["then_bias", "raw"], ["then_out"], name="then_add")], "then", [],
        [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, None)],
        [helper.make_tensor("then_bias", TensorProto.FLOAT, [1], [1.0])])
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["renamed"], ["else_out"], name="else_identity")], "else", [],
        [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, None)])
    bodies = [helper.make_graph([helper.make_node("Identity", [name], [f"{name}_out"], name=f"{name}_identity")],
                                name, [], [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, None)],
                                [helper.make_tensor(f"{name}_table", TensorProto.FLOAT, [1], [2.0])])
              for name in ("cond", "missing")]
    nodes = [helper.make_node("If", ["cond"], ["chosen"], name="if", then_branch=then_branch, else_branch=else_branch),
             helper.make_node("Custom", ["chosen", "", "floats"], ["custom_out"], name="custom", domain="test",
                              bodies=bodies)]
    graph = helper.make_graph(nodes, "every_field", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("custom_out", TensorProto.FLOAT, None)],
                              [raw, huge, negative, *typed])
    return helper.make_model(graph)


def test_every_field_the_reader_uses_is_read_as_onnx_reads_it(tmp_path):
    model = _every_field_model()
    path = _write(tmp_path, model.SerializeToString())
    parsed = onnx.load(str(path), load_external_data=False)
    assert _as_read(path) == _as_onnx_reads_it(parsed)
    tensors, dangling = read_graph_tensors(path)
    assert [name for name, _ in dangling] == ["else_identity", "missing_identity"]
    assert {t.name: t.dims for t in tensors}["huge"] == [2 ** 33, 3]
    assert {t.name: t.dims for t in tensors}["negative"] == [-1, 2 ** 40]
    (tmp_path / "model.onnx.data").write_bytes(bytes(100))
    problems = graph_data_problems(path, tensors, dangling, None)
    assert f"initializer 'huge' reads bytes 64-{64 + 3 * 2 ** 33} of model.onnx.data, which holds 100" in problems
    assert "initializer 'negative' has shape [-1, 1099511627776]: a dimension is negative" in problems


def test_dims_written_one_varint_each_are_read_as_onnx_reads_them(tmp_path):
    """proto3 writes a repeated int64 packed; a parser takes it unpacked too (encoding guide, "Packed Repeated
    Fields")."""
    tensor = (_varint(1 << 3) + _varint(2 ** 33) + _varint(1 << 3) + _varint(-3) + _varint(2 << 3) + _varint(1)
              + _field(8, b"unpacked") + _field(9, bytes(4)))
    path = _write(tmp_path, _field(7, _field(5, tensor)))
    parsed = onnx.load(str(path), load_external_data=False)
    assert list(parsed.graph.initializer[0].dims) == [2 ** 33, -3]
    assert _as_read(path) == _as_onnx_reads_it(parsed)


def test_a_graph_written_in_two_parts_is_read_merged_as_onnx_reads_it(tmp_path):
    """ModelProto.graph is a singular message: written twice, protobuf merges the two, so onnxruntime loads the
    initializers of both and a node of the second may read one of the first."""
    first = helper.make_graph([], "first", [], [], [helper.make_tensor("w", TensorProto.FLOAT, [1], [1.0])])
    second = helper.make_graph([helper.make_node("Identity", ["w"], ["y"], name="reads_w")], "", [],
                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
                               [helper.make_tensor("v", TensorProto.FLOAT, [1], [2.0])])
    model = helper.make_model(first)
    path = _write(tmp_path, model.SerializeToString() + _field(7, second.SerializeToString()))
    parsed = onnx.load(str(path), load_external_data=False)
    assert [tensor.name for tensor in parsed.graph.initializer] == ["w", "v"]
    assert _as_read(path) == _as_onnx_reads_it(parsed)
    assert _as_read(path)[1] == []
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert session.run(None, {})[0].tolist() == [1.0]


def test_a_node_reading_a_sparse_initializer_reads_a_value_in_scope(tmp_path):
    """GraphProto.sparse_initializer names values as an initializer does; onnxruntime runs the graph."""
    values = helper.make_tensor("sparse", TensorProto.FLOAT, [2], [1.0, 3.0])
    indices = helper.make_tensor("indices", TensorProto.INT64, [2], [0, 3])
    graph = helper.make_graph([helper.make_node("Identity", ["sparse"], ["y"], name="reads_sparse")], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [],
                              sparse_initializer=[helper.make_sparse_tensor(values, indices, [4])])
    path = _write(tmp_path, helper.make_model(graph).SerializeToString())
    tensors, dangling = read_graph_tensors(path)
    assert dangling == []
    assert graph_data_problems(path, tensors, dangling, None) == []
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert session.run(None, {})[0].tolist() == [1.0, 0.0, 0.0, 3.0]


@pytest.mark.parametrize("last", [0x01, 0x02, 0x7F])
def test_a_ten_byte_varints_bits_past_64_are_dropped_as_protobuf_drops_them(tmp_path, last):
    dims = _varint(1 << 3) + b"\xff" * 9 + bytes([last])
    path = _write(tmp_path, _field(7, _field(5, dims + _field(8, b"w"))))
    parsed = onnx.load(str(path), load_external_data=False)
    assert _as_read(path) == _as_onnx_reads_it(parsed)


@pytest.mark.parametrize(("data", "what", "protobuf_refuses"), [
    # a group (proto2's wire types 3 and 4): protobuf skips one as an unknown field; onnx.proto3 writes none
    (_field(7, _varint(30 << 3 | 3) + _varint(30 << 3 | 4)), "wire type 3, which onnx.proto3 does not use", False),
    (_field(7, _varint(0 << 3 | 0) + _varint(1)), "has the number 0, which protobuf reserves", True),
    (_field(7, _varint(1 << 3 | 0) + b"\x80" * 10 + b"\x00"), "longer than a varint's 10 bytes", True),
    (_field(7, _varint(5 << 3 | 2) + _varint(50) + bytes(10)), "field 5 of 50 bytes runs past byte", True),
])
def test_bytes_the_reader_cannot_read_are_refused_by_name(tmp_path, data, what, protobuf_refuses):
    if protobuf_refuses:
        with pytest.raises(DecodeError):
            onnx.ModelProto.FromString(data)
    with pytest.raises(BundleError, match=f"model.onnx is not a readable ONNX model .*{what}") as info:
        read_graph_tensors(_write(tmp_path, data))
    assert info.value.fix


@pytest.mark.parametrize(("data_type", "values"), [(TensorProto.UINT2, [0.0, 1.0, 2.0, 3.0]),
                                                   (TensorProto.INT2, [0.0, 1.0, -2.0, -1.0])])
def test_two_bit_initializers_are_sized_four_to_a_byte_as_onnxruntime_sizes_them(tmp_path, data_type, values):
    """onnx.proto3's UINT2 and INT2 (ONNX 1.20): onnxruntime runs them; they were refused as no ONNX type."""
    packed = TensorProto(name="codes", data_type=data_type, dims=[4], raw_data=bytes([0b11100100]))
    graph = helper.make_graph([helper.make_node("Cast", ["codes"], ["y"], to=TensorProto.FLOAT)], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [packed])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])
    path = _write(tmp_path, model.SerializeToString())
    tensors, dangling = read_graph_tensors(path)
    assert graph_data_problems(path, tensors, dangling, None) == []
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert session.run(None, {})[0].tolist() == values
    model.graph.initializer[0].raw_data = bytes(2)
    path = _write(tmp_path, model.SerializeToString())
    assert graph_data_problems(path, *read_graph_tensors(path), None) == [
        f"initializer 'codes' holds 2 bytes; its shape [4] of type {data_type} needs 1"]
