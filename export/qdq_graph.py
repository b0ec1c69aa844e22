"""Emit the standard-op decoder with explicit INT8 quantization (QDQ): the form TensorRT builds from.

The graph is export/llama_graph.py's (opset 17, standard ops, concatenating KV cache, the same
inputs and outputs); only the decoder linears change. Each ``x @ W`` becomes

    x -> QuantizeLinear(s_x, 0) -> DequantizeLinear(s_x, 0) -> MatMul <- DequantizeLinear(s_w, 0, axis=1) <- W_int8

* ``W_int8`` is the (K, N) = transposed torch weight stored as an INT8 initializer, symmetric per
  output channel (codes in [-127, 127], ``s_w = absmax / 127`` of each torch row), and
  ``DequantizeLinear`` is per axis with ``axis=1``, the output channels of the MatMul weight.
  These are the codes ``edgesdk.compress.fake_quant.quantize_weight(w, 8, "channel", …)`` trains
  and bakes, re-derived from the weights (a baked weight gives back its own codes).
* ``s_x`` is the static per-tensor input scale recorded by the QAT observers
  (``QuantScheme.activation_scales``); without one (plain PTQ, or a linear never observed) the
  input stays in float and the MatMul is weight-only quantized.
* Zero points are INT8 zeros. QuantizeLinear rounds half to even and saturates to [-128, 127]
  (ONNX operator spec, QuantizeLinear), which is ``fake_quant.quantize_activation_tensor``.

TensorRT's explicit quantization ("Explicit Quantization" in the TensorRT developer guide)
wants exactly this: Q/DQ pairs on activations and a DQ on pre-quantized weights feeding the
linear op, INT8, zero points of 0, scales that are build-time constants, per-channel weight
scales on the output-channel axis (1-D scales need opset >= 13). TensorRT then fuses each pair
into an INT8 GEMM. ONNX Runtime runs the same file on CPU. With graph optimizations on it fuses
Q/DQ input + DQ weight + MatMul into ``MatMulIntegerToFloat`` (integer products, exact), and a
DQ weight + MatMul with a float input (weight-only) into an 8-bit ``MatMulNBits`` that quantizes
its input per block of 32 at run time (session option ``session.qdq_matmulnbits_accuracy_level``,
default 4; 1 computes in float32 but is ~15x slower on x86, measured in ONNX Runtime 1.32).

Where the float graph concatenates Q|K|V (and gate|up) into one MatMul, this one does the same
when the parts share one input scale (no activation quantization, or equal scales: the QAT
observers of q, k and v see the same tensor); with different scales each part gets its own
Q/DQ and MatMul and the outputs are concatenated, so the graph is the fake-quantized model.
1/sqrt(head_dim) is folded into Q's channel scales; the codes stay those of the torch weight.

The tied embedding / LM head stays float32 unless ``embedding_bits=8``: then the (V, D) table is
INT8 with one scale per row (``DequantizeLinear`` axis 0, the LM head's output channels; a
weight-only Gemm and Gather). This departs from the QAT scheme's blocks of 32 along D: blocked
``DequantizeLinear`` needs opset 21 (ReduceMean and others change between 17 and 21), and
TensorRT accepts 2-D block scales for INT4 only (TensorRT operator docs, Quantize/Dequantize).
Per-row scales cost more rounding error on rows with outliers; an untied embedding (not the
head) stays float32 in this graph.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto

from edgesdk.errors import ExportError
from edgesdk.export.decoder_weights import DecoderWeights
from edgesdk.export.llama_graph import GraphSpec, Projection, _Emitter

DTYPE = "int8-qdq"  # GraphSpec.dtype of this form; export/validate.py checks it against fake quantization
INPUT_SCALE = ".input_scale"  # suffix of the per-tensor activation scale initializers (after the torch name)
QMAX = 127  # symmetric INT8 weight codes in [-127, 127] (the QAT fake quantization's range)


@dataclass(frozen=True)
class QDQConfig:
    """What the QDQ graph quantizes besides the decoder weights."""

    activation_scales: dict[str, float] = field(default_factory=dict)  # linear name -> per-tensor input scale
    embedding_bits: int | None = None  # 8: tied embedding / LM head INT8 per row; None: float32

    def __post_init__(self):
        if self.embedding_bits not in (None, 8):
            raise ExportError(
                f"the standard (QDQ) form quantizes the embedding / LM head to 8 bits or not at all, "
                f"got embedding_bits={self.embedding_bits}",
                "set export.embedding_bits to 8 or null (4-bit needs the ort-fused form)",
            )
        bad = {name: scale for name, scale in self.activation_scales.items() if not _is_scale(scale)}
        if bad:
            raise ExportError(f"activation scales must be finite and positive numbers, got {bad}",
                              "re-run the qat stage (its observers record the scales)")


def _is_scale(value) -> bool:
    """A per-tensor scale as the qat stage records it: a finite positive number (not a bool, None or a string,
    which a hand-edited config.json can hold)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def quantize_channels(weight: np.ndarray, axis: int, name: str = "") -> tuple[np.ndarray, np.ndarray]:
    """Symmetric INT8 per channel along ``axis`` of a 2-D weight: (codes int8, scales float32).

    scale = absmax / 127 over the other axis (1 where that is 0: an all-zero channel, or denormals), codes = round-half-even
    of weight / scale clamped to [-127, 127]: float32 arithmetic in the order of
    ``fake_quant.weight_scales`` / ``quantize_weight``, so a QAT-baked weight gives back its codes. ``name`` (the
    torch name of the weight) is what the refusal of a non-finite weight calls it.
    """
    w = weight.astype(np.float32)
    _check_finite(w, axis, name)
    absmax = np.abs(w).max(axis=1 - axis, keepdims=True)
    step = (absmax / np.float32(QMAX)).astype(np.float32)
    scales = np.where(step > 0, step, np.float32(1.0)).astype(np.float32)  # 1 where absmax / 127 is 0 (denormals)
    codes = np.clip(np.round(w / scales), -QMAX, QMAX).astype(np.int8)
    return codes, scales.reshape(-1)


def _check_finite(weight: np.ndarray, axis: int, name: str) -> None:
    """Refuse a NaN or infinite weight, which would get a NaN or infinite channel scale (then the scale 1 of an
    empty channel) and codes cast from NaN: a channel of garbage, silently. The error gives the torch (out, in)
    position of the first culprit; ``axis`` is the output-channel axis of ``weight``."""
    if np.isfinite(weight).all():
        return
    position = np.argwhere(~np.isfinite(weight))[0]
    out, inp = (position[1], position[0]) if axis == 1 else (position[0], position[1])
    raise ExportError(
        f"the weight {name or 'being quantized'} holds {weight[tuple(position)]} at output {out}, input {inp} "
        "(torch's [out, in]); INT8 per-channel scales need finite weights",
        "the model's weights are not finite: check the checkpoint (and that the compress stages did not diverge)")


class _QDQEmitter(_Emitter):
    DOC = "edgesdk decoder with KV cache, INT8 QDQ (explicit quantization)"
    HIDDEN_OUTPUT = False  # TensorRT's engine needs an address for every output; its backend reads logits only

    def __init__(self, weights: DecoderWeights, max_context: int, config: QDQConfig):
        super().__init__(weights, max_context)
        self.config = config
        self.linears: set[str] = set()  # torch names of the linears emitted (activation scales must name these)
        self._quantized_inputs: dict[tuple[str, float], str] = {}

    def project(self, x: str, parts: list[Projection], name: str) -> str:
        """DQ(W_int8) MatMuls; one on concatenated weights when the parts share an input scale."""
        self.linears.update(p.key for p in parts)
        scales = [self.config.activation_scales.get(p.key) for p in parts]
        groups = [(parts, name)] if len(set(scales)) == 1 else [([p], p.key) for p in parts]
        outs = []
        for group, group_name in groups:
            scale = self.config.activation_scales.get(group[0].key)
            source = x if scale is None else self.quantize_input(x, float(scale), group[0].key)
            out = self.g.op("MatMul", [source, self.dequantized_weight(group, group_name)])
            if group[0].bias is not None:
                bias = np.concatenate([p.bias * p.fold for p in group]).astype(np.float32)
                out = self.g.op("Add", [out, self.g.const(bias, f"{group_name}.bias")])
            outs.append(out)
        return outs[0] if len(outs) == 1 else self.g.op("Concat", outs, axis=-1)  # (…, sum N)

    def quantize_input(self, x: str, scale: float, key: str) -> str:
        """x -> QuantizeLinear -> DequantizeLinear, per tensor, INT8, zero point 0 (once per input and
        scale). The scale is named ``{key}.input_scale`` after the (first) linear it feeds."""
        cached = self._quantized_inputs.get((x, scale))
        if cached is None:
            g = self.g
            scale_name = self.g.scalar(np.float32(scale), f"{key}{INPUT_SCALE}")
            zero = self.g.scalar(np.int8(0), f"{key}.input_zero_point")
            codes = g.op("QuantizeLinear", [x, scale_name, zero])  # int8, same shape as x
            cached = g.op("DequantizeLinear", [codes, scale_name, zero])
            self._quantized_inputs[(x, scale)] = cached
        return cached

    def dequantized_weight(self, parts: list[Projection], name: str) -> str:
        """(K, sum N) INT8 initializer -> DequantizeLinear per output channel (axis 1) -> float."""
        quantized = [quantize_channels(p.weight, axis=1, name=f"{p.key}.weight") for p in parts]
        codes = np.concatenate([c for c, _ in quantized], axis=1)  # (K, sum N)
        # A folded constant (1/sqrt(head_dim) on Q) scales the channel scales; the codes are unchanged.
        scales = np.concatenate([s * p.fold for (_, s), p in zip(quantized, parts, strict=True)]).astype(np.float32)
        return self._dequantize(codes, scales, axis=1, name=name)

    def table(self, matrix: np.ndarray, name: str, head: bool) -> str:
        """The (V, D) table; when it is the LM head and ``embedding_bits=8``, INT8 per row (axis 0)."""
        if not head or self.config.embedding_bits is None:
            return super().table(matrix, name, head)
        codes, scales = quantize_channels(matrix, axis=0, name=name)  # (V, D), (V,)
        return self._dequantize(codes, scales, axis=0, name=name.removesuffix(".weight"))

    def _dequantize(self, codes: np.ndarray, scales: np.ndarray, axis: int, name: str) -> str:
        g = self.g
        inputs = [g.const(codes, f"{name}.weight_quantized"), g.const(scales, f"{name}.weight_scale"),
                  g.const(np.zeros(scales.shape, np.int8), f"{name}.weight_zero_point")]
        return g.op("DequantizeLinear", inputs, outputs=[f"{name}.weight"], axis=axis)[0]


def emit_qdq_decoder(weights: DecoderWeights, max_context: int, config: QDQConfig = QDQConfig()
                     ) -> tuple[onnx.ModelProto, GraphSpec]:
    """Build the QDQ decoder graph (interface of ``emit_decoder``) and its spec (dtype ``int8-qdq``)."""
    emitter = _QDQEmitter(weights, max_context, config)
    model = emitter.build()
    unknown = sorted(set(config.activation_scales) - emitter.linears)
    if unknown:
        raise ExportError(f"activation scales name linears the model does not have: {unknown[:4]}",
                          "the scales must come from this model's qat stage (did the layer count change?)")
    spec = GraphSpec(num_layers=len(weights.layers), kv_heads=tuple(weights.kv_heads()), head_dim=weights.head_dim,
                     vocab_size=weights.vocab_size, max_context=max_context, form="standard", dtype=DTYPE)
    return model, spec


def qdq_scheme(model):
    """The fake quantization (``fake_quant.QuantScheme``) the QDQ export of ``model`` computes.

    The scheme a qat stage recorded in ``model.config`` (weights per output channel at 8 bits), or
    for a model without one (post-training quantization) INT8 per-channel weights with float
    activations and a float embedding. A scheme trained for another layout is refused: re-rounding
    its weights per channel would throw away what QAT learned.
    """
    from edgesdk.compress.fake_quant import QuantScheme

    scheme = QuantScheme.of(model)
    if scheme is None:
        return QuantScheme(weight_bits=8, granularity="channel", activations="none", embedding_bits=None)
    if scheme.weight_bits != 8 or scheme.granularity != "channel":
        raise ExportError(
            f"the model was quantization-trained for {scheme.weight_bits}-bit weights per {scheme.granularity}, "
            "the standard form's INT8 QDQ export needs 8-bit weights per channel",
            "export it with form: ort-fused, or run the qat stage with weight_bits: 8, granularity: channel",
        )
    return scheme


def qdq_config(scheme, embedding_bits: int | None) -> QDQConfig:
    """The graph settings for ``scheme``: its per-tensor input scales when activations are ``tensor``."""
    scales = dict(scheme.activation_scales) if scheme.activations == "tensor" else {}
    return QDQConfig(activation_scales=scales, embedding_bits=embedding_bits)


def count_quantized(model: onnx.ModelProto) -> dict[str, int]:
    """Q/DQ node counts and INT8 initializers of a graph (tests, reports)."""
    ops = [node.op_type for node in model.graph.node]
    return {"QuantizeLinear": ops.count("QuantizeLinear"), "DequantizeLinear": ops.count("DequantizeLinear"),
            "int8_initializers": sum(t.data_type == TensorProto.INT8 for t in model.graph.initializer)}
