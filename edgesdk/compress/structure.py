"""Per-layer structure of a (possibly pruned) decoder: which teacher heads and FFN channels each
layer keeps, physical slicing of the weights, and rebuilding a pruned model from a checkpoint.

Hugging Face configs describe uniform layers only, so the per-layer record travels in
``model.config.edgesdk_layers``: ``[{"layer": i, "heads": [...], "kv_heads": [...], "ffn": [...]}, ...]``
with indices into the unpruned model (distillation compares surviving layers and heads with
themselves). ``layer`` is absent from records written before depth pruning: the i-th record is then
the teacher's layer i.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from edgesdk.compress.fake_quant import CONFIG_KEY as QUANT_KEY
from edgesdk.power.adapter import CONFIG_KEY as POWER_KEY

LAYERS_KEY = "edgesdk_layers"
LINEAR_PREFIX = "model.layers."  # the quantization scheme names its per-linear settings model.layers.{i}.…


def head_dim(model) -> int:
    config = model.config
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def layer_records(model) -> list[dict]:
    """The per-layer record; an unpruned model keeps every head and channel."""
    stored = getattr(model.config, LAYERS_KEY, None)
    if stored:
        return [dict(r) for r in stored]
    config = model.config
    return [{"layer": i, "heads": list(range(config.num_attention_heads)),
             "kv_heads": list(range(config.num_key_value_heads)), "ffn": list(range(config.intermediate_size))}
            for i in range(config.num_hidden_layers)]


def teacher_layers(model) -> list[int]:
    """The unpruned model's index of each remaining decoder layer."""
    return [int(record.get("layer", i)) for i, record in enumerate(layer_records(model))]


def keep_layers(model, kept: list[int]) -> None:
    """Keep decoder layers ``kept`` (positions in the current model, ascending), in place: the module list,
    the layer count and per-layer settings of the config (``layer_types``, SmolLM3's ``no_rope_layers``, the
    quantization scheme's per-linear ones renamed with their layers), each attention's KV-cache index, and the
    record. Call it with the fake quantization detached: an attached linear keeps the name it was attached
    under."""
    records = layer_records(model)
    layers = model.model.layers
    model.model.layers = nn.ModuleList([layers[i] for i in kept])
    for index, layer in enumerate(model.model.layers):
        layer.self_attn.layer_idx = index  # the KV cache is indexed by it
    config = model.config
    config.num_hidden_layers = len(kept)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in kept]
    if getattr(config, "no_rope_layers", None):  # SmolLM3: SmolLM3Attention reads use_rope from its layer's entry
        config.no_rope_layers = [config.no_rope_layers[i] for i in kept]
    # a record written before depth pruning has no "layer" (its position is the teacher's layer): it gets one
    setattr(config, LAYERS_KEY, [{**records[i], "layer": int(records[i].get("layer", i))} for i in kept])
    _rename_quant_settings(config, kept)


def _rename_quant_settings(config, kept: list[int]) -> None:
    """The recorded quantization scheme's activation scales and 8-bit linears, named by their layer's
    position: renamed to the kept layers' new positions, those of removed layers dropped."""
    scheme = getattr(config, QUANT_KEY, None)
    if not scheme:
        return
    position = {old: new for new, old in enumerate(kept)}

    def renamed(name: str) -> str | None:
        if not name.startswith(LINEAR_PREFIX):
            return name  # the LM head
        index, _, module = name[len(LINEAR_PREFIX):].partition(".")
        return f"{LINEAR_PREFIX}{position[int(index)]}.{module}" if int(index) in position else None

    scales = {renamed(name): value for name, value in (scheme.get("activation_scales") or {}).items()}
    eight_bit = [renamed(name) for name in scheme.get("eight_bit_linears") or ()]
    setattr(config, QUANT_KEY, {**scheme, "activation_scales": {k: v for k, v in scales.items() if k is not None},
                                "eight_bit_linears": [name for name in eight_bit if name is not None]})


def slice_linear(linear: nn.Linear, rows: list[int] | None = None, cols: list[int] | None = None) -> None:
    """Keep the given output rows / input columns of a linear, in place."""
    weight = linear.weight.data
    bias = linear.bias.data if linear.bias is not None else None
    if rows is not None:
        index = torch.tensor(rows, dtype=torch.long)
        weight = weight.index_select(0, index)
        bias = bias.index_select(0, index) if bias is not None else None
    if cols is not None:
        weight = weight.index_select(1, torch.tensor(cols, dtype=torch.long))
    linear.weight = nn.Parameter(weight.contiguous(), requires_grad=linear.weight.requires_grad)
    if bias is not None:
        linear.bias = nn.Parameter(bias.contiguous(), requires_grad=linear.bias.requires_grad)
    linear.out_features, linear.in_features = weight.shape


def keep_ffn_channels(layer, channels: list[int]) -> None:
    """Keep FFN channels ``channels`` (positions in the layer's current FFN)."""
    slice_linear(layer.mlp.gate_proj, rows=channels)
    slice_linear(layer.mlp.up_proj, rows=channels)
    slice_linear(layer.mlp.down_proj, cols=channels)
    if hasattr(layer.mlp, "intermediate_size"):
        layer.mlp.intermediate_size = len(channels)


def keep_kv_groups(layer, groups: list[int], q_per_kv: int, dim: int) -> None:
    """Keep whole grouped-query attention groups (a KV head and the query heads that read it),
    positions in the layer's current heads; the query-per-KV ratio is unchanged."""
    kv_rows = [g * dim + d for g in groups for d in range(dim)]
    q_heads = [g * q_per_kv + j for g in groups for j in range(q_per_kv)]
    q_rows = [h * dim + d for h in q_heads for d in range(dim)]
    attention = layer.self_attn
    slice_linear(attention.q_proj, rows=q_rows)
    slice_linear(attention.k_proj, rows=kv_rows)
    slice_linear(attention.v_proj, rows=kv_rows)
    slice_linear(attention.o_proj, cols=q_rows)
    for name, value in (("num_heads", len(q_heads)), ("num_key_value_heads", len(groups))):
        if hasattr(attention, name):
            setattr(attention, name, value)


def apply_records(model, records: list[dict]) -> None:
    """Shape a freshly built (unpruned-shape) model like ``records`` so a pruned state dict loads."""
    config = model.config
    q_per_kv = config.num_attention_heads // config.num_key_value_heads
    dim = head_dim(model)
    for layer, record in zip(model.model.layers, records, strict=True):
        if len(record["ffn"]) != layer.mlp.gate_proj.out_features:
            keep_ffn_channels(layer, list(range(len(record["ffn"]))))
        kv_now = layer.self_attn.k_proj.out_features // dim
        if len(record["kv_heads"]) != kv_now:
            keep_kv_groups(layer, list(range(len(record["kv_heads"]))), q_per_kv, dim)
    setattr(model.config, LAYERS_KEY, records)


def _load_generation_config(model, path: Path) -> None:
    """The checkpoint's ``generation_config.json``, as ``from_pretrained`` reads it for an unpruned checkpoint.

    ``from_config`` derives the generation config from config.json alone, so the EOS ids and sampling settings
    only generation_config.json holds (Qwen2.5-Instruct's ``[151645, 151643]``, Gemma 3's ``[1, 106]``) were lost
    when a pruned checkpoint was reloaded (``--resume`` after prune): the bundle's EOS list then differed from the
    one a build without a resume writes. Unreadable, it is left derived from config.json, as transformers'
    ``from_pretrained`` leaves it (it logs the OSError and goes on)."""
    from transformers import GenerationConfig

    if not (path / "generation_config.json").is_file():
        return
    try:
        model.generation_config = GenerationConfig.from_pretrained(path)
    except OSError:
        pass


def load_pruned(path: Path):
    """Load a checkpoint whose layers may have been pruned (``edgesdk_layers`` in its config). Power adapters
    are left to ``edgesdk.power.adapter.restore_adapters`` (a checkpoint load hook), as ``from_pretrained``
    leaves them for an unpruned one."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    records = getattr(config, LAYERS_KEY, None)
    if not records:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _load_generation_config(model, Path(path))
    apply_records(model, records)
    state = {}
    for shard in sorted(Path(path).glob("*.safetensors")):
        state.update(load_file(shard))
    if getattr(config, POWER_KEY, None):  # the power stage's adapters: its load hook reinstalls and loads them
        state = {name: tensor for name, tensor in state.items() if ".power_adapter." not in name}
    missing, unexpected = model.load_state_dict(state, strict=False)
    allowed_missing = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - allowed_missing or unexpected:
        raise ValueError(f"checkpoint {path} does not match its recorded structure: missing {missing}, "
                         f"unexpected {unexpected}")
    if allowed_missing:
        model.tie_weights()
    return model.eval()
