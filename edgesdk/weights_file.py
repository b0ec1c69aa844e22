"""The bundle's weights file (the graph's external data), stored plain or entropy-coded.

Quantized codes are far from uniformly distributed: the 4-bit codes of bell-shaped weights (and
the INT8 codes of an 8-bit embedding) carry fewer bits of information than they occupy. DEFLATE
(``zlib``, in every Python's standard library, so on every board) stores the default bundle's
INT4 SmolLM2-135M weights file (INT4 embedding, float16 scales) in 91 % of its bytes: 66.1 of
72.6 MB (README.md). This is the last step of Deep Compression (Han et al. 2016: pruning, trained
quantization, then Huffman coding), with DEFLATE's Huffman stage in place of a hand-made code.

The board inflates the file into memory, checks its length and SHA-256 against the manifest, and
hands the bytes to ONNX Runtime as the graph's external data
(``SessionOptions.add_external_initializers_from_files_in_memory``, ONNX Runtime >= 1.23). Older
releases (JetPack images often carry one) get the bytes through a private temporary directory
that is removed once the session has loaded. Either way the weights in memory are the same bytes
as a plain bundle's, so speed and numerics do not change; only the bundle on disk and over the
wire is smaller, and loading takes the inflate time (~0.5 s per 100 MB on a 2-core x86 host).

The manifest's ``graph.weights`` record::

    {"file": "model.onnx.data.zlib", "codec": "zlib", "external_name": "model.onnx.data",
     "bytes": <inflated length>, "sha256": <of the inflated bytes>}
"""

from __future__ import annotations

import hashlib
import math
import shutil
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from edgesdk.errors import BundleError, RuntimeBackendError

CODECS = ("none", "zlib")
CHUNK = 1 << 22  # bytes read per step while deflating (bounded memory)
ZLIB_LEVEL = 9  # DEFLATE's smallest output; inflating costs the same at any level
DEFLATE_MAX_RATIO = 1032  # the most bytes DEFLATE inflates one byte to (zlib's technical details: 1032:1)


def store_weights(source: Path, destination_dir: Path, codec: str) -> tuple[str, dict | None]:
    """Write ``source`` into ``destination_dir`` with ``codec``.

    Returns the file name written and the manifest record (None for a plain copy)."""
    if codec not in CODECS:
        raise ValueError(f"weights codec must be one of {CODECS}, got {codec!r}")
    if codec == "none":
        shutil.copyfile(source, destination_dir / source.name)
        return source.name, None
    name = f"{source.name}.{codec}"
    digest, length = hashlib.sha256(), 0
    deflater = zlib.compressobj(ZLIB_LEVEL)
    with open(source, "rb") as plain, open(destination_dir / name, "wb") as packed:
        while chunk := plain.read(CHUNK):
            digest.update(chunk)
            length += len(chunk)
            packed.write(deflater.compress(chunk))
        packed.write(deflater.flush())
    return name, {"file": name, "codec": codec, "external_name": source.name, "bytes": length,
                  "sha256": digest.hexdigest()}


def loaded_bytes(name: str, size: int | None, record: dict | None) -> int | None:
    """The bytes the bundle file ``name`` of ``size`` takes once loaded: its size, or for the entropy-coded weights
    file (the manifest's ``graph.weights`` ``record``) the inflated length the runtime hands ONNX Runtime."""
    if isinstance(record, dict) and record.get("file") == name and record.get("codec", "none") != "none" \
            and isinstance(record.get("bytes"), int):
        return record["bytes"]
    return size


def inflate_weights(bundle_dir: Path, record: dict) -> bytes:
    """The weights file's bytes as the graph expects them; a damaged file is refused here."""
    path = Path(bundle_dir) / record["file"]
    if record.get("codec") != "zlib":
        raise BundleError(f"{path} uses weights codec {record.get('codec')!r}; this edgesdk inflates 'zlib' (a plain "
                          "weights file has no graph.weights record)",
                          "upgrade edgesdk on this machine, or rebuild the bundle with export.weights_codec: none")
    inflater = zlib.decompressobj()
    try:
        coded = path.read_bytes()
        # At most one byte past the manifest's length: a stream that would inflate further (a bundle whose
        # manifest was rewritten to match it) is refused below instead of filling the memory first. No stream
        # inflates past DEFLATE's ratio either, which keeps a manifest's huge length within what zlib can count.
        limit = min(max(int(record["bytes"]), 0), DEFLATE_MAX_RATIO * len(coded))
        data = inflater.decompress(coded, limit + 1)
    except (OSError, zlib.error) as exc:
        raise BundleError(f"{path} could not be inflated ({exc})",
                          "run 'edgesdk verify' on the bundle, then re-copy or rebuild it") from exc
    if len(data) == record["bytes"] and not (inflater.eof and not inflater.unused_data):
        # store_weights writes one whole stream: one cut before its check value, or followed by other bytes, is not it
        raise BundleError(f"{path} is not one whole zlib stream ("
                          + ("bytes follow its end" if inflater.eof else "it ends before its check value") + ")",
                          "re-copy the bundle from the host or rebuild it")
    if len(data) != record["bytes"] or hashlib.sha256(data).hexdigest() != record["sha256"]:
        # inflating stops one byte past the manifest's length: a longer stream is known only to be longer
        length = f"more than {record['bytes']:,}" if len(data) > record["bytes"] else f"{len(data):,}"
        raise BundleError(f"{path} inflates to bytes that differ from the manifest's (length {length}, "
                          f"expected {record['bytes']:,}, or a different sha256)",
                          "re-copy the bundle from the host or rebuild it")
    return data


def open_session(model_path: Path, options, providers: list[str], record: dict | None, in_memory: bool | None = None,
                 provider_options: list[dict] | None = None,
                 graph_tensors: tuple[list[GraphTensor], list[tuple[str, str]]] | None = None):
    """An ``onnxruntime.InferenceSession`` for ``model_path`` whose external data is plain on disk
    (``record`` None) or stored by :func:`store_weights`. ``in_memory`` (default: when ONNX Runtime
    offers it) passes the inflated bytes without touching the disk; otherwise they go to a temporary
    directory that is gone once the session exists, so the execution providers and their options
    (``provider_options``, one dict per provider) must be final here: ``set_providers`` would
    reload the model from that directory. ``options`` are single-use with in-memory weights: ONNX
    Runtime keeps a pointer to bytes that are freed on return, so make fresh options for every
    session (``edgesdk.runtime.ort_backend.make_session_options``). The graph's initializers first meet
    :func:`graph_data_problems` (``graph_tensors``: :func:`read_graph_tensors` of ``model_path``, read
    here when not given), which names what onnxruntime would fail on or read wrongly."""
    import onnxruntime as ort

    tensors, dangling = graph_tensors if graph_tensors is not None else read_graph_tensors(model_path)
    if record is None:
        check_graph_data(model_path, graph_data_problems(model_path, tensors, dangling, None))
        return ort.InferenceSession(str(model_path), options, providers=providers, provider_options=provider_options)
    data = inflate_weights(model_path.parent, record)
    check_graph_data(model_path, graph_data_problems(model_path, tensors, dangling, record, len(data)))
    if in_memory is None:
        in_memory = hasattr(options, "add_external_initializers_from_files_in_memory")
    if in_memory:
        options.add_external_initializers_from_files_in_memory([record["external_name"]], [data], [len(data)])
        return ort.InferenceSession(str(model_path), options, providers=providers, provider_options=provider_options)
    with tempfile.TemporaryDirectory(prefix="edgesdk-weights-") as tmp:
        try:
            shutil.copyfile(model_path, Path(tmp) / model_path.name)
            (Path(tmp) / record["external_name"]).write_bytes(data)
        except OSError as exc:
            raise _temporary_copy_error(model_path, tmp, len(data), exc, ort.__version__) from exc
        return ort.InferenceSession(str(Path(tmp) / model_path.name), options, providers=providers,
                                    provider_options=provider_options)


def _temporary_copy_error(model_path: Path, directory: str, size: int, exc: OSError, version: str):
    """The error for inflated weights that could not be written to the temporary directory (a full
    disk, a quota): it names that directory and the room needed, not the bundle, which is fine."""
    needed_mb = math.ceil((size + model_path.stat().st_size) / 1e6)
    return RuntimeBackendError(
        f"the inflated weights of {model_path.parent} could not be written to the temporary directory "
        f"{directory}: {exc.strerror or exc} (onnxruntime {version} is handed them as files there, "
        f"{needed_mb} MB with the graph, removed once the session has loaded)",
        f"free {needed_mb} MB in {Path(directory).parent}, or point TMPDIR at a directory with that much room "
        "(e.g. TMPDIR=/var/tmp); onnxruntime >= 1.23 takes the weights from memory and needs no copy",
    )


# --- the graph's initializers, read from model.onnx's protobuf wire format -------------------------------
# The board runtime has no ``onnx`` package, so the few fields checked before onnxruntime loads the graph
# are read here, as protobuf's encoding guide (protobuf.dev/programming-guides/encoding) lays them out and
# with onnx/onnx.proto3's field numbers. Every other field is skipped by its wire type.
VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5  # the wire types proto3 writes (3 and 4, groups: proto2's)
VARINT_BITS = 64  # a varint's value: at most 64 bits, in up to 10 bytes of 7
MODEL_GRAPH = 7
GRAPH_NODE, GRAPH_INITIALIZER, GRAPH_INPUT, GRAPH_SPARSE_INITIALIZER = 1, 5, 11, 15
NODE_INPUT, NODE_OUTPUT, NODE_NAME, NODE_ATTRIBUTE = 1, 2, 3, 5
ATTRIBUTE_GRAPH, ATTRIBUTE_GRAPHS = 6, 11  # AttributeProto.g (one subgraph: If's branches) and .graphs
VALUE_INFO_NAME = 1
SPARSE_TENSOR_VALUES = 1  # SparseTensorProto.values: a TensorProto whose name is the sparse initializer's
TENSOR_DIMS, TENSOR_DATA_TYPE, TENSOR_NAME, TENSOR_RAW_DATA = 1, 2, 8, 9
TENSOR_EXTERNAL_DATA, TENSOR_DATA_LOCATION = 13, 14
ENTRY_KEY, ENTRY_VALUE = 1, 2  # StringStringEntryProto, an external_data entry
DATA_LOCATION_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
# float_data, int32_data, string_data, int64_data, double_data, uint64_data: the tensor's values, typed
TENSOR_TYPED_DATA = (4, 5, 6, 7, 10, 11)

# TensorProto.DataType -> bytes per element (sub-byte types as a fraction, packed with no gaps: INT4, UINT4 and
# FLOAT4E2M1 two to a byte, INT2 and UINT2 four, as onnxruntime sizes their raw data)
ELEMENT_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 14: 8, 15: 16, 16: 2,
                 17: 1, 18: 1, 19: 1, 20: 1, 21: 0.5, 22: 0.5, 23: 0.5, 24: 1, 25: 0.25, 26: 0.25}


class _Malformed(ValueError):
    """model.onnx is not a protobuf message of the expected shape."""


def _varint(data: memoryview, at: int) -> tuple[int, int]:
    """The varint at ``at`` and the offset after it; one of more than 10 bytes is refused, and the bits of a
    10th byte past the 64th are dropped (protobuf reads ``ff ff ff ff ff ff ff ff ff 7f`` as -1 too)."""
    value, shift = 0, 0
    while True:
        if at >= len(data):
            raise _Malformed(f"a number runs past byte {at}")
        if shift >= VARINT_BITS:
            raise _Malformed(f"a number at byte {at} is longer than a varint's 10 bytes")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if byte < 0x80:
            return value & ((1 << VARINT_BITS) - 1), at
        shift += 7


def _fields(data: memoryview):
    """(field number, wire type, value) of one message: an int, or the bytes of a length-delimited field."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise _Malformed(f"a field before byte {at} has the number 0, which protobuf reserves")
        if wire == VARINT:
            value, at = _varint(data, at)
        elif wire in (FIXED64, FIXED32):
            size = 8 if wire == FIXED64 else 4
            if at + size > len(data):
                raise _Malformed(f"a fixed-size field runs past byte {len(data)}")
            value, at = int.from_bytes(data[at:at + size], "little"), at + size
        elif wire == LENGTH_DELIMITED:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise _Malformed(f"field {number} of {size} bytes runs past byte {len(data)}")
            value, at = data[at:at + size], at + size
        else:
            raise _Malformed(f"field {number} has wire type {wire}, which onnx.proto3 does not use")
        yield number, wire, value


def _length_delimited(data: memoryview, number: int) -> list[memoryview]:
    """The values of field ``number`` in ``data`` (embedded messages, strings), in order."""
    return [value for field, wire, value in _fields(data) if field == number and wire == LENGTH_DELIMITED]


def _merged(parts: list[memoryview]) -> memoryview:
    """A singular message field written more than once: protobuf merges the parts, which reads as one
    message of their bytes joined (encoding guide, "Last One Wins": embedded messages are merged)."""
    return parts[0] if len(parts) == 1 else memoryview(b"".join(parts))


def _text(value: memoryview) -> str:
    return bytes(value).decode("utf-8", "replace")


def _last_text(data: memoryview, number: int) -> str:
    """A singular string field: its last value ("" when absent), as protobuf reads a field written twice."""
    texts = _length_delimited(data, number)
    return _text(texts[-1]) if texts else ""


@dataclass
class GraphTensor:
    """One initializer of the graph: its name, element type, shape, and where its bytes are."""

    name: str
    data_type: int
    dims: list[int]
    external: dict[str, str] | None  # location, offset, length ... when stored in an external file
    inline_bytes: int | None  # raw_data's length; None when the tensor has no raw_data
    typed_data: bool  # float_data, int32_data ... hold its values

    @property
    def elements(self) -> int:
        return math.prod(self.dims)

    def expected_bytes(self) -> int | None:
        size = ELEMENT_BYTES.get(self.data_type)
        return None if size is None or any(d < 0 for d in self.dims) else math.ceil(self.elements * size)


def _signed(value: int) -> int:
    """An int64 field's value: protobuf writes a negative one as its 64-bit two's complement."""
    return value - (1 << VARINT_BITS) if value >= 1 << (VARINT_BITS - 1) else value


def _tensor(data: memoryview) -> GraphTensor:
    """The fields of one TensorProto that the checks read; a singular field written twice keeps its last value."""
    name, data_type, dims, external, location, raw, typed = "", 0, [], {}, 0, None, False
    for number, wire, value in _fields(data):
        if number == TENSOR_DIMS and wire == VARINT:
            dims.append(_signed(value))
        elif number == TENSOR_DIMS and wire == LENGTH_DELIMITED:  # packed, as proto3 writes a repeated int64
            at = 0
            while at < len(value):
                dim, at = _varint(value, at)
                dims.append(_signed(dim))
        elif number == TENSOR_DATA_TYPE and wire == VARINT:
            data_type = _signed(value)  # an enum is an int32, written as int64 when negative
        elif number == TENSOR_NAME and wire == LENGTH_DELIMITED:
            name = _text(value)
        elif number == TENSOR_RAW_DATA and wire == LENGTH_DELIMITED:
            raw = len(value)
        elif number == TENSOR_EXTERNAL_DATA and wire == LENGTH_DELIMITED:
            external[_last_text(value, ENTRY_KEY)] = _last_text(value, ENTRY_VALUE)
        elif number == TENSOR_DATA_LOCATION and wire == VARINT:
            location = value
        elif number in TENSOR_TYPED_DATA:
            typed = True
    return GraphTensor(name, data_type, dims, external if location == DATA_LOCATION_EXTERNAL else None, raw, typed)


def _node(data: memoryview) -> tuple[str, list[str], list[str], list[memoryview]]:
    """A NodeProto's name, inputs, outputs, and the subgraphs its attributes hold."""
    name, inputs, outputs, subgraphs = "", [], [], []
    for number, wire, value in _fields(data):
        if wire != LENGTH_DELIMITED:
            continue
        if number == NODE_INPUT:
            inputs.append(_text(value))
        elif number == NODE_OUTPUT:
            outputs.append(_text(value))
        elif number == NODE_NAME:
            name = _text(value)
        elif number == NODE_ATTRIBUTE:
            graph = _length_delimited(value, ATTRIBUTE_GRAPH)
            subgraphs += ([_merged(graph)] if graph else []) + _length_delimited(value, ATTRIBUTE_GRAPHS)
    return name, inputs, outputs, subgraphs


def _graph(data: memoryview, tensors: list[GraphTensor], outer: set[str], dangling: list[tuple[str, str]]) -> None:
    """Collect a graph's initializers (and its subgraphs'), and the node inputs that name no value in scope: a
    graph input, an initializer (a sparse one too), a node output, or one of the enclosing graphs' (ONNX IR,
    "Names Within a Graph": a subgraph may read the names of the graphs around it)."""
    nodes, names = [], set(outer)
    for number, wire, value in _fields(data):
        if wire != LENGTH_DELIMITED:
            continue
        if number == GRAPH_INITIALIZER:
            tensor = _tensor(value)
            tensors.append(tensor)
            names.add(tensor.name)
        elif number == GRAPH_SPARSE_INITIALIZER:
            values = _length_delimited(value, SPARSE_TENSOR_VALUES)
            if values:
                names.add(_last_text(_merged(values), TENSOR_NAME))
        elif number == GRAPH_INPUT:
            names.add(_last_text(value, VALUE_INFO_NAME))
        elif number == GRAPH_NODE:
            name, inputs, outputs, subgraphs = _node(value)
            nodes.append((name, inputs, subgraphs))
            names.update(outputs)
    for name, inputs, subgraphs in nodes:
        dangling += [(name, value) for value in inputs if value and value not in names]
        for subgraph in subgraphs:
            _graph(subgraph, tensors, names, dangling)


def read_graph_tensors(model_path: Path) -> tuple[list[GraphTensor], list[tuple[str, str]]]:
    """The initializers of ``model_path`` (subgraphs' too) and the (node, input) pairs whose input names no
    graph input, initializer or node output in scope; a file that is no ONNX model is refused by name."""
    model_path = Path(model_path)
    try:
        data = memoryview(model_path.read_bytes())
        tensors, dangling = [], []
        graphs = _length_delimited(data, MODEL_GRAPH)
        if not graphs:
            raise _Malformed("it holds no graph")
        _graph(_merged(graphs), tensors, set(), dangling)
    except OSError as exc:
        raise BundleError(f"bundle {model_path.parent}: {model_path.name} cannot be read ({exc.strerror or exc})",
                          "run 'edgesdk verify' on the bundle, then re-copy or rebuild it") from exc
    except (_Malformed, RecursionError) as exc:
        raise BundleError(f"bundle {model_path.parent}: {model_path.name} is not a readable ONNX model ({exc})",
                          REBUILD) from exc
    return tensors, dangling


def check_graph_data(model_path: Path, problems: list[str]) -> None:
    """Refuse the graph with each of ``problems`` (graph_data_problems) named."""
    if problems:
        raise BundleError(f"bundle {model_path.parent}: {model_path.name} does not match its weights:\n  - "
                          + "\n  - ".join(problems), REBUILD)


REBUILD = ("the bundle was edited along with the hashes in its manifest; rebuild it with 'edgesdk build' (or re-copy "
           "it from the host)")


def graph_data_problems(model_path: Path, tensors: list[GraphTensor], dangling: list[tuple[str, str]],
                        record: dict | None, inflated: int | None = None) -> list[str]:
    """What in the graph's initializers onnxruntime would fail on, or read as other bytes than the export
    wrote: a node input naming no value (a renamed initializer), an element type ONNX does not define, a
    negative dimension, inline bytes or an external length that do not hold the shape, an external file
    that is not the bundle's weights file, a range past its end, and ranges that overlap (the exporter
    writes each tensor's bytes once, one after another: an offset moved within the file reads a
    neighbour's bytes with no error). ``record`` is the manifest's 'graph.weights' (None: the file lies
    beside the graph) and ``inflated`` the length of its inflated bytes."""
    problems = [f"node {node!r} reads {value!r}, which no graph input, initializer or node output provides"
                for node, value in dangling[:5]]
    sizes: dict[str, int | None] = {}
    ranges: dict[str, list[tuple[int, int, str]]] = {}
    for tensor in tensors:
        where = f"initializer {tensor.name!r}"
        if tensor.data_type not in ELEMENT_BYTES:
            problems.append(f"{where} has element type {tensor.data_type}, which is no ONNX tensor type this graph "
                            f"can hold (TensorProto.DataType {min(ELEMENT_BYTES)}-{max(ELEMENT_BYTES)}, not 8)")
            continue
        if any(dim < 0 for dim in tensor.dims):
            problems.append(f"{where} has shape {tensor.dims}: a dimension is negative")
            continue
        needed = tensor.expected_bytes()
        if tensor.external is None:
            if tensor.inline_bytes is not None and tensor.inline_bytes != needed:
                problems.append(f"{where} holds {tensor.inline_bytes} bytes; its shape {tensor.dims} of type "
                                f"{tensor.data_type} needs {needed}")
            elif tensor.inline_bytes is None and not tensor.typed_data and tensor.elements:
                problems.append(f"{where} of shape {tensor.dims} holds no data")
            continue
        location = tensor.external.get("location", "")
        if location not in sizes:
            sizes[location] = _external_size(model_path, location, record, inflated)
        size = sizes[location]
        if size is None:
            continue  # named once below
        try:
            offset = int(tensor.external.get("offset", "0"))
            length = int(tensor.external.get("length", str(needed)))
        except ValueError:
            problems.append(f"{where} has offset {tensor.external.get('offset')!r} and length "
                            f"{tensor.external.get('length')!r} in {location}: expected whole numbers")
            continue
        if offset < 0 or length != needed:
            problems.append(f"{where} reads {length} bytes at offset {offset} of {location}; its shape {tensor.dims} "
                            f"of type {tensor.data_type} needs {needed} bytes at an offset >= 0")
        elif offset + length > size:
            problems.append(f"{where} reads bytes {offset}-{offset + length} of {location}, which holds {size}")
        else:
            ranges.setdefault(location, []).append((offset, offset + length, tensor.name))
    for location, size in sizes.items():
        if size is None:
            problems.append(_missing_location(model_path, location, record))
    for location, spans in ranges.items():
        spans.sort()
        for (start, end, name), (next_start, next_end, next_name) in zip(spans, spans[1:], strict=False):
            if next_start < end:
                problems.append(f"initializers {name!r} (bytes {start}-{end}) and {next_name!r} (bytes "
                                f"{next_start}-{next_end}) overlap in {location}: each tensor's bytes are its own")
    return problems


def _external_size(model_path: Path, location: str, record: dict | None, inflated: int | None) -> int | None:
    """The length of the external file ``location``, or None when it is not the bundle's weights file."""
    if record is not None:
        return inflated if location == record["external_name"] else None
    if not _names_a_file_beside(model_path, location):
        return None
    path = model_path.parent / location
    return path.stat().st_size if path.is_file() else None


def _missing_location(model_path: Path, location: str, record: dict | None) -> str:
    if record is not None:
        return (f"initializers are stored in {location!r}, but the bundle's weights ('graph.weights.external_name') "
                f"are {record['external_name']!r}")
    if not _names_a_file_beside(model_path, location):
        return f"initializers are stored in {location!r}, which is not a weights file in the bundle"
    return (f"initializers are stored in {location!r}, which the bundle lacks (a bundle whose weights are "
            "entropy-coded names them in 'graph.weights')")


def _names_a_file_beside(model_path: Path, location: str) -> bool:
    """``location`` is a plain file name in the graph's directory other than the graph's own: no path, no
    ``..`` (ONNX's external data spec takes a location relative to the model's directory; onnxruntime refuses
    one that leaves it)."""
    return PurePosixPath(location).name == location and location not in ("", ".", "..", model_path.name)
