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
    q_norm: np.ndarray | None = None  # (hd,) Qwen3: RMSNorm weight of every query head, before rotary
    k_norm: np.ndarray | None = None  # (hd,) and of every key head

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

    @property
    def vocab_size(self) -> int:
        return self.embed.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.embed.shape[1]

    def kv_heads(self) -> list[int]:
        return [layer.heads(self.head_dim)[1] for layer in self.layers]


def _np(tensor) -> np.ndarray:
    return tensor.detach().to("cpu").float().numpy().copy()


def decoder_weights_from_hf(model) -> DecoderWeights:
    """Read a transformers Llama/Mistral/Qwen2/Qwen3 causal LM into DecoderWeights."""
    config = model.config
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
        ))
    return weights
