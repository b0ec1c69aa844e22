"""The fused decoder graph with power adapters: per-token FFN gates that really skip the FFN.

Built on :class:`_FusedEmitter` (export/fused_graph.py); per layer ``l`` it adds the adapter of
edgesdk/power/adapter.py on the normalized post-attention state ``h``:

    z = Sigmoid(h W1 + b1); o = z W2 + b2 -> Split -> scales (D) | query scales of layer l+1 | gate
    gate = Sigmoid(gate logit)                                  (B, S, 1)
    keep = Cast(gate >= tau)                                    (B, S, 1)
    y = If(ReduceMax(gate) < tau, then: 0, else: FFN(h) * scales' * keep)
    scales' = Where(tau >= 0, scales, 1)                        gating off (tau < 0): no scale acts

At decode (S = 1) the ``If`` condition is exactly "this token's gate is below tau", so a skipped
FFN's weights are never read; at prefill the FFN runs unless every token skips, and ``keep``
zeroes the skipped tokens: both paths compute the same function as the PyTorch gated model.
The adapter's query scales (one per head, repeated over the head's channels in the exported
weights) multiply layer l+1's query before GroupQueryAttention: a soft mask on the pre-softmax
scores of that head. Where the model normalizes each query head (Qwen3, Gemma 3) they multiply the
projected query before that norm, as the PyTorch model's scaled ``q_proj`` does.

Extra interface (beside the fused graph's):

    inputs   tau      float ()            threshold; 0 = every FFN runs with the adapters' scales (the
                                          plain fused backend feeds 0, so export validation checks that
                                          function); below 0 (``ADAPTERS_OFF_TAU``) gating is off and
                                          neither the channel nor the query scales act: the loaded model
    outputs  gates    float (batch, seq, layers)   per-token layer gates
             power    float (batch, seq)           p_t = alpha a_t/â + beta f_t + gamma c_t/ĉ

a_t is the mean over heads of the largest attention probability of the peak layers
(GroupQueryAttention's ``output_qk`` after softmax), f_t the mean over layers of the gated FFN
output's L2 norm divided by that layer's calibration mean, c_t the KV-access cost of the token's
position bucket from the stored profiler statistics (a Gather on a constant table).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgesdk.errors import ExportError
from edgesdk.export.decoder_weights import DecoderWeights
from edgesdk.export.fused_graph import FusedConfig, _FusedEmitter, graph_min_onnxruntime
from edgesdk.export.graph_builder import FLOAT, tensor_input
from edgesdk.export.llama_graph import GraphSpec

GATED_FORM = "ort-fused-gated"


@dataclass
class AdapterWeights:
    """One layer's adapter, as (in, out) matrices for x @ W."""

    w1: np.ndarray  # (D, r)
    b1: np.ndarray  # (r,)
    w2: np.ndarray  # (r, D + H' + 1)
    b2: np.ndarray  # (D + H' + 1,)
    next_heads: int


@dataclass(frozen=True)
class GatedGraphSpec(GraphSpec):
    power: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        data = super().to_json()
        data["inputs"] = {**data["inputs"], "tau": "tau"}
        data["outputs"] = {**data["outputs"], "gates": "gates", "power": "power"}
        data["power"] = self.power
        return data


def adapter_weights_from_hf(model) -> list[AdapterWeights]:
    """Read every layer's PowerAdapter (edgesdk.power.adapter) from a transformers model."""
    result = []
    for index, layer in enumerate(model.model.layers):
        adapter = getattr(layer.mlp, "power_adapter", None)
        if adapter is None:
            raise ExportError(f"layer {index} has no power adapter although the model's config names them",
                              "rebuild with the power stage, or drop edgesdk_power from the config")
        np_ = lambda t: t.detach().float().cpu().numpy().copy()  # noqa: E731
        result.append(AdapterWeights(np_(adapter.proj1.weight).T, np_(adapter.proj1.bias),
                                     np_(adapter.proj2.weight).T, np_(adapter.proj2.bias), adapter.next_heads))
    return result


class _GatedEmitter(_FusedEmitter):
    def __init__(self, weights: DecoderWeights, adapters: list[AdapterWeights], power: dict, max_context: int,
                 config: FusedConfig):
        super().__init__(weights, max_context, config)
        if len(adapters) != len(weights.layers):
            raise ExportError(f"{len(adapters)} power adapters for {len(weights.layers)} layers",
                              "rebuild with the power stage")
        self.adapters, self.power = adapters, power
        self.peak_layers = {int(p) for p in power["peak_layers"]}
        self.query_scales: dict[int, str] = {}
        self.gates: list[str] = []
        self.norms: list[str] = []
        self.peaks: list[str] = []
        # tau >= 0: the adapters' scales act; below 0 gating is off (ADAPTERS_OFF_TAU) and they do not
        self.adapters_on = self.g.op("GreaterOrEqual", ["tau", self.g.const(np.zeros((), np.float32))])  # () bool
        self.unscaled = self.g.const(np.ones((), np.float32))

    # -- attention: scaled queries and the attention peak ---------------------------------------
    def attention_inputs(self, i: int, layer, qkv: str) -> tuple[str, str, str]:
        if i not in self.query_scales or layer.q_norm is not None:  # with head norms: scaled in head_norms
            return qkv, "", ""
        n_q, n_kv = layer.heads(self.hd)
        q, k, v = self.g.op("Split", [qkv, self.g.i64([n_q * self.hd, n_kv * self.hd, n_kv * self.hd])],
                            outputs=3, axis=-1)
        return self.g.op("Mul", [q, self._acting(self.query_scales[i])]), k, v

    def head_norms(self, i: int, layer, qkv: str) -> str:
        """Qwen3's and Gemma 3's per-head query / key RMSNorm, after the query scales: the PyTorch model scales
        ``q_proj``'s output (edgesdk/power/adapter.py ``ScaledQueryProjection``), and transformers' attention
        normalizes that (``q_norm(q_proj(x))``), so the scales act before the norm, not on the normalized query."""
        if i in self.query_scales:
            n_q, n_kv = layer.heads(self.hd)
            q, kv = self.g.op("Split", [qkv, self.g.i64([n_q * self.hd, 2 * n_kv * self.hd])], outputs=2, axis=-1)
            qkv = self.g.op("Concat", [self.g.op("Mul", [q, self._acting(self.query_scales[i])]), kv], axis=-1)
        return super().head_norms(i, layer, qkv)

    def _acting(self, scales: str) -> str:
        """``scales`` where the adapters act (tau >= 0), else 1 (gating off)."""
        return self.g.op("Where", [self.adapters_on, scales, self.unscaled])

    def attention_attributes(self, i: int) -> dict:
        return {"qk_output": 2} if i in self.peak_layers else {}  # probabilities after softmax

    def attention(self, i: int, layer, h: str, cos: str | None, sin: str | None) -> str:
        out = super().attention(i, layer, h, cos, sin)
        if i in self.peak_layers:
            probs = f"layers.{i}.attn.qk"  # (B, Hq, S, total)
            top = self.g.op("ReduceMax", [probs], axes=[-1], keepdims=0)  # (B, Hq, S)
            self.peaks.append(self.g.op("ReduceMean", [top], axes=[1], keepdims=0))  # (B, S)
        return out

    # -- FFN: adapter, gate, If ------------------------------------------------------------------
    def ffn(self, i: int, layer, h: str) -> str:
        g, a, d = self.g, self.adapters[i], self.w.hidden_size
        z = g.op("Sigmoid", [g.op("Add", [g.op("MatMul", [h, g.const(a.w1.astype(np.float32), f"layers.{i}.power.w1")]),
                                          g.const(a.b1.astype(np.float32), f"layers.{i}.power.b1")])])  # (B, S, r)
        # Expand the head columns over each head's channels: the query scale is then one Mul.
        heads = a.w2[:, d: d + a.next_heads]
        w2 = np.concatenate([a.w2[:, :d], np.repeat(heads, self.hd, axis=1), a.w2[:, -1:]], axis=1)
        b2 = np.concatenate([a.b2[:d], np.repeat(a.b2[d: d + a.next_heads], self.hd), a.b2[-1:]])
        o = g.op("Add", [g.op("MatMul", [z, g.const(w2.astype(np.float32), f"layers.{i}.power.w2")]),
                         g.const(b2.astype(np.float32), f"layers.{i}.power.b2")])  # (B, S, D + H'hd + 1)
        sizes = [d, a.next_heads * self.hd, 1] if a.next_heads else [d, 1]
        parts = g.op("Split", [o, g.i64(sizes)], outputs=len(sizes), axis=-1)
        scales, gate_logit = self._acting(parts[0]), parts[-1]
        if a.next_heads:
            self.query_scales[i + 1] = parts[1]
        gate = g.op("Sigmoid", [gate_logit])  # (B, S, 1)
        self.gates.append(gate)
        keep = g.op("Cast", [g.op("GreaterOrEqual", [gate, "tau"])], to=TensorProto.FLOAT)  # (B, S, 1)
        skip = g.op("Less", [g.op("ReduceMax", [gate], keepdims=0), "tau"])  # scalar: every token below tau

        outer = g.nodes
        g.nodes = []
        zero = g.op("Mul", [h, g.const(np.zeros((), np.float32))])
        then_graph = helper.make_graph(g.nodes, f"layers_{i}_ffn_skipped", [], [_value(zero)])
        g.nodes = []
        y = g.op("Mul", [g.op("Mul", [super().ffn(i, layer, h), scales]), keep])
        else_graph = helper.make_graph(g.nodes, f"layers_{i}_ffn_run", [], [_value(y)])
        g.nodes = outer
        out = g.op("If", [skip], then_branch=then_graph, else_branch=else_graph)  # (B, S, D)
        self.norms.append(g.op("ReduceL2", [out], axes=[-1], keepdims=1))  # (B, S, 1)
        return out

    # -- outputs ------------------------------------------------------------------------------
    def extra_interface(self) -> tuple[list, list]:
        g, p = self.g, self.power
        g.op("Concat", self.gates, outputs=["gates"], axis=-1)  # (B, S, L)
        norms = g.op("Concat", self.norms, axis=-1)  # (B, S, L)
        inv = (1.0 / np.asarray(p["ffn_scales"], np.float64)).astype(np.float32)
        ffn = g.op("ReduceMean", [g.op("Mul", [norms, g.const(inv)])], axes=[-1], keepdims=0)  # (B, S)
        peak = self.peaks[0] if len(self.peaks) == 1 else g.op(
            "ReduceMean", [g.op("Concat", [g.op("Unsqueeze", [x, g.i64([-1])]) for x in self.peaks], axis=-1)],
            axes=[-1], keepdims=0)
        # c_t: the token's absolute position -> its bucket -> the stored cost (divided by ĉ).
        total = g.op("Cast", ["total_sequence_length"], to=TensorProto.INT64)
        seq = g.op("Gather", [g.op("Shape", ["input_ids"]), g.i64([1])], axis=0)  # (1,)
        start = g.op("Sub", [total, g.op("Squeeze", [seq])])
        positions = g.op("Range", [start, total, g.scalar(np.int64(1))])  # (S,)
        table = np.asarray(p["cost"]["table_ms"], np.float64) / float(p["cost_scale"])
        bucket = g.op("Min", [g.op("Div", [positions, g.const(np.array(int(p["cost"]["bucket_size"]), np.int64))]),
                              g.const(np.array(len(table) - 1, np.int64))])
        cost = g.op("Unsqueeze", [g.op("Gather", [g.const(table.astype(np.float32)), bucket], axis=0),
                                  g.i64([0])])  # (1, S)
        alpha, beta, gamma = (float(v) for v in p["weights"])
        terms = [g.op("Mul", [peak, g.const(np.array(alpha / float(p["peak_scale"]), np.float32))]),
                 g.op("Mul", [ffn, g.const(np.array(beta, np.float32))]),
                 g.op("Mul", [cost, g.const(np.array(gamma, np.float32))])]
        g.op("Add", [g.op("Add", terms[:2]), terms[2]], outputs=["power"])  # (B, S)
        inputs = [tensor_input("tau", FLOAT, [])]
        outputs = [tensor_input("gates", FLOAT, ["batch", "seq", len(self.w.layers)]),
                   tensor_input("power", FLOAT, ["batch", "seq"])]
        return inputs, outputs


def _value(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, FLOAT, None)


def emit_gated_decoder(weights: DecoderWeights, adapters: list[AdapterWeights], power: dict, max_context: int,
                       config: FusedConfig | None = None) -> tuple[onnx.ModelProto, GatedGraphSpec]:
    """The gated fused graph and its spec (form ``ort-fused-gated``, power settings included). Its attention is
    the fused graph's, so a sliding window (Gemma 3's local layers) needs the same onnxruntime
    (fused_graph.SLIDING_WINDOW_ONNXRUNTIME), which the spec records as emit_fused_decoder's does."""
    config = config or FusedConfig()
    model = _GatedEmitter(weights, adapters, power, max_context, config).build()
    model.graph.doc_string = "edgesdk fused decoder with power gates (seed 000): If-skipped FFNs, tau input"
    spec = GatedGraphSpec(num_layers=len(weights.layers), kv_heads=tuple(weights.kv_heads()),
                          head_dim=weights.head_dim, vocab_size=weights.vocab_size, max_context=max_context,
                          form=GATED_FORM, dtype=config.weights, power=dict(power), hidden_states=True,
                          min_onnxruntime=graph_min_onnxruntime(weights, max_context))
    return model, spec


__all__ = ["GATED_FORM", "GatedGraphSpec", "adapter_weights_from_hf", "emit_gated_decoder"]
