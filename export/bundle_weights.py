"""Read a fused bundle's decoder back out of its ONNX graph: the stored weights, bit for bit.

The ``ort-fused`` graph (export/fused_graph.py) holds each layer's linears as fused units
(``attn.qkv``, ``attn.o``, ``mlp.gate_up``, ``mlp.down``), each either MatMulNBits codes with
float16 block scales or a float32 MatMul weight, plus the norms, the rotary tables and the tied or
untied embedding. This module gives them back as they are stored, so a converter (the GGUF export,
export/gguf_export.py) can re-encode the exact weights the bundle runs instead of quantizing again.

Matrices are returned with one row per output feature, as llama.cpp and Hugging Face store them:
a quantized unit is a :class:`~edgesdk.export.blockwise.BlockQuantized` (rows = N), a float one a
float32 (N, K) array.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgesdk.errors import ExportError
from edgesdk.export.blockwise import BlockQuantized

Matrix = BlockQuantized | np.ndarray  # (N, K) float32 when a plain array
UNITS = ("attn.qkv", "attn.o", "mlp.gate_up", "mlp.down")
FLOAT32_EPSILON = 2.0 ** -24  # float32's relative rounding: transformers computes inv_freq in float32


@dataclass
class BundleLayer:
    input_norm: np.ndarray  # (D,)
    post_attention_norm: np.ndarray  # (D,)
    heads: int
    kv_heads: int
    units: dict[str, Matrix]  # UNITS -> matrix; attn.qkv rows are [q | k | v], mlp.gate_up rows [gate | up]
    qkv_bias: np.ndarray | None = None  # ((Hq + 2 Hkv) * hd,)
    q_norm: np.ndarray | None = None  # (hd,) Qwen3, Gemma 3: the RMSNorm weight of every query head
    k_norm: np.ndarray | None = None  # (hd,) and of every key head
    attn_out_norm: np.ndarray | None = None  # (D,) Gemma 3: the norm of the attention's output
    ffn_out_norm: np.ndarray | None = None  # (D,) Gemma 3: and of the FFN's output
    rope: int | None = 0  # which of BundleDecoder.rope_bases rotates this layer; None: none (do_rotary 0, NoPE)
    window: int | None = None  # sliding attention: each query sees the last `window` positions (None: all)


@dataclass
class BundleDecoder:
    """A fused bundle's decoder as stored."""

    head_dim: int
    rms_eps: float
    rope_base: float | None  # theta of inv_freq_j = theta^(-2j / head_dim), fitted to the rotary tables; None
    # where no layer rotates (every layer NoPE)
    max_context: int
    embed: Matrix  # (V, D)
    final_norm: np.ndarray  # (D,)
    lm_head: Matrix | None  # (V, D); None when tied to the embedding
    layers: list[BundleLayer] = field(default_factory=list)
    rope_bases: list[float] = field(default_factory=list)  # theta of each rotary table (rope_base is table 0's)
    rope_factors: list[np.ndarray | None] = field(default_factory=list)  # each table's RotaryFit.factors
    rope_linear_factors: list[float] = field(default_factory=list)  # each table's RotaryFit.linear (1.0: unscaled)
    embed_scale: float = 1.0  # Gemma: the looked-up rows times sqrt(D)
    attention_scale: float | None = None  # softmax(q.k * this); None: 1/sqrt(head_dim)
    activation: str = "silu"  # the FFN's gate activation: silu (SwiGLU) | gelu_tanh (GeGLU)

    @property
    def hidden_size(self) -> int:
        return self.final_norm.shape[0]


def matrix_rows(matrix: Matrix) -> int:
    return matrix.n if isinstance(matrix, BlockQuantized) else matrix.shape[0]


def take_rows(matrix: Matrix, rows: np.ndarray | slice) -> Matrix:
    """The given output rows of ``matrix`` (a slice or an index array), in that order."""
    if not isinstance(matrix, BlockQuantized):
        return matrix[rows]
    blocks = matrix.packed.shape[1]
    packed = matrix.packed[rows]  # (n, blocks, bytes)
    scales = matrix.scales.reshape(matrix.n, blocks)[rows].reshape(-1)
    return BlockQuantized(packed, scales, matrix.bits, matrix.block_size, matrix.k, packed.shape[0])


FUSED_RECIPES = "default, int8-head, int8-only, int4, int4-small, fp32-fused, ..."  # recipes whose export.form is ort-fused
CPU_TARGETS = ("rpi5", "rpi4", "host")  # the ONNX Runtime CPU boards, whose recipes export the fused graph


def check_readable_form(bundle_dir: Path, manifest: dict) -> None:
    """Refuse a bundle whose graph :func:`read_bundle_decoder` cannot read layer by layer, naming what the bundle is
    (its target and recipe) and the build that gives one it can. Reads the manifest only: callers may run it before
    they hash the bundle's files."""
    import shlex

    from edgesdk.export.gated_graph import GATED_FORM

    form = _record(manifest, "graph").get("form")
    if form == GATED_FORM:
        raise ExportError(f"bundle {bundle_dir} has graph form {GATED_FORM!r}: the fused graph with the power stage's "
                          "per-token FFN gates and channel / query scales, which llama.cpp does not compute (its "
                          "weights without them compute another function than the bundle runs)",
                          "run this bundle with edgesdk, or build the model again without the power stage (the "
                          "power recipe's export alone is --recipe fp32-fused) and export that bundle")
    if form == "ort-fused":
        return
    target = _record(manifest, "target")
    recipe = _record(manifest, "recipe")
    source = _record(_record(manifest, "model"), "before").get("source")
    board = f"{target['name']} ({target['family']})" if target.get("family") else target.get("name", "an unknown target")
    made = f"recipe {recipe['name']!r}" if recipe.get("name") else "an unknown recipe"
    what = "the standard-op ONNX graph TensorRT builds engines from" if form == "standard" else "not the fused graph"
    model = shlex.quote(str(source)) if source else "<the model this bundle was built from>"
    raise ExportError(f"bundle {bundle_dir} was built for {board} with {made}: its graph form {form!r} is {what}; "
                      "GGUF export reads the weights layer by layer from the fused ONNX Runtime graph (form "
                      f"'ort-fused'), which a bundle for a CPU board ({', '.join(CPU_TARGETS)}) holds when built "
                      f"with a fused recipe ({FUSED_RECIPES})",
                      "build the model for a CPU board with a recipe whose graph form is ort-fused, and export that "
                      f"bundle: edgesdk build --model {model} "
                      f"--target {CPU_TARGETS[0]} --recipe default (or --target host); this bundle runs with edgesdk "
                      f"on {target.get('name', 'its board')}")


def _record(record: dict, key: str) -> dict:
    value = record.get(key)
    return value if isinstance(value, dict) else {}


def read_bundle_decoder(bundle_dir: Path, manifest: dict) -> BundleDecoder:
    """The decoder of a verified ``ort-fused`` bundle (``edgesdk.bundle.verify_bundle``)."""
    check_readable_form(bundle_dir, manifest)
    import onnx

    graph_record = manifest["graph"]
    model_path = Path(bundle_dir) / graph_record["file"]
    model = onnx.load(str(model_path), load_external_data=False)
    store = _Initializers(model.graph, Path(bundle_dir), graph_record.get("weights"))
    store.check(model_path)
    nodes = _NodeIndex(model.graph)
    embed, final_norm, lm_head = _embedding_and_head(store, nodes)
    head_dim = graph_record["head_dim"]
    tables: list[str] = []  # the rotary tables' cos names, in the order layers first use them
    layers = [_layer(store, nodes, i, tables) for i in range(graph_record["num_layers"])]
    eps = nodes.attribute("SimplifiedLayerNormalization", "layers.0.input_norm", "epsilon")
    fits = [fit_rope(store.array(cos), store.array(cos[: -len("cos")] + "sin"), head_dim, bundle_dir)
            for cos in tables]
    scales = {_attributes(nodes.node("GroupQueryAttention", f"past_key_values.{i}.key")).get("scale", 0.0)
              for i in range(len(layers))}
    scale = float(scales.pop()) if len(scales) == 1 else None
    if scale is None or math.isclose(scale, 0.0) or math.isclose(scale, head_dim ** -0.5, rel_tol=1e-6):
        scale = None  # GroupQueryAttention's default, 1/sqrt(head size)
    gelu = any(node.op_type == "FastGelu" for node in model.graph.node)
    return BundleDecoder(head_dim=head_dim, rms_eps=float(eps), rope_base=fits[0].theta if fits else None,
                         max_context=graph_record["max_context"], embed=embed, final_norm=final_norm,
                         lm_head=lm_head, layers=layers, rope_bases=[fit.theta for fit in fits],
                         rope_factors=[fit.factors for fit in fits],
                         rope_linear_factors=[fit.linear for fit in fits], embed_scale=_embed_scale(model.graph, store),
                         attention_scale=scale, activation="gelu_tanh" if gelu else "silu")


@dataclass(frozen=True)
class RotaryFit:
    """A rotary table as llama.cpp computes it: ``inv_freq_j = theta^(-2j / hd) / factors[j] / linear``."""

    theta: float
    factors: np.ndarray | None = None  # (hd/2,) llama.cpp's rope_freqs (Llama 3's scaling); None: plain RoPE
    linear: float = 1.0  # linear scaling's factor F (rope.scaling.factor; llama.cpp's freq_scale is 1/F); 1: none


def _measured_inv_freq(cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Each frequency of the tables (P, hd/2), read from the angle at the furthest position where it has
    turned less than half a circle (atan2 is exact there to float32's precision)."""
    positions, half = cos.shape
    first = np.arctan2(sin[1], cos[1]).astype(np.float64)  # inv_freq at position 1, each below pi
    far = np.clip(np.floor(2.5 / np.maximum(first, 1e-12)), 1, positions - 1).astype(int)
    return np.arctan2(sin[far, np.arange(half)], cos[far, np.arange(half)]) / far  # (hd/2,)


def _rebuild_error(cos: np.ndarray, sin: np.ndarray, inv_freq: np.ndarray) -> float:
    rebuilt = np.arange(cos.shape[0])[:, None] * inv_freq[None, :]  # (P, hd/2)
    return max(float(np.abs(np.cos(rebuilt) - cos).max()), float(np.abs(np.sin(rebuilt) - sin).max()))


def _theta_of(exponents: np.ndarray, inv_freq: np.ndarray) -> float:
    """The least-squares theta of log inv_freq_j = -(2j / hd) log theta over the entries given, a whole number
    where it lies within float32's reading of one (10,000, not 9,999.999)."""
    return _shortest_close(math.exp(-float(np.sum(exponents * np.log(inv_freq)) / np.sum(exponents ** 2))), 0)


def _shortest_close(value: float, most_decimals: int) -> float:
    """``value`` with the fewest decimals (up to ``most_decimals``) that lies within float32's reading of it (2.5,
    not 2.4999999), else as it is."""
    for decimals in range(most_decimals + 1):
        if abs(value - round(value, decimals)) < 1e-6 * value:
            return float(round(value, decimals))
    return value


def _scaled_fit(exponents: np.ndarray, inv_freq: np.ndarray) -> RotaryFit | None:
    """Llama 3's scaling (Meta's rope_type llama3): the highest frequencies as plain RoPE, the rest divided
    by factors from 1 up to its factor. theta comes from the longest run of leading frequencies that one
    theta fits to within 1e-4 (the first, whose inv_freq is 1 at any theta, and at least one more: an original
    context short against theta puts the band between at the second or third frequency), the factors from the
    rest."""
    for count in range(len(exponents), 1, -1):
        head = slice(1, count)  # exponent 0 (inv_freq 1) says nothing of theta
        theta = _theta_of(exponents[head], inv_freq[head])
        if np.abs(np.log(inv_freq[head]) + exponents[head] * math.log(theta)).max() < 1e-4:
            factors = theta ** -exponents / inv_freq
            factors[:count] = 1.0
            if factors.min() >= 1.0 - 1e-4 and (np.diff(factors) >= -1e-3 * factors[1:]).all():
                return RotaryFit(theta, factors.astype(np.float32))
            return None
    return None


def fit_rope(cos: np.ndarray, sin: np.ndarray, head_dim: int, bundle_dir) -> RotaryFit:
    """theta (and Llama 3's frequency factors, or linear scaling's factor, where the tables have them) of the
    rotary tables (P, hd/2), refusing tables that are none of plain RoPE (Su et al. 2021), plain RoPE with slower
    low frequencies, which llama.cpp computes from ``rope_freqs.weight`` (``llama-model.cpp``,
    LLM_TENSOR_ROPE_FREQS; its converter writes Llama 3.1's and 3.2's scaling so), and plain RoPE with every
    frequency divided by one factor F > 1 (transformers' rope_type linear), which llama.cpp computes from
    ``{arch}.rope.scaling.type`` linear and ``{arch}.rope.scaling.factor`` F (freq_scale 1/F).

    theta is the least-squares fit of log inv_freq_j = -(2j / hd) log theta; the tables rebuilt from the
    fit must match the stored ones.
    """
    positions, half = cos.shape
    if not np.allclose(cos[0], 1.0, atol=1e-6):
        raise ExportError(f"bundle {bundle_dir}: its rotary tables are scaled by {float(cos[0, 0]):.4f} "
                          "(a YaRN / LongRoPE attention factor); GGUF export handles plain RoPE, Llama 3's "
                          "frequency scaling and linear scaling only", "export a model without that rope_scaling")
    inv_freq = _measured_inv_freq(cos, sin)
    exponents = 2.0 * np.arange(half) / head_dim
    mask = exponents > 0
    theta = _theta_of(exponents[mask], inv_freq[mask])
    error = _rebuild_error(cos, sin, theta ** -exponents)
    # inv_freq rounded to float32 turns the angle at position p by up to p * 2^-24 (inv_freq <= 1)
    tolerance = max(1e-4, 4 * positions * FLOAT32_EPSILON)
    if error <= tolerance:
        return RotaryFit(theta)
    linear = _shortest_close(1.0 / float(inv_freq[0]), 4)  # inv_freq_0 is 1 at any theta: linear scaling's 1/F
    if abs(linear - 1.0) > 1e-4:
        return _linear_fit(cos, sin, exponents, inv_freq, linear, tolerance, bundle_dir)
    scaled = _scaled_fit(exponents, inv_freq)
    if scaled is not None:
        scaled_error = _rebuild_error(cos, sin, scaled.theta ** -exponents / scaled.factors.astype(np.float64))
        if scaled_error <= tolerance:
            return scaled
    raise ExportError(f"bundle {bundle_dir}: its rotary tables are neither plain RoPE (the best theta, {theta:.1f}, "
                      f"rebuilds them only to within {error:.2e}), nor plain RoPE with slower low frequencies "
                      "(Llama 3's scaling), nor plain RoPE with every frequency divided by one factor (linear "
                      "scaling)", "GGUF export handles those only; run the bundle with edgesdk instead")


def _linear_fit(cos: np.ndarray, sin: np.ndarray, exponents: np.ndarray, inv_freq: np.ndarray, linear: float,
                tolerance: float, bundle_dir) -> RotaryFit:
    """Linear scaling (inv_freq_j = theta^(-2j / hd) / F for every j) of the tables whose first frequency is
    1 / ``linear``; refused where F is not above 1, or where the frequencies times F are Llama 3's scaling (llama.cpp
    would apply both, which no transformers rope type gives) or no plain RoPE."""
    if linear < 1.0:
        raise ExportError(f"bundle {bundle_dir}: its rotary tables turn every frequency faster than plain RoPE "
                          f"(a linear scaling factor of {linear:.6g}, where linear scaling's factor is above 1)",
                          "GGUF export handles plain RoPE, Llama 3's and linear scaling (factor > 1) only; run the "
                          "bundle with edgesdk instead")
    unscaled = inv_freq * linear  # (hd/2,) the frequencies before the division by F
    mask = exponents > 0
    theta = _theta_of(exponents[mask], unscaled[mask])
    error = _rebuild_error(cos, sin, theta ** -exponents / linear)
    if error <= tolerance:
        return RotaryFit(theta, linear=linear)
    both = _scaled_fit(exponents, unscaled)
    if both is not None and _rebuild_error(cos, sin, both.theta ** -exponents / both.factors / linear) <= tolerance:
        raise ExportError(f"bundle {bundle_dir}: its rotary tables divide every frequency by a linear factor of "
                          f"{linear:.6g} on top of Llama 3's scaling (slower low frequencies); llama.cpp would "
                          "apply both from rope_freqs.weight and rope.scaling.factor, but no model's rope type gives "
                          "that, so the file is not written", "run the bundle with edgesdk instead")
    raise ExportError(f"bundle {bundle_dir}: its rotary tables divide the first frequency by {linear:.6g} but are "
                      f"not plain RoPE divided by that linear factor (the best theta, {theta:.1f}, rebuilds them only "
                      f"to within {error:.2e})", "GGUF export handles plain RoPE, Llama 3's and linear scaling only; "
                      "run the bundle with edgesdk instead")


class _Initializers:
    """Initializers by name, external data read from the bundle's (possibly DEFLATE-coded) weights file."""

    DTYPES = {1: np.float32, 2: np.uint8, 7: np.int64, 10: np.float16}

    def __init__(self, graph, bundle_dir: Path, weights_record: dict | None):
        self.tensors = {t.name: t for t in graph.initializer}
        self.bundle_dir, self.record = bundle_dir, weights_record
        self._external: dict[str, bytes] = {}  # by location: a coded bundle's one inflated file under its name

    def check(self, model_path: Path) -> None:
        """Refuse what the runtime refuses before onnxruntime reads the graph (edgesdk/weights_file.py,
        ``graph_data_problems``): an initializer stored outside the bundle's weights file, past its end, over
        another's bytes, or with a length its shape does not take. Verification matched the files to the
        manifest only; a graph rewritten with the manifest's hashes would otherwise export a neighbour's bytes
        (or another file's) as weights without a word."""
        from edgesdk.weights_file import check_graph_data, graph_data_problems, read_graph_tensors

        tensors, dangling = read_graph_tensors(model_path)
        inflated = None
        if self.record is not None:
            inflated = len(self._external_bytes(self.record["external_name"]))
        check_graph_data(model_path, graph_data_problems(model_path, tensors, dangling, self.record, inflated))

    def has(self, name: str) -> bool:
        return name in self.tensors

    def array(self, name: str) -> np.ndarray:
        from onnx import numpy_helper

        tensor = self.tensors.get(name)
        if tensor is None:
            raise ExportError(f"bundle {self.bundle_dir}: its graph has no initializer {name!r}",
                              "the bundle was not written by this edgesdk's fused exporter; rebuild it")
        if tensor.data_location != 1:  # stored inside the graph
            return numpy_helper.to_array(tensor)
        where = {entry.key: entry.value for entry in tensor.external_data}
        dtype = np.dtype(self.DTYPES[tensor.data_type])
        count = math.prod(tensor.dims)
        data = self._external_bytes(where["location"])
        return np.frombuffer(data, dtype, count, int(where.get("offset", 0))).reshape(tuple(tensor.dims))

    def _external_bytes(self, location: str) -> bytes:
        """The bytes of the external file ``location`` (checked by :meth:`check` to be the bundle's weights
        file, or a plain file beside the graph), read once."""
        if location not in self._external:
            if self.record is not None:
                from edgesdk.weights_file import inflate_weights

                self._external[location] = inflate_weights(self.bundle_dir, self.record)
            else:
                self._external[location] = (self.bundle_dir / location).read_bytes()
        return self._external[location]


class _NodeIndex:
    """Nodes found by one of their inputs (initializer names are unique, so they identify a node)."""

    def __init__(self, graph):
        self.by_input = {}
        for node in graph.node:
            for name in node.input:
                self.by_input.setdefault(name, node)

    def node(self, op_type: str, input_name: str):
        node = self.by_input.get(input_name)
        if node is None or node.op_type != op_type:
            return None
        return node

    def attribute(self, op_type: str, input_name: str, attribute: str):
        node = self.node(op_type, input_name)
        if node is None:
            raise ExportError(f"the fused graph has no {op_type} reading {input_name!r}",
                              "the bundle was not written by this edgesdk's fused exporter; rebuild it")
        return _attributes(node)[attribute]


def _attributes(node) -> dict:
    """A node's attributes by name, as Python values."""
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _quantized(store: _Initializers, nodes: _NodeIndex, name: str) -> BlockQuantized:
    """MatMulNBits unit ``name`` (its ``.qweight`` and ``.scales`` initializers)."""
    packed = store.array(f"{name}.qweight")  # (N, blocks, block * bits / 8)
    scales = store.array(f"{name}.scales").astype(np.float32)  # (N * blocks,)
    node = nodes.node("MatMulNBits", f"{name}.qweight")
    if node is None:  # an untied quantized embedding is read only by its GatherBlockQuantized
        node = nodes.node("GatherBlockQuantized", "input_ids")
    attributes = _attributes(node)
    bits, block = int(attributes["bits"]), int(attributes["block_size"])
    n = packed.shape[0]
    k = int(attributes.get("K", packed.shape[1] * block))
    return BlockQuantized(np.ascontiguousarray(packed), scales, bits, block, k, n)


def _unit(store: _Initializers, nodes: _NodeIndex, name: str) -> Matrix:
    if store.has(f"{name}.qweight"):
        return _quantized(store, nodes, name)
    return np.ascontiguousarray(store.array(f"{name}.weight").astype(np.float32).T)  # stored (K, N) -> (N, K)


def _embedding_and_head(store: _Initializers, nodes: _NodeIndex) -> tuple[Matrix, np.ndarray, Matrix | None]:
    final_norm = store.array("final_norm").astype(np.float32)
    hidden = final_norm.shape[0]
    if store.has("embed_tokens.qweight"):
        embed = _quantized(store, nodes, "embed_tokens")
        embed = BlockQuantized(embed.packed, embed.scales, embed.bits, embed.block_size, hidden, embed.n)
    else:
        embed = store.array("embed_tokens.weight").astype(np.float32)  # (V, D)
    if store.has("lm_head.qweight"):
        head = _quantized(store, nodes, "lm_head")
    elif store.has("lm_head.weight"):
        head = np.ascontiguousarray(store.array("lm_head.weight").astype(np.float32).T)  # (D, V) -> (V, D)
    else:
        head = None
    return embed, final_norm, head


def _embed_scale(graph, store: _Initializers) -> float:
    """The factor the looked-up embedding rows are multiplied by before the first layer (Gemma: sqrt(D)), 1.0
    where none is (the fused exporter's Mul by a scalar right after the Gather and its optional Slice)."""
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    lookup = next((node for node in consumers.get("input_ids", [])
                   if node.op_type in ("Gather", "GatherBlockQuantized")), None)
    if lookup is None:
        return 1.0
    output = lookup.output[0]
    following = consumers.get(output, [])
    if len(following) == 1 and following[0].op_type == "Slice":  # the last block's zero padding cut off
        output = following[0].output[0]
        following = consumers.get(output, [])
    for node in following:
        if node.op_type == "Mul":
            other = [name for name in node.input if name != output]
            if len(other) == 1 and store.has(other[0]):
                value = store.array(other[0])
                if value.size == 1:
                    return float(value.reshape(-1)[0])
    return 1.0


def _layer(store: _Initializers, nodes: _NodeIndex, i: int, tables: list[str]) -> BundleLayer:
    """Layer ``i``'s weights; the name of the rotary table it reads is added to ``tables`` when new."""
    prefix = f"layers.{i}"
    attention = nodes.node("GroupQueryAttention", f"past_key_values.{i}.key")
    if attention is None:
        raise ExportError(f"the fused graph has no GroupQueryAttention for layer {i}",
                          "the bundle was not written by this edgesdk's fused exporter; rebuild it")
    attributes = _attributes(attention)
    rotary = int(attributes.get("do_rotary", 0)) == 1 and len(attention.input) > 7 and attention.input[7]
    cos = attention.input[7] if rotary else None  # a layer without rotary (SmolLM3's NoPE layers) reads none
    if cos is not None and cos not in tables:
        tables.append(cos)
    window = attributes.get("local_window_size", -1)
    optional = {name: store.array(f"{prefix}.{name}").astype(np.float32)
                for name in ("attn_out_norm", "ffn_out_norm") if store.has(f"{prefix}.{name}")}
    bias = store.array(f"{prefix}.attn.qkv.bias").astype(np.float32) if store.has(f"{prefix}.attn.qkv.bias") else None
    heads = int(attributes["num_heads"])
    q_norm, k_norm = _head_norms(store, f"{prefix}.attn.qk_norm.weight", heads)
    return BundleLayer(
        input_norm=store.array(f"{prefix}.input_norm").astype(np.float32),
        post_attention_norm=store.array(f"{prefix}.post_attention_norm").astype(np.float32),
        heads=heads, kv_heads=int(attributes["kv_num_heads"]),
        units={unit: _unit(store, nodes, f"{prefix}.{unit}") for unit in UNITS},
        qkv_bias=bias, q_norm=q_norm, k_norm=k_norm, rope=None if cos is None else tables.index(cos),
        window=int(window) if window > 0 else None, **optional,
    )


def _head_norms(store: _Initializers, name: str, heads: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Qwen3's query and key norm weights from the (Hq+Hkv, hd) table the fused graph multiplies the
    normalised heads by (export/fused_graph.py, ``head_norms``): every query row is one vector, every key
    row another; (None, None) for a model without them."""
    if not store.has(name):
        return None, None
    table = store.array(name).astype(np.float32)  # (Hq+Hkv, hd)
    q_rows, k_rows = table[:heads], table[heads:]
    if not (np.array_equal(q_rows, np.broadcast_to(q_rows[0], q_rows.shape))
            and np.array_equal(k_rows, np.broadcast_to(k_rows[0], k_rows.shape))):
        raise ExportError(f"{name}: the query (or key) heads' norm weights differ from head to head, where the "
                          "model has one weight for all of them", "the bundle was not written by this edgesdk's "
                          "fused exporter; rebuild it")
    return q_rows[0].copy(), k_rows[0].copy()
