"""Emit an ONNX graph of a Llama-family decoder with a KV cache, from DecoderWeights.

One graph serves prefill and decode (dynamic sequence and past lengths). It uses standard ONNX
ops only (opset 17), so ONNX Runtime on any CPU and TensorRT can both run it; ONNX Runtime's
graph optimizer fuses the RMSNorm pattern into SimplifiedLayerNormalization at load time.

Interface (the runtime relies on these names):

    inputs   input_ids                      int64  (batch, seq)
             past_key_values.{i}.key        float  (batch, kv_heads_i, past_seq, head_dim)
             past_key_values.{i}.value      float  (batch, kv_heads_i, past_seq, head_dim)
             num_logits_to_keep             int64  (1,)   last positions whose logits are computed
    outputs  logits                         float  (batch, kept, vocab)
             present.{i}.key / .value       float  (batch, kv_heads_i, past_seq + seq, head_dim)
             hidden_states                  float  (batch, seq, hidden)   final-norm output, every position
                                                   (embeddings; the QDQ form for TensorRT leaves it out)

Design choices that keep the op count low (per-node overhead dominates small-model decode,
see DESIGN.md):
  * Q, K, V are one MatMul (weights concatenated); gate and up are one MatMul.
  * 1/sqrt(head_dim) is folded into the Q weights (rotary is linear, so it commutes); into the query
    norm's weight where the model normalises each head's query and key (Qwen3).
  * Rotary is applied once to the concatenated Q|K heads (not at all in a layer without it: SmolLM3's NoPE
    layers).
  * Grouped-query attention reshapes Q to (B, Hkv, rep, T, hd) and broadcasts K/V instead of
    repeating them, so the cache is never expanded.
  * The LM head of a tied model is a Gemm with transB on the embedding matrix: no second copy.
References: Touvron et al. 2023 (Llama); Su et al. 2021 (RoFormer, rotary); Ainslie et al. 2023 (GQA).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from edgesdk.export.decoder_weights import DecoderWeights, LayerWeights
from edgesdk.export.graph_builder import FLOAT, INT64, GraphBuilder, tensor_input
from edgesdk.runtime.backend import HIDDEN_STATES

OPSET = 17
NEG_INF = np.float32(np.finfo(np.float32).min)


@dataclass(frozen=True)
class Projection:
    """One linear of a layer as the graph multiplies it: ``x @ (weight * fold) + bias * fold``."""

    weight: np.ndarray  # (K, N) = the transposed torch (out, in) weight
    key: str  # the torch module name, model.layers.{i}.self_attn.q_proj …: quantization schemes use it
    bias: np.ndarray | None = None  # (N,)
    fold: np.float32 = np.float32(1.0)  # constant folded into the weight (1/sqrt(head_dim) for Q)


@dataclass(frozen=True)
class GraphSpec:
    """Facts about an emitted graph, recorded in the bundle manifest for the runtime."""

    num_layers: int
    kv_heads: tuple[int, ...]
    head_dim: int
    vocab_size: int
    max_context: int
    form: str = "standard"
    dtype: str = "float32"
    # ((major, minor), why): the oldest onnxruntime that computes this graph right, where the form's own is older
    min_onnxruntime: tuple[tuple[int, int], str] | None = None
    hidden_states: bool = False  # the graph also outputs every position's final-norm hidden state (embeddings)

    def to_json(self) -> dict:
        extra = {} if self.min_onnxruntime is None else {
            "min_onnxruntime": list(self.min_onnxruntime[0]), "min_onnxruntime_for": self.min_onnxruntime[1]}
        return {
            **extra, "form": self.form, "dtype": self.dtype, "num_layers": self.num_layers,
            "kv_heads": list(self.kv_heads), "head_dim": self.head_dim,
            "vocab_size": self.vocab_size, "max_context": self.max_context,
            "inputs": {"ids": "input_ids", "past": "past_key_values.{i}.{kind}",
                       "keep": "num_logits_to_keep"},
            "outputs": {"logits": "logits", "present": "present.{i}.{kind}",
                        **({"hidden": HIDDEN_STATES} if self.hidden_states else {})},
        }


def head_norm_weights(layer: LayerWeights, n_q: int, n_kv: int, q_scale: np.float32) -> np.ndarray:
    """Qwen3's per-head RMSNorm weights as one (Hq+Hkv, hd) table over the concatenated Q|K heads: each query
    head takes ``q_norm`` (times ``q_scale``, the attention's 1/sqrt(hd) folded in), each key head ``k_norm``
    (Qwen3 technical report, Yang et al. 2025, "QK-Norm"; transformers' Qwen3Attention)."""
    return np.concatenate([np.tile(layer.q_norm * q_scale, (n_q, 1)), np.tile(layer.k_norm, (n_kv, 1))])


def rotary_tables(weights: DecoderWeights, max_context: int, rope: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables (max_context, head_dim) of rotary setting ``rope`` (DecoderWeights.ropes), the
    transformers Llama layout (halves repeated)."""
    inv_freq, scaling = weights.ropes()[rope]
    positions = np.arange(max_context, dtype=np.float64)[:, None]
    freqs = positions * inv_freq.astype(np.float64)[None, :]  # (P, hd/2)
    emb = np.concatenate([freqs, freqs], axis=-1)  # (P, hd)
    return (np.cos(emb) * scaling).astype(np.float32), (np.sin(emb) * scaling).astype(np.float32)


def rotary_name(rope: int, kind: str) -> str:
    """The initializer of rotary table ``rope``'s cos or sin (table 0 keeps the name readers look for)."""
    return f"rotary.{kind}" if rope == 0 else f"rotary.{rope}.{kind}"


class _Emitter:
    DOC = "edgesdk decoder with KV cache"
    HIDDEN_OUTPUT = True  # output the final-norm hidden states (the QDQ form, TensorRT's, leaves it out)

    def __init__(self, weights: DecoderWeights, max_context: int):
        self.w = weights
        self.g = GraphBuilder()
        self.max_context = max_context
        self.hd = weights.head_dim

    def rms_norm(self, x: str, weight: np.ndarray, name: str) -> str:
        """x * 1/sqrt(mean(x^2) + eps) * w, in the pattern ORT fuses to SimplifiedLayerNormalization."""
        g = self.g
        sq = g.op("Pow", [x, g.const(np.array(2.0, np.float32))])
        mean = g.op("ReduceMean", [sq], axes=[-1], keepdims=1)
        var = g.op("Add", [mean, g.const(np.array(self.w.rms_eps, np.float32))])
        std = g.op("Sqrt", [var])
        normed = g.op("Div", [x, std])
        return g.op("Mul", [normed, g.const(weight.astype(np.float32), f"{name}.weight")])

    def rotary(self, x: str, cos: str, sin: str) -> str:
        """x * cos + rotate_half(x) * sin over the last axis; x is (B, T, H, hd), cos/sin (T, 1, hd)."""
        g = self.g
        half = self.hd // 2
        x1, x2 = g.op("Split", [x, g.i64([half, half])], outputs=2, axis=-1)
        rotated = g.op("Concat", [g.op("Neg", [x2]), x1], axis=-1)
        return g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [rotated, sin])])

    def layer(self, i: int, x: str, cos: str | None, sin: str | None, mask: str) -> tuple[str, str, str]:
        g, hd, lw = self.g, self.hd, self.w.layers[i]
        n_q, n_kv = lw.heads(hd)
        rep = n_q // n_kv
        prefix = f"layers.{i}"

        h = self.rms_norm(x, lw.input_norm, f"{prefix}.input_norm")
        scale = np.float32(self.w.scale)
        key = f"model.layers.{i}"
        # 1/sqrt(hd) goes into Q's weights, or into Qwen3's query norm, which would normalise it away from them
        q_fold = scale if lw.q_norm is None else np.float32(1.0)
        qkv = self.project(h, [Projection(lw.q, f"{key}.self_attn.q_proj", lw.q_bias, q_fold),
                               Projection(lw.k, f"{key}.self_attn.k_proj", lw.k_bias),
                               Projection(lw.v, f"{key}.self_attn.v_proj", lw.v_bias)],
                           f"{prefix}.attn.qkv")  # (B, T, (Hq+2Hkv)*hd)
        qk, v = g.op("Split", [qkv, g.i64([(n_q + n_kv) * hd, n_kv * hd])], outputs=2, axis=-1)
        qk = g.op("Reshape", [qk, g.i64([0, 0, n_q + n_kv, hd])])  # (B, T, Hq+Hkv, hd)
        if lw.q_norm is not None:
            qk = self.rms_norm(qk, head_norm_weights(lw, n_q, n_kv, scale), f"{prefix}.attn.qk_norm")
        if cos is not None:  # None: a layer without rotary (SmolLM3's NoPE layers, transformers' use_rope false)
            qk = self.rotary(qk, cos, sin)
        q, k = g.op("Split", [qk, g.i64([n_q, n_kv])], outputs=2, axis=2)
        k = g.op("Transpose", [k], perm=[0, 2, 1, 3])  # (B, Hkv, T, hd)
        v = g.op("Transpose", [g.op("Reshape", [v, g.i64([0, 0, n_kv, hd])])], perm=[0, 2, 1, 3])
        present_k = g.op("Concat", [f"past_key_values.{i}.key", k], outputs=[f"present.{i}.key"], axis=2)
        present_v = g.op("Concat", [f"past_key_values.{i}.value", v], outputs=[f"present.{i}.value"], axis=2)
        present_k, present_v = present_k[0], present_v[0]

        q = g.op("Reshape", [q, g.i64([0, 0, n_kv, rep, hd])])  # (B, T, Hkv, rep, hd)
        q = g.op("Transpose", [q], perm=[0, 2, 3, 1, 4])  # (B, Hkv, rep, T, hd)
        k_t = g.op("Unsqueeze", [g.op("Transpose", [present_k], perm=[0, 1, 3, 2]), g.i64([2])])  # (B,Hkv,1,hd,S)
        scores = g.op("Add", [g.op("MatMul", [q, k_t]), mask])  # (B, Hkv, rep, T, S)
        probs = g.op("Softmax", [scores], axis=-1)
        ctx = g.op("MatMul", [probs, g.op("Unsqueeze", [present_v, g.i64([2])])])  # (B, Hkv, rep, T, hd)
        ctx = g.op("Transpose", [ctx], perm=[0, 3, 1, 2, 4])  # (B, T, Hkv, rep, hd)
        ctx = g.op("Reshape", [ctx, g.i64([0, 0, n_q * hd])])  # (B, T, Hq*hd)
        attn_out = self.project(ctx, [Projection(lw.o, f"{key}.self_attn.o_proj")], f"{prefix}.attn.o")  # (B, T, D)
        if lw.attn_out_norm is not None:  # Gemma 3's norm of the attention's output
            attn_out = self.rms_norm(attn_out, lw.attn_out_norm, f"{prefix}.attn_out_norm")
        x = g.op("Add", [x, attn_out])

        h = self.rms_norm(x, lw.post_attention_norm, f"{prefix}.post_attention_norm")
        ffn_out = self.ffn(h, lw, prefix, key)
        if lw.ffn_out_norm is not None:  # and of the FFN's
            ffn_out = self.rms_norm(ffn_out, lw.ffn_out_norm, f"{prefix}.ffn_out_norm")
        x = g.op("Add", [x, ffn_out])
        return x, present_k, present_v

    def ffn(self, h: str, lw: LayerWeights, prefix: str, key: str) -> str:
        """SwiGLU: down(silu(gate(h)) * up(h)), gate and up as one MatMul."""
        g = self.g
        gate_up = self.project(h, [Projection(lw.gate, f"{key}.mlp.gate_proj"), Projection(lw.up, f"{key}.mlp.up_proj")],
                               f"{prefix}.mlp.gate_up")  # (B, T, 2F)
        gate, up = g.op("Split", [gate_up, g.i64([lw.ffn_width, lw.ffn_width])], outputs=2, axis=-1)
        act = self.gelu_tanh(gate) if self.w.activation == "gelu_tanh" else g.op("Mul", [gate, g.op("Sigmoid", [gate])])
        return self.project(g.op("Mul", [act, up]), [Projection(lw.down, f"{key}.mlp.down_proj")], f"{prefix}.mlp.down")

    def gelu_tanh(self, x: str) -> str:
        """GELU's tanh form, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (Hendrycks & Gimpel 2016; PyTorch's
        gelu(approximate="tanh"), Gemma's FFN), in opset-17 ops."""
        g = self.g
        cubed = g.op("Mul", [g.op("Mul", [x, x]), x])
        inner = g.op("Add", [x, g.op("Mul", [cubed, g.const(np.array(0.044715, np.float32))])])
        tanh = g.op("Tanh", [g.op("Mul", [inner, g.const(np.array(np.sqrt(2.0 / np.pi), np.float32))])])
        half_x = g.op("Mul", [x, g.const(np.array(0.5, np.float32))])
        return g.op("Mul", [half_x, g.op("Add", [tanh, g.const(np.array(1.0, np.float32))])])

    def project(self, x: str, parts: list[Projection], name: str) -> str:
        """x @ [W_1 | W_2 | …] (+ biases) as one MatMul on the concatenated weights: (…, K) -> (…, sum N)."""
        g = self.g
        weight = np.concatenate([p.weight * p.fold for p in parts], axis=1).astype(np.float32)
        out = g.op("MatMul", [x, g.const(weight, f"{name}.weight")])
        if parts[0].bias is not None:
            bias = np.concatenate([p.bias * p.fold for p in parts]).astype(np.float32)
            out = g.op("Add", [out, g.const(bias, f"{name}.bias")])
        return out

    def table(self, matrix: np.ndarray, name: str, head: bool) -> str:
        """A (V, D) embedding or LM-head matrix as a float tensor; ``head``: the LM head reads it."""
        return self.g.const(matrix.astype(np.float32), name)

    def build(self) -> onnx.ModelProto:
        g, w = self.g, self.w
        past_len = g.op("Shape", ["past_key_values.0.key"], start=2, end=3)  # (1,)
        seq_len = g.op("Shape", ["input_ids"], start=1, end=2)  # (1,)
        total = g.op("Add", [past_len, seq_len])
        zero, one = g.scalar(np.int64(0)), g.scalar(np.int64(1))  # Range takes scalars
        past_scalar = g.op("Squeeze", [past_len, g.i64([0])])
        total_scalar = g.op("Squeeze", [total, g.i64([0])])
        positions = g.op("Range", [past_scalar, total_scalar, one])  # (T,)

        rotations = []  # (cos, sin) of each rotary table, gathered at the step's positions: (T, 1, hd)
        for rope in range(len(w.ropes())):
            tables = rotary_tables(w, self.max_context, rope)
            rotations.append(tuple(g.op("Unsqueeze", [g.op("Gather", [g.const(table, rotary_name(rope, kind)),
                                                                      positions]), g.i64([1])])
                                   for table, kind in zip(tables, ("cos", "sin"), strict=True)))

        # Causal mask (T, S): query at absolute position p sees keys 0..p; with a sliding window of W only
        # keys p-W+1..p (transformers' sliding_window_causal_mask).
        keys = g.op("Range", [zero, total_scalar, one])  # (S,)
        query_at, key_at = g.op("Unsqueeze", [positions, g.i64([1])]), g.op("Unsqueeze", [keys, g.i64([0])])
        future = g.op("Less", [query_at, key_at])  # (T, S)
        masks: dict[int | None, str] = {}

        def mask_of(window: int | None) -> str:
            if window not in masks:
                hidden = future
                if window is not None:
                    too_old = g.op("LessOrEqual", [key_at, g.op("Sub", [query_at, g.i64([window])])])
                    hidden = g.op("Or", [future, too_old])
                masks[window] = g.op("Where", [hidden, g.const(np.array(NEG_INF, np.float32)),
                                               g.const(np.array(0, np.float32))])
            return masks[window]

        embed_name = self.table(w.embed, "embed_tokens.weight", head=w.lm_head is None)
        x = g.op("Gather", [embed_name, "input_ids"])  # (B, T, D)
        if w.embed_scale != 1.0:  # Gemma: the looked-up rows times sqrt(D), the table itself unscaled
            x = g.op("Mul", [x, g.const(np.array(w.embed_scale, np.float32))])
        for i, lw in enumerate(w.layers):
            cos, sin = (None, None) if lw.rope is None else rotations[lw.rope]
            x, _, _ = self.layer(i, x, cos, sin, mask_of(lw.window))
        x = self.rms_norm(x, w.final_norm, "final_norm")  # (B, T, D)
        if self.HIDDEN_OUTPUT:
            g.op("Identity", [x], outputs=[HIDDEN_STATES])

        # Only the last num_logits_to_keep positions go through the LM head.
        neg_keep = g.op("Neg", ["num_logits_to_keep"])
        x = g.op("Slice", [x, neg_keep, g.i64([np.iinfo(np.int64).max]), g.i64([1])])  # (B, K, D)
        out_shape = g.op("Concat", [g.op("Shape", [x], start=0, end=2), g.i64([w.vocab_size])], axis=0)
        flat = g.op("Reshape", [x, g.i64([-1, w.hidden_size])])  # (B*K, D)
        head = embed_name if w.lm_head is None else self.table(w.lm_head, "lm_head.weight", head=True)
        logits = g.op("Gemm", [flat, head], transB=1)  # (B*K, V)
        g.op("Reshape", [logits, out_shape], outputs=["logits"])  # (B, K, V)

        inputs = [tensor_input("input_ids", INT64, ["batch", "seq"])]
        outputs = [tensor_input("logits", FLOAT, ["batch", "kept", w.vocab_size])]
        for i, kv in enumerate(w.kv_heads()):
            for kind in ("key", "value"):
                inputs.append(tensor_input(f"past_key_values.{i}.{kind}", FLOAT, ["batch", kv, "past_seq", self.hd]))
                outputs.append(tensor_input(f"present.{i}.{kind}", FLOAT, ["batch", kv, "total_seq", self.hd]))
        inputs.append(tensor_input("num_logits_to_keep", INT64, [1]))
        if self.HIDDEN_OUTPUT:
            outputs.append(tensor_input(HIDDEN_STATES, FLOAT, ["batch", "seq", w.hidden_size]))
        return g.model("edgesdk_decoder", inputs, outputs, OPSET, doc=self.DOC)


def emit_decoder(weights: DecoderWeights, max_context: int) -> tuple[onnx.ModelProto, GraphSpec]:
    """Build the ONNX decoder graph and the spec the runtime needs to drive it."""
    model = _Emitter(weights, max_context).build()
    spec = GraphSpec(
        num_layers=len(weights.layers), kv_heads=tuple(weights.kv_heads()), head_dim=weights.head_dim,
        vocab_size=weights.vocab_size, max_context=max_context, hidden_states=True,
    )
    return model, spec
