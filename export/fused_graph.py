"""Emit the ONNX Runtime "fused" decoder graph: few, large contrib ops per layer.

Per decode step the plain graph (export/llama_graph.py) runs ~40 small ops per layer, and on a
2-core CPU each op costs ~5 µs of framework overhead whatever its size
(reference/feasibility-ort.md). This form runs 10 per layer:

    SkipSimplifiedLayerNormalization -> MatMul(QKV) -> GroupQueryAttention (rotary inside,
    KV cache updated in place) -> MatMul(O) -> SkipSimplifiedLayerNormalization ->
    MatMul(gate|up) -> Split -> QuickGelu(alpha=1) = SiLU -> Mul -> MatMul(down)

(Qwen3 adds 6 small ops before the attention: each query and key head's RMSNorm. SmolLM3's NoPE layers
run GroupQueryAttention with do_rotary=0 and no cos / sin caches.)

MatMul is ``com.microsoft.MatMulNBits`` (block-wise 8- or 4-bit weights, int8 compute with
accuracy_level 4) for quantized bundles, or a plain MatMul for float32. A tied embedding is
stored once, block-quantized, and read by both ``GatherBlockQuantized`` and the LM head; an untied
embedding and LM head are two matrices, both block-quantized at ``FusedConfig.head_bits``.

Interface (runtime: edgesdk/runtime/ort_fused_backend.py):

    inputs   input_ids                  int64  (batch, seq)
             past_key_values.{i}.key    float  (batch, kv_heads_i, cache_len, head_dim)  shared
             past_key_values.{i}.value  float  (batch, kv_heads_i, cache_len, head_dim)  buffers
             seqlens_k                  int32  (batch,)  tokens in the cache after this step - 1
             total_sequence_length      int32  ()        tokens in the cache after this step
             num_logits_to_keep         int64  (1,)
    outputs  logits                     float  (batch, kept, vocab)
             present.{i}.key / .value   bound to the same buffers as the past inputs
             hidden_states              float  (batch, seq, hidden)  final-norm output (embeddings)

References: ONNX Runtime contrib op schemas (GroupQueryAttention, MatMulNBits,
SkipSimplifiedLayerNormalization, GatherBlockQuantized); Ainslie et al. 2023 (GQA).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto

from edgesdk.export.blockwise import quantize_blockwise
from edgesdk.export.decoder_weights import DecoderWeights
from edgesdk.export.graph_builder import FLOAT, INT64, GraphBuilder, tensor_input
from edgesdk.export.llama_graph import GraphSpec, head_norm_weights, rotary_name
from edgesdk.runtime.backend import HIDDEN_STATES

OPSET = 17
MS = "com.microsoft"


@dataclass(frozen=True)
class FusedConfig:
    """How the fused graph stores its weights."""

    weights: str = "int8"  # fp32 | int8 | int4: MatMul vs MatMulNBits with 8 or 4 bits
    block_size: int = 32  # quantization block along K (a power of two >= 16; the default recipe uses 64)
    accuracy_level: int = 4  # MatMulNBits compute: 4 = int8 activations per block (fast, near fp32)
    quantize_embedding: bool = True  # embedding and LM head quantized too (4x fewer bytes at int8)
    embedding_bits: int | None = None  # bits of the embedding and the LM head, tied or not (an untied pair
    # is two block-quantized matrices at these bits, as fake_quant.attach trains them); None = as the layers.
    # 8 with int4 layers keeps the most error-sensitive matrix (it scores every token) at 8 bits.
    eight_bit_linears: tuple[str, ...] = ()  # decoder linears kept at 8 bits in an int4 graph (the QAT
    # scheme's mixed precision, compress/mixed_precision.py); a fused unit takes all its linears' bits

    def __post_init__(self):
        if self.weights not in ("fp32", "int8", "int4"):
            raise ValueError(f"weights must be fp32, int8 or int4, got {self.weights!r}")
        if self.embedding_bits not in (None, 4, 8):
            raise ValueError(f"embedding_bits must be 4, 8 or None, got {self.embedding_bits!r}")
        object.__setattr__(self, "eight_bit_linears", tuple(self.eight_bit_linears))

    @property
    def bits(self) -> int | None:
        return {"fp32": None, "int8": 8, "int4": 4}[self.weights]

    @property
    def head_bits(self) -> int | None:
        """Bits of the embedding and the LM head, tied or untied (None: float32)."""
        if self.bits is None or not self.quantize_embedding:
            return None
        return self.embedding_bits or self.bits

    def unit_bits(self, unit: str) -> int | None:
        """Bits of a fused unit ``layers.{i}.attn.qkv`` (or ``.attn.o``, ``.mlp.gate_up``, ``.mlp.down``); the
        LM head, tied or not, takes :attr:`head_bits` (``_FusedEmitter.head``)."""
        if self.bits is None or not self.eight_bit_linears or not unit.startswith("layers."):
            return self.bits
        _, index, kind = unit.split(".", 2)
        linears = {f"model.layers.{index}.{module}" for module in UNIT_LINEARS[kind]}
        chosen = linears & set(self.eight_bit_linears)
        if chosen and chosen != linears:
            raise ValueError(f"{unit} fuses {sorted(linears)} into one matrix; all or none of them can stay at "
                             f"8 bits, got {sorted(chosen)}")
        return 8 if chosen else self.bits


def local_window_size(window: int) -> int:
    """GroupQueryAttention's ``local_window_size`` for a model whose query sees the last ``window`` positions,
    itself included (transformers' sliding window). Since onnxruntime PR #25927 ("Fix Local Attention off by 1
    bug", 2025) the attribute counts the query too; before, it counted only the positions before it, so a graph
    with a window needs an onnxruntime that has the fix (SLIDING_WINDOW_ONNXRUNTIME)."""
    return window


# the oldest onnxruntime whose GroupQueryAttention counts the query in local_window_size (measured: 1.32 does)
SLIDING_WINDOW_ONNXRUNTIME = ((1, 24), "GroupQueryAttention's local_window_size counting the query itself")


def window_within(window: int | None, max_context: int) -> int | None:
    """The sliding window a graph of ``max_context`` positions needs, or None: a query at position p sees keys
    p - window + 1 .. p, all of them while p < window, so a window of at least the context hides nothing and the
    layer attends over everything (no local_window_size, which any onnxruntime computes alike)."""
    return window if window is not None and window < max_context else None


# fused unit -> the Hugging Face linears it concatenates
UNIT_LINEARS = {"attn.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                "attn.o": ("self_attn.o_proj",), "mlp.gate_up": ("mlp.gate_proj", "mlp.up_proj"),
                "mlp.down": ("mlp.down_proj",)}


def weight_label(unit: str) -> str:
    """How an error names the weight of fused unit ``unit`` (``layers.3.mlp.down``, ``lm_head``, ``embed_tokens``):
    the unit and the Hugging Face weights it holds, whose (in, out) positions an error's input / output count."""
    if unit == "embed_tokens":  # quantized as the LM head reads it: (D, V), output = token id
        return "embed_tokens (model.embed_tokens.weight transposed: input = hidden index, output = token id)"
    if not unit.startswith("layers."):
        return f"{unit} ({unit}.weight)"
    _, index, kind = unit.split(".", 2)
    linears = [f"model.layers.{index}.{module}" for module in UNIT_LINEARS[kind]]
    return f"{unit} ({' | '.join(linears)}{', concatenated along outputs' if len(linears) > 1 else ''})"


class _FusedEmitter:
    def __init__(self, weights: DecoderWeights, max_context: int, config: FusedConfig):
        self.w, self.config, self.max_context = weights, config, max_context
        self.g = GraphBuilder()
        self.hd = weights.head_dim

    def linear(self, x: str, weight: np.ndarray, name: str) -> str:
        """x @ weight, weight (K, N): MatMulNBits when quantized, else MatMul."""
        g, config = self.g, self.config
        bits = config.unit_bits(name)
        if bits is None:
            return g.op("MatMul", [x, g.const(weight.astype(np.float32), f"{name}.weight")])
        q = quantize_blockwise(weight.astype(np.float32), bits, config.block_size, weight_label(name))
        return self._matmul_nbits(x, q, name)

    def _matmul_nbits(self, x: str, q, name: str, stored: tuple[str, str] | None = None) -> str:
        """MatMulNBits over ``q``; ``stored`` names initializers already in the graph (tied weights)."""
        g = self.g
        packed, scales = stored or (g.const(q.packed, f"{name}.qweight"), self.scales(q, f"{name}.scales"))
        return g.op("MatMulNBits", [x, packed, scales], domain=MS, K=q.k, N=q.n, bits=q.bits,
                    block_size=q.block_size, accuracy_level=self.config.accuracy_level)

    def scales(self, q, name: str) -> str:
        """``q``'s scales stored as float16 (they are float16 values, export/blockwise.py) and widened
        by a Cast that ONNX Runtime folds into a float32 initializer when the session loads."""
        return self.g.op("Cast", [self.g.const(q.scales.astype(np.float16), name)], to=TensorProto.FLOAT)

    def norm(self, x: str, weight: np.ndarray, name: str) -> str:
        return self.g.op("SimplifiedLayerNormalization", [x, self.g.const(weight.astype(np.float32), name)],
                         axis=-1, epsilon=self.w.rms_eps, stash_type=1)

    def skip_norm(self, x: str, residual: str, weight: np.ndarray, name: str) -> tuple[str, str]:
        """(normalized x + residual, x + residual)."""
        outs = self.g.op("SkipSimplifiedLayerNormalization", [x, residual, self.g.const(weight.astype(np.float32), name)],
                         outputs=4, domain=MS, epsilon=self.w.rms_eps)
        return outs[0], outs[3]

    def embedding(self) -> tuple[str, tuple | None]:
        """(embedded input ids, the tied head as (quantized, stored names) or (None, table name))."""
        g, w, config = self.g, self.w, self.config
        bits = config.head_bits
        if bits is None:
            table = g.const(w.embed.astype(np.float32), "embed_tokens.weight")
            return g.op("Gather", [table, "input_ids"]), (None, table)
        q = quantize_blockwise(w.embed.T.copy(), bits, config.block_size, weight_label("embed_tokens"))  # K=D, N=V
        packed = g.const(q.packed, "embed_tokens.qweight")  # (V, D/block, block*bits/8)
        scales = self.scales(q, "embed_tokens.scales")  # (V * D/block,)
        rows = g.op("Reshape", [packed, g.i64([w.vocab_size, -1])])  # (V, D*bits/8)
        row_scales = g.op("Reshape", [scales, g.i64([w.vocab_size, -1])])  # (V, D/block)
        x = g.op("GatherBlockQuantized", [rows, "input_ids", row_scales], domain=MS, gather_axis=0,
                 quantize_axis=1, block_size=config.block_size, bits=bits)  # (B, S, D padded to blocks)
        if w.hidden_size % config.block_size:  # the rows carry the zero padding of their last block
            x = g.op("Slice", [x, g.i64([0]), g.i64([w.hidden_size]), g.i64([-1])])  # (B, S, D)
        return x, (q, (packed, scales))

    def head(self, h: str, weight: np.ndarray) -> str:
        """An untied LM head ``h @ weight`` (weight (D, V)): block-quantized at ``head_bits`` like a tied
        one, never at the layers' bits (a QAT scheme trains the head at its ``embedding_bits``)."""
        bits = self.config.head_bits
        if bits is None:
            return self.g.op("MatMul", [h, self.g.const(weight.astype(np.float32), "lm_head.weight")])
        quantized = quantize_blockwise(weight.astype(np.float32), bits, self.config.block_size, weight_label("lm_head"))
        return self._matmul_nbits(h, quantized, "lm_head")

    def attention(self, i: int, layer, h: str, cos: str | None, sin: str | None) -> str:
        """Layer ``i``'s attention on the normalized input ``h``, through the output projection; ``cos`` and
        ``sin`` are its rotary tables, None for a layer without rotary."""
        g, hd = self.g, self.hd
        n_q, n_kv = layer.heads(hd)
        qkv_w = np.concatenate([layer.q, layer.k, layer.v], axis=1)
        qkv = self.linear(h, qkv_w, f"layers.{i}.attn.qkv")  # (B, S, (Hq+2Hkv)*hd)
        if layer.q_bias is not None:
            bias = np.concatenate([layer.q_bias, layer.k_bias, layer.v_bias]).astype(np.float32)
            qkv = g.op("Add", [qkv, g.const(bias, f"layers.{i}.attn.qkv.bias")])
        if layer.q_norm is not None:
            qkv = self.head_norms(i, layer, qkv)
        query, key, value = self.attention_inputs(i, layer, qkv)
        outputs = [f"layers.{i}.attn.out", f"present.{i}.key", f"present.{i}.value"]
        extra = self.attention_attributes(i)
        if extra.get("qk_output"):
            outputs.append(f"layers.{i}.attn.qk")
        window = window_within(layer.window, self.max_context)
        if window is not None:  # sliding attention (Gemma 3's local layers) shorter than the context
            extra = {**extra, "local_window_size": local_window_size(window)}
        # A layer without rotary (cos None: SmolLM3's NoPE layers) runs do_rotary=0 with the optional cos_cache and
        # sin_cache inputs left out (onnxruntime's contrib op schema: they are read only when do_rotary is 1).
        attn = g.op("GroupQueryAttention", [
            query, key, value, f"past_key_values.{i}.key", f"past_key_values.{i}.value", "seqlens_k",
            "total_sequence_length", *((cos, sin) if cos is not None else ()),
        ], outputs=outputs, domain=MS, num_heads=n_q, kv_num_heads=n_kv, do_rotary=int(cos is not None),
            rotary_interleaved=0, scale=float(self.w.scale), **extra)[0]  # (B, S, Hq*hd)
        return self.linear(attn, layer.o, f"layers.{i}.attn.o")

    def head_norms(self, i: int, layer, qkv: str) -> str:
        """Qwen3's RMSNorm of each query and key head (before the rotary inside GroupQueryAttention) on the
        packed QKV (B, S, (Hq+2Hkv)*hd); the result is packed the same way."""
        g, hd = self.g, self.hd
        n_q, n_kv = layer.heads(hd)
        qk, v = g.op("Split", [qkv, g.i64([(n_q + n_kv) * hd, n_kv * hd])], outputs=2, axis=-1)
        qk = g.op("Reshape", [qk, g.i64([0, 0, n_q + n_kv, hd])])  # (B, S, Hq+Hkv, hd)
        normed = self.norm(qk, np.ones(hd, np.float32), f"layers.{i}.attn.qk_norm.unit")
        qk = g.op("Mul", [normed, g.const(head_norm_weights(layer, n_q, n_kv, np.float32(1.0)),
                                          f"layers.{i}.attn.qk_norm.weight")])  # (B, S, Hq+Hkv, hd)
        qk = g.op("Reshape", [qk, g.i64([0, 0, (n_q + n_kv) * hd])])  # (B, S, (Hq+Hkv)*hd)
        return g.op("Concat", [qk, v], axis=-1)

    def attention_inputs(self, i: int, layer, qkv: str) -> tuple[str, str, str]:
        """GroupQueryAttention's query, key, value inputs: the packed QKV (subclasses may split it)."""
        return qkv, "", ""

    def attention_attributes(self, i: int) -> dict:
        """Extra GroupQueryAttention attributes for layer ``i`` (none here)."""
        return {}

    def ffn(self, i: int, layer, h: str) -> str:
        """Layer ``i``'s SwiGLU FFN on the normalized post-attention state ``h`` (B, S, D)."""
        g = self.g
        gate_up = self.linear(h, np.concatenate([layer.gate, layer.up], axis=1), f"layers.{i}.mlp.gate_up")
        gate, up = g.op("Split", [gate_up, g.i64([layer.ffn_width, layer.ffn_width])], outputs=2, axis=-1)
        if self.w.activation == "gelu_tanh":  # Gemma's GeGLU: GELU's tanh form
            act = g.op("FastGelu", [gate], domain=MS)
        else:
            act = g.op("QuickGelu", [gate], domain=MS, alpha=1.0)  # x * sigmoid(x) = SiLU
        return self.linear(g.op("Mul", [act, up]), layer.down, f"layers.{i}.mlp.down")

    def extra_interface(self) -> tuple[list, list]:
        """Graph inputs and outputs beyond the decoder's own (none here)."""
        return [], []

    def build(self) -> onnx.ModelProto:
        g, w, hd = self.g, self.w, self.hd
        positions = np.arange(self.max_context, dtype=np.float64)[:, None]
        rotations = []  # GroupQueryAttention's cos and sin caches (P, hd/2) of each rotary table
        for rope, (inv_freq, scaling) in enumerate(w.ropes()):
            freqs = positions * inv_freq.astype(np.float64)[None, :]  # (P, hd/2)
            rotations.append((g.const((np.cos(freqs) * scaling).astype(np.float32), rotary_name(rope, "cos")),
                              g.const((np.sin(freqs) * scaling).astype(np.float32), rotary_name(rope, "sin"))))

        x, tied_head = self.embedding()
        if w.embed_scale != 1.0:  # Gemma: the looked-up rows times sqrt(D), the table (the LM head's too) unscaled
            x = g.op("Mul", [x, g.const(np.array(w.embed_scale, np.float32))])
        residual = None
        for i, layer in enumerate(w.layers):
            if residual is None:
                h, residual = self.norm(x, layer.input_norm, f"layers.{i}.input_norm"), x
            else:
                h, residual = self.skip_norm(x, residual, layer.input_norm, f"layers.{i}.input_norm")
            attn = self.attention(i, layer, h, *((None, None) if layer.rope is None else rotations[layer.rope]))
            if layer.attn_out_norm is not None:  # Gemma 3 normalises the attention's and the FFN's outputs
                attn = self.norm(attn, layer.attn_out_norm, f"layers.{i}.attn_out_norm")
            h, residual = self.skip_norm(attn, residual, layer.post_attention_norm, f"layers.{i}.post_attention_norm")
            x = self.ffn(i, layer, h)
            if layer.ffn_out_norm is not None:
                x = self.norm(x, layer.ffn_out_norm, f"layers.{i}.ffn_out_norm")
        h, _ = self.skip_norm(x, residual, w.final_norm, "final_norm")  # (B, S, D)
        g.op("Identity", [h], outputs=[HIDDEN_STATES])

        neg_keep = g.op("Neg", ["num_logits_to_keep"])
        h = g.op("Slice", [h, neg_keep, g.i64([np.iinfo(np.int64).max]), g.i64([1])])  # (B, K, D)
        quantized, stored = tied_head
        if w.lm_head is not None:  # untied: its own matrix, at the head's bits (QAT trains it at embedding_bits)
            logits = self.head(h, w.lm_head.T.copy())  # (B, K, V)
        elif quantized is not None:  # tied and quantized: the embedding's bytes, read once more
            logits = self._matmul_nbits(h, quantized, "lm_head", stored)
        else:  # tied float32: Gemm with transB on the embedding table, no transposed copy
            out_shape = g.op("Concat", [g.op("Shape", [h], start=0, end=2), g.i64([w.vocab_size])], axis=0)
            flat = g.op("Reshape", [h, g.i64([-1, w.hidden_size])])  # (B*K, D)
            logits = g.op("Reshape", [g.op("Gemm", [flat, stored], transB=1), out_shape])  # (B, K, V)
        g.op("Identity", [logits], outputs=["logits"])

        inputs = [tensor_input("input_ids", INT64, ["batch", "seq"])]
        outputs = [tensor_input("logits", FLOAT, ["batch", "kept", w.vocab_size])]
        for i, kv in enumerate(w.kv_heads()):
            for kind in ("key", "value"):
                inputs.append(tensor_input(f"past_key_values.{i}.{kind}", FLOAT, ["batch", kv, "cache_len", hd]))
                outputs.append(tensor_input(f"present.{i}.{kind}", FLOAT, ["batch", kv, "cache_len", hd]))
        inputs += [tensor_input("seqlens_k", TensorProto.INT32, ["batch"]),
                   tensor_input("total_sequence_length", TensorProto.INT32, []),
                   tensor_input("num_logits_to_keep", INT64, [1])]
        outputs.append(tensor_input(HIDDEN_STATES, FLOAT, ["batch", "seq", w.hidden_size]))
        extra_inputs, extra_outputs = self.extra_interface()
        inputs += extra_inputs
        outputs += extra_outputs
        return g.model("edgesdk_fused_decoder", inputs, outputs, OPSET, extra_opsets={MS: 1},
                       doc="edgesdk fused decoder (ONNX Runtime contrib ops), shared KV buffers")


def graph_min_onnxruntime(weights: DecoderWeights, max_context: int) -> tuple[tuple[int, int], str] | None:
    """The oldest onnxruntime a fused graph (plain or gated) of ``weights`` needs beyond its form's own:
    SLIDING_WINDOW_ONNXRUNTIME where some layer's GroupQueryAttention has a ``local_window_size``, else None."""
    windowed = any(window_within(layer.window, max_context) is not None for layer in weights.layers)
    return SLIDING_WINDOW_ONNXRUNTIME if windowed else None


def emit_fused_decoder(weights: DecoderWeights, max_context: int, config: FusedConfig = FusedConfig()
                       ) -> tuple[onnx.ModelProto, GraphSpec]:
    model = _FusedEmitter(weights, max_context, config).build()
    spec = GraphSpec(num_layers=len(weights.layers), kv_heads=tuple(weights.kv_heads()), head_dim=weights.head_dim,
                     vocab_size=weights.vocab_size, max_context=max_context, form="ort-fused",
                     dtype=config.weights, min_onnxruntime=graph_min_onnxruntime(weights, max_context),
                     hidden_states=True)
    return model, spec
