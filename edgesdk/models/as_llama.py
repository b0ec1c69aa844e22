"""Decoders that compute exactly a Llama decoder once their weights are rewritten, loaded as that Llama.

- Phi-3 / Phi-3.5-mini (transformers' ``phi3``, models/phi3/modeling_phi3.py): ``Phi3Attention.qkv_proj`` holds
  the query, key and value projections stacked by rows (heads * hd, kv_heads * hd, kv_heads * hd rows) and
  ``Phi3MLP.gate_up_proj`` the gate and up projections (``gate, up_states = up_states.chunk(2, dim=-1)``: the gate
  first); RMSNorm, SiLU, no biases and rotary over halves (``rotate_half``) as Llama's. Its rotary settings
  (``rope_parameters``, e.g. Phi-3.5's longrope with short / long factors) go over unchanged: transformers' Llama
  takes them through the same ``ROPE_INIT_FUNCTIONS``. Two things Llama's layers do not compute are kept in the
  config for the export's checks: a partial rotary factor below 1 (Phi-4-mini's 0.75, which Phi-3's
  ``apply_rotary_pos_emb`` honours and Llama's default rotary ignores) is refused here, and Phi-3's sliding window
  (Phi-3-mini-4k: 2047, ``create_sliding_window_causal_mask``) is kept as ``edgesdk_source_sliding_window``, which
  export/onnx_export.py's ``sliding_window`` reads so that a bundle context longer than the window is refused.
  It is not kept as ``sliding_window``: transformers' ``DynamicCache(config=...)`` would then drop old keys of the
  Llama's cache while its mask attends over all of them.
- Granite 3 dense models (``granite``, models/granite/modeling_granite.py): Llama with four multipliers, folded
  into the weights. ``attention_multiplier`` is the softmax scale in place of 1/sqrt(hd): the query rows are
  scaled by attention_multiplier * sqrt(hd) (rotary is linear in the query); ``residual_multiplier`` scales each
  branch before the residual add: o_proj and down_proj are scaled by it; ``embedding_multiplier`` scales the
  embedding output: the embedding table is scaled by it; ``logits_scaling`` divides the logits: the LM head is
  divided by it. Where the embedding and LM head are tied (granite-3.x) and the two factors differ, they are
  untied: the converted model, and the bundle, then store both tables.

The converted model is a transformers ``LlamaForCausalLM`` whose config records ``edgesdk_source_architecture``
(the source's model_type), so every stage, graph form and the GGUF export (as llama.cpp's ``llama``) apply to it
unchanged.
"""

from __future__ import annotations

import math
from typing import Any

from edgesdk.errors import ModelSourceError

# model_type -> what the conversion rewrites
CONVERTED_ARCHITECTURES = {
    "phi3": "qkv_proj split into q_proj / k_proj / v_proj, gate_up_proj into gate_proj / up_proj",
    "granite": "attention, residual, embedding and logits multipliers folded into the weights",
}
SOURCE_ARCHITECTURE = "edgesdk_source_architecture"  # the config key naming the source's model_type
SOURCE_SLIDING_WINDOW = "edgesdk_source_sliding_window"  # the config key holding Phi-3's attention window
# config fields a LlamaConfig takes over as they are
_LLAMA_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "hidden_act", "max_position_embeddings", "initializer_range", "rms_norm_eps",
                 "use_cache", "pad_token_id", "bos_token_id", "eos_token_id", "tie_word_embeddings",
                 "attention_dropout")


def converts_to_llama(config: Any) -> bool:
    return getattr(config, "model_type", None) in CONVERTED_ARCHITECTURES


def _head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def check_convertible(config: Any, where: str) -> None:
    """Refuse, from the config alone, a model of a converted architecture that Llama's layers would compute
    differently: a Phi-3 config whose rotary covers part of each head (partial_rotary_factor below 1, Phi-4-mini)."""
    if getattr(config, "model_type", None) != "phi3":
        return
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    factor = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None)) \
        if isinstance(params, dict) else getattr(config, "partial_rotary_factor", None)
    if factor is not None and float(factor) != 1.0:
        head = _head_dim(config)
        raise ModelSourceError(
            f"model {where} is a phi3 model with partial_rotary_factor {factor}: it rotates "
            f"{int(head * float(factor))} of each head's {head} dimensions (Phi-4-mini's layout), and edgesdk's graphs, "
            "which compute it as a Llama decoder, rotate the whole head, so its answers would differ",
            "use a Phi-3 / Phi-3.5 model, whose rotary covers the whole head (partial_rotary_factor 1)")


def llama_config_of(config: Any):
    """The LlamaConfig of the Llama decoder a Phi-3 or Granite ``config`` computes (before untying, see
    as_llama)."""
    from transformers import LlamaConfig

    values = {name: getattr(config, name) for name in _LLAMA_FIELDS if hasattr(config, name)}
    extra = _rope_settings(config)
    if config.model_type == "phi3":
        # longrope reads original_max_position_embeddings from the config where rope_parameters lacks it
        extra["original_max_position_embeddings"] = config.original_max_position_embeddings
        if getattr(config, "sliding_window", None) is not None:  # Phi3Model masks with a window only then
            extra[SOURCE_SLIDING_WINDOW] = int(config.sliding_window)
    llama = LlamaConfig(**values, head_dim=_head_dim(config), attention_bias=False, mlp_bias=False,
                        **{SOURCE_ARCHITECTURE: config.model_type}, **extra)
    llama._name_or_path = getattr(config, "_name_or_path", "")
    return llama


def _rope_settings(config: Any) -> dict:
    """The rotary settings of ``config`` as LlamaConfig takes them. transformers 5 keeps them in one
    ``rope_parameters`` mapping (its ``rope_theta`` inside); transformers 4.x, which pyproject.toml allows from 4.56,
    keeps ``rope_theta`` and ``rope_scaling`` as two attributes and its LlamaConfig reads only those two, so there
    both go over as they are (given as ``rope_parameters`` alone, a 4.x Llama would rotate with its default theta
    10000 and no scaling: Granite 3.1's rope_theta 10,000,000 or Phi-3.5's longrope factors lost, every answer
    changed)."""
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict):
        return {"rope_parameters": dict(rope)}
    scaling = getattr(config, "rope_scaling", None)
    settings = {"rope_scaling": dict(scaling) if isinstance(scaling, dict) else None}
    if getattr(config, "rope_theta", None) is not None:
        settings["rope_theta"] = config.rope_theta
    return settings


def as_llama(model):
    """The ``LlamaForCausalLM`` computing what the Phi-3 or Granite ``model`` computes, built from its weights.

    The source model is consumed: its fused projections are removed as they are split (one layer's copies at a
    time, not a second model's worth of memory) and Granite's weights are scaled in place."""
    import torch
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = model.config
    check_convertible(config, getattr(config, "_name_or_path", "") or "given")
    llama_config = llama_config_of(config)
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    with torch.no_grad():
        if config.model_type == "phi3":
            state = _phi3_state(model)
        else:
            state, untied_head = _granite_state(model, tied)
            if untied_head is not None:
                tied = False
                state["lm_head.weight"] = untied_head
    if tied:
        state.pop("lm_head.weight", None)
    llama_config.tie_word_embeddings = tied
    with torch.device("meta"):  # no second set of weights: the source's tensors are assigned below
        llama = LlamaForCausalLM(llama_config)
    missing, unexpected = llama.load_state_dict(state, strict=False, assign=True)
    if unexpected or set(missing) - ({"lm_head.weight"} if tied else set()):
        raise RuntimeError(f"converting {config.model_type} to Llama left weights unmatched: "
                           f"missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    if tied:
        llama.lm_head.weight = llama.model.embed_tokens.weight
    llama.model.rotary_emb = LlamaRotaryEmbedding(llama_config)  # its buffers are not weights: built here
    llama.generation_config = model.generation_config
    return llama.eval()


def _phi3_state(model) -> dict:
    """Phi-3's weights under Llama's names, its fused projections split by rows (Phi3Attention.forward's
    query / key / value slices, Phi3MLP.forward's gate / up chunks)."""
    config = model.config
    hd = _head_dim(config)
    q_rows, kv_rows = config.num_attention_heads * hd, config.num_key_value_heads * hd
    state = {}
    for index, layer in enumerate(model.model.layers):
        prefix = f"model.layers.{index}"
        q, k, v = layer.self_attn.qkv_proj.weight.split([q_rows, kv_rows, kv_rows], dim=0)
        state.update({f"{prefix}.self_attn.q_proj.weight": q.clone(), f"{prefix}.self_attn.k_proj.weight": k.clone(),
                      f"{prefix}.self_attn.v_proj.weight": v.clone()})
        gate, up = layer.mlp.gate_up_proj.weight.chunk(2, dim=0)
        state.update({f"{prefix}.mlp.gate_proj.weight": gate.clone(), f"{prefix}.mlp.up_proj.weight": up.clone()})
        del q, k, v, gate, up
        del layer.self_attn.qkv_proj, layer.mlp.gate_up_proj  # freed now, before the next layer's copies
    for name, tensor in model.state_dict().items():
        state.setdefault(name, tensor)
    return state


def _granite_state(model, tied: bool) -> tuple[dict, Any]:
    """Granite's weights with its multipliers folded in (GraniteAttention's scaling, GraniteDecoderLayer's
    residual_multiplier, GraniteModel's embedding_multiplier, GraniteForCausalLM's logits_scaling), and the LM
    head a tied embedding whose two factors differ needs of its own (None where the table stays shared)."""
    config = model.config
    query = float(config.attention_multiplier) * math.sqrt(_head_dim(config))
    residual, embedding = float(config.residual_multiplier), float(config.embedding_multiplier)
    logits = float(config.logits_scaling)
    for layer in model.model.layers:
        if query != 1.0:
            layer.self_attn.q_proj.weight.mul_(query)
        if residual != 1.0:
            layer.self_attn.o_proj.weight.mul_(residual)
            layer.mlp.down_proj.weight.mul_(residual)
    table = model.model.embed_tokens.weight
    head = None
    if tied and embedding * logits != 1.0:
        # one table cannot be both embedding * m and head / s: the bundle stores both (untied)
        head = table / logits
    elif not tied and logits != 1.0:
        model.lm_head.weight.div_(logits)
    if embedding != 1.0:  # where the table stays tied, embedding == 1 / logits_scaling: one table serves both
        table.mul_(embedding)
    return dict(model.state_dict()), head
