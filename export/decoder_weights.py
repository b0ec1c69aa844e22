"""Framework-neutral weights of a Llama-family decoder, read from a transformers model.

Per-layer head counts and FFN widths are read from the weight shapes, not the config, so a
structurally pruned model (different heads or FFN width per layer) exports without changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class LayerWeights:
    """One decoder layer. Matrices are stored as (in_features, out_features) for x @ W."""

    input_norm: np.ndarray  # (D,)
    post_attention_norm: np.ndarray  # (D,)
    q: np.ndarray  # (D, Hq*hd)
    k: np.ndarray  # (D, Hkv*hd)
    v: np.ndarray  # (D, Hkv*hd)
    o: np.ndarray  # (Hq*hd, D)
    gate: np.ndarray  # (D, F)
    up: np.ndarray  # (D, F)
    down: np.ndarray  # (F, D)
    q_bias: np.ndarray | None = None  # (Hq*hd,)
    k_bias: np.ndarray | None = None
    v_bias: np.ndarray | None = None
    q_norm: np.ndarray | None = None  # (hd,) Qwen3, Gemma 3: RMSNorm weight of every query head, before rotary
    k_norm: np.ndarray | None = None  # (hd,) and of every key head
    attn_out_norm: np.ndarray | None = None  # (D,) Gemma 3: RMSNorm of the attention's output before the residual add
    ffn_out_norm: np.ndarray | None = None  # (D,) Gemma 3: and of the FFN's output
    rope: int | None = 0  # which of DecoderWeights.ropes() rotates this layer (Gemma 3: local and global bases);
    # None: the layer rotates neither query nor key (SmolLM3's NoPE layers)
    window: int | None = None  # sliding attention: each query sees the last `window` positions, itself included

    def heads(self, head_dim: int) -> tuple[int, int]:
        """(query heads, key/value heads) of this layer."""
        return self.q.shape[1] // head_dim, self.k.shape[1] // head_dim

    @property
    def ffn_width(self) -> int:
        return self.gate.shape[1]


@dataclass
class DecoderWeights:
    """Everything the ONNX emitter needs to rebuild the decoder."""

    architecture: str
    head_dim: int
    rms_eps: float
    embed: np.ndarray  # (V, D); also the LM head when tied
    final_norm: np.ndarray  # (D,)
    lm_head: np.ndarray | None  # (V, D) when not tied to the embedding
    inv_freq: np.ndarray  # (hd/2,) rotary inverse frequencies, as the model computes them
    rope_scaling: float  # multiplier of cos/sin (transformers' attention_scaling)
    layers: list[LayerWeights] = field(default_factory=list)
    # rotary settings of layers whose LayerWeights.rope is 1, 2, ... (index 0: inv_freq and rope_scaling above)
    other_ropes: list[tuple[np.ndarray, float]] = field(default_factory=list)
    embed_scale: float = 1.0  # Gemma: the looked-up embedding times sqrt(D) (the LM head reads the table unscaled)
    attention_scale: float | None = None  # softmax(q.k * this); None: 1/sqrt(head_dim) (Gemma: query_pre_attn_scalar)
    activation: str = "silu"  # the FFN's gate activation: silu (SwiGLU) | gelu_tanh (Gemma's GeGLU)

    @property
    def vocab_size(self) -> int:
        return self.embed.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.embed.shape[1]

    def kv_heads(self) -> list[int]:
        return [layer.heads(self.head_dim)[1] for layer in self.layers]

    def ropes(self) -> list[tuple[np.ndarray, float]]:
        """(inverse frequencies (hd/2,), cos/sin multiplier) of each rotary table, by LayerWeights.rope."""
        return [(self.inv_freq, self.rope_scaling), *self.other_ropes]

    @property
    def scale(self) -> float:
        """The attention logits' scale."""
        return self.attention_scale if self.attention_scale is not None else 1.0 / float(np.sqrt(self.head_dim))


def _np(tensor) -> np.ndarray:
    return tensor.detach().to("cpu").float().numpy().copy()


def check_carried(model) -> None:
    """Refuse what the graphs would drop without a word: a bias on a linear other than Qwen2's q/k/v (Llama's
    ``attention_bias`` puts one on o_proj too, ``mlp_bias`` on gate/up/down: transformers' LlamaAttention and
    LlamaMLP; Gemma 3's ``attention_bias`` on all four attention linears), and Gemma's ``final_logit_softcapping``
    (transformers' Gemma3ForCausalLM: ``logits = tanh(logits / cap) * cap``), and an FFN activation other than the one
    the graphs compute (SiLU, Gemma's tanh GELU: the config's ``hidden_act`` / ``hidden_activation``). The model loader
    refuses such configs (edgesdk/models/loader.py, check_architecture); this holds for a model handed to the exporter
    directly."""
    from edgesdk.errors import ExportError
    from edgesdk.models.loader import ffn_activation_mismatch

    config = model.config
    mismatch = ffn_activation_mismatch(config)
    if mismatch:
        field, activation, expected = mismatch
        raise ExportError(f"the model's config sets {field} {activation!r}; the exported graphs compute "
                          f"{expected}(gate) * up for a {config.model_type} model, so its outputs would differ "
                          "from the model's", f"use a {config.model_type} model whose {field} is {expected}")
    cap = getattr(config, "final_logit_softcapping", None)
    if cap is not None:
        raise ExportError(f"the model's config sets final_logit_softcapping {cap}, which the exported graphs do not "
                          "apply (transformers' Gemma3ForCausalLM does): its logits would differ from the model's",
                          "set final_logit_softcapping to null in the model's config, or use a model without it")
    carried = ("q_proj", "k_proj", "v_proj") if config.model_type != "gemma3_text" else ()
    for index, layer in enumerate(model.model.layers):
        for part, names in (("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")),
                            ("mlp", ("gate_proj", "up_proj", "down_proj"))):
            for name in names:
                if getattr(getattr(getattr(layer, part), name), "bias", None) is not None and name not in carried:
                    raise ExportError(
                        f"model.layers.{index}.{part}.{name} has a bias, which the exported graphs do not add "
                        f"(they carry {'/'.join(carried) + ' biases' if carried else 'no biases'} for a "
                        f"{config.model_type} model): its outputs would differ from the model's",
                        "use a model without those biases (config.json attention_bias and mlp_bias false; Qwen2's "
                        "q/k/v biases are exported)")


def decoder_weights_from_hf(model) -> DecoderWeights:
    """Read a transformers Llama/Mistral/Qwen2/Qwen3/SmolLM3/Gemma 3 causal LM into DecoderWeights.

    SmolLM3's layers whose ``no_rope_layers`` entry is 0 (every fourth by default) apply no rotary embedding:
    transformers' SmolLM3Attention skips ``apply_rotary_pos_emb`` where its ``use_rope`` is false (llama.cpp's
    smollm3: ``(il + 1) % 4 == 0``). It is read from each attention module, which keeps it when layers are
    removed, rather than from the config's per-layer list."""
    config = model.config
    check_carried(model)
    if config.model_type == "gemma3_text":
        return _gemma3_weights(model)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    inner = model.model
    rotary = inner.rotary_emb
    tied = model.lm_head.weight.data_ptr() == inner.embed_tokens.weight.data_ptr()
    weights = DecoderWeights(
        architecture=config.model_type,
        head_dim=head_dim,
        rms_eps=float(config.rms_norm_eps),
        embed=_np(inner.embed_tokens.weight),
        final_norm=_np(inner.norm.weight),
        lm_head=None if tied else _np(model.lm_head.weight),
        inv_freq=_np(getattr(rotary, "original_inv_freq", rotary.inv_freq)),  # the model's own frequencies:
        # dynamic and longrope rewrite inv_freq in place after a forward pass on a long sequence
        rope_scaling=float(getattr(rotary, "attention_scaling", 1.0)),
    )
    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp

        def bias(linear):
            return None if linear.bias is None else _np(linear.bias)

        def norm(module):
            return None if module is None else _np(module.weight)

        weights.layers.append(LayerWeights(
            input_norm=_np(layer.input_layernorm.weight),
            post_attention_norm=_np(layer.post_attention_layernorm.weight),
            q=_np(attn.q_proj.weight).T, k=_np(attn.k_proj.weight).T, v=_np(attn.v_proj.weight).T,
            o=_np(attn.o_proj.weight).T,
            gate=_np(mlp.gate_proj.weight).T, up=_np(mlp.up_proj.weight).T, down=_np(mlp.down_proj.weight).T,
            q_bias=bias(attn.q_proj), k_bias=bias(attn.k_proj), v_bias=bias(attn.v_proj),
            q_norm=norm(getattr(attn, "q_norm", None)), k_norm=norm(getattr(attn, "k_norm", None)),
            rope=0 if getattr(attn, "use_rope", True) else None,
        ))
    return weights


def _gemma3_weights(model) -> DecoderWeights:
    """Gemma 3's decoder (Gemma Team 2025, "Gemma 3 Technical Report"; transformers' Gemma3ForCausalLM) in the
    same form: every RMSNorm scales by (1 + weight), so 1 is added here; each layer normalises its input, the
    attention's output, the FFN's input and the FFN's output; the embedding is scaled by sqrt(D); sliding and
    full attention layers rotate at their own bases; the FFN is GeGLU (tanh GELU)."""
    config = model.config
    inner = model.model
    rotary = inner.rotary_emb
    tied = model.lm_head.weight.data_ptr() == inner.embed_tokens.weight.data_ptr()

    def gemma_norm(module) -> np.ndarray:
        return _np(module.weight) + np.float32(1.0)

    kinds = list(dict.fromkeys(config.layer_types))  # the first layer's kind is rotary table 0
    tables = [(_np(getattr(rotary, f"{kind}_original_inv_freq")), float(getattr(rotary, f"{kind}_attention_scaling")))
              for kind in kinds]
    first = inner.layers[0].self_attn
    weights = DecoderWeights(
        architecture=config.model_type, head_dim=first.head_dim, rms_eps=float(config.rms_norm_eps),
        embed=_np(inner.embed_tokens.weight), final_norm=gemma_norm(inner.norm),
        lm_head=None if tied else _np(model.lm_head.weight), inv_freq=tables[0][0], rope_scaling=tables[0][1],
        other_ropes=tables[1:], embed_scale=float(inner.embed_tokens.embed_scale),
        attention_scale=float(first.scaling), activation="gelu_tanh")
    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        weights.layers.append(LayerWeights(
            input_norm=gemma_norm(layer.input_layernorm),
            post_attention_norm=gemma_norm(layer.pre_feedforward_layernorm),  # the FFN's input norm, as Llama's is
            q=_np(attn.q_proj.weight).T, k=_np(attn.k_proj.weight).T, v=_np(attn.v_proj.weight).T,
            o=_np(attn.o_proj.weight).T,
            gate=_np(mlp.gate_proj.weight).T, up=_np(mlp.up_proj.weight).T, down=_np(mlp.down_proj.weight).T,
            q_norm=gemma_norm(attn.q_norm), k_norm=gemma_norm(attn.k_norm),
            attn_out_norm=gemma_norm(layer.post_attention_layernorm),
            ffn_out_norm=gemma_norm(layer.post_feedforward_layernorm),
            rope=kinds.index(attn.layer_type), window=attn.sliding_window,
        ))
    return weights
