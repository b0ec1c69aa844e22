"""Build stage ``smooth``: move activation outliers into the weights before per-tensor INT8 (SmoothQuant).

TensorRT's explicit quantization takes one static scale per activation tensor. A few hidden channels of
SmolLM2 carry activations hundreds of times larger than the rest, so one scale leaves the others a handful of
levels: the QDQ graph cost +72 % perplexity with nothing else changed (README, Jetson section). SmoothQuant
(Xiao et al. 2023, "SmoothQuant: Accurate and Efficient Post-Training Quantization for Large Language Models",
§4) divides each input channel j of a linear by s_j and multiplies the weight's column j by s_j, with

    s_j = max|X_j|^α / max|W_:,j|^(1-α)

which leaves the product unchanged and splits the range between activations and weights (α = 0.5 in the
paper; 0.85 measured best here, see ``SmoothConfig.alpha``). The division is folded into whatever produces the
input, so the graph gains no op:

* Q|K|V inputs: the input RMSNorm's weight;  gate|up inputs: the post-attention RMSNorm's weight (a power
  adapter reading that input, stage ``power``, takes the scales into its first projection's columns);
  Gemma 3 (transformers' Gemma3DecoderLayer) normalises the attention's output (post_attention_layernorm) and
  the FFN's output (post_feedforward_layernorm) as well: gate|up read pre_feedforward_layernorm, and the two
  output norms read unchanged outputs, so they keep their weights. Its norms scale by 1 + weight
  (Gemma3RMSNorm), so the division goes into 1 + w: w' = (1 + w) / s - 1;
* down's input (SiLU(gate)·up, Gemma 3's GELU(gate)·up): the rows of up (and up's bias, Llama ``mlp_bias``);
* O's input (the attention output): the rows of V (and V's bias, Qwen2 / Llama ``attention_bias``). With grouped-query attention one V row feeds every query
  head of its group, so the group's columns are one channel: s from the largest activation peak and the largest
  weight peak over those columns.

Qwen3's and Gemma 3's per-head q_norm / k_norm read Q's and K's outputs, which smoothing leaves as they were
(only their input columns are scaled), and no model here normalises V, so nothing is folded across a norm.

The transform is exact in real arithmetic; ``tests/unit/test_smooth.py`` (Gemma 3: ``test_gemma3_smooth.py``)
checks the logits are unchanged. It runs before ``qat``, whose observers then see the smoothed ranges.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgesdk.build.registry import BuildContext, register_stage
from edgesdk.compress import fake_quant
from edgesdk.compress.measure import stage_metrics
from edgesdk.compress.sparsify import feed_inputs

SITES = ("qkv", "gate_up", "down", "o")
SCALE_RANGE = (1e-2, 1e4)  # s_j is clamped: a dead channel must not blow a weight column up
# one linear per distinct input: K and V read Q's input, up reads gate's
READERS = ("self_attn.q_proj", "mlp.gate_proj", "mlp.down_proj", "self_attn.o_proj")
# model types whose RMSNorms scale by 1 + weight (transformers' Gemma3RMSNorm) instead of weight
OFFSET_NORMS = frozenset({"gemma3_text"})


@dataclass(frozen=True)
class SmoothConfig:
    """SmoothQuant settings."""

    # migration strength (Xiao et al. 2023 §4: 0 flattens the weight columns, max|W'_:,j| = 1, leaving all the
    # quantization difficulty to the activations; 1 flattens the activation channels, max|X'_j| = 1, moving all of it
    # to the weights; 0.5 splits it evenly; the clamp to SCALE_RANGE aside). SmolLM2-135M, QDQ per-tensor INT8
    # before QAT, first 4096 WikiText-2 tokens (float 21.18): none 44.36, 0.5 26.56, 0.7 22.84, 0.85 22.71
    alpha: float = 0.85
    sites: tuple[str, ...] = SITES  # which inputs to smooth (qkv, gate_up, down, o)
    calibration_batches: int = 8  # batches whose per-channel input peaks set the scales
    batch_size: int = 2  # sequences per calibration batch
    sequence_length: int = 256  # tokens per calibration sequence
    seed: int = 0  # calibration batch order

    def __post_init__(self):
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
        if not self.sites:  # the calibration would run and nothing be smoothed, with nothing said
            raise ValueError(f"sites is empty, so smoothing would change nothing; name at least one of "
                             f"{', '.join(SITES)}, or leave the smooth stage out of the recipe")
        unknown = sorted(set(self.sites) - set(SITES))
        if unknown:
            raise ValueError(f"sites {unknown} are not smoothing sites; allowed: {', '.join(SITES)}")
        if self.calibration_batches < 1:
            raise ValueError(f"calibration_batches must be >= 1, got {self.calibration_batches}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.sequence_length < 1:
            raise ValueError(f"sequence_length must be >= 1, got {self.sequence_length}")


def migration_scales(input_peak: torch.Tensor, weight_peak: torch.Tensor, alpha: float) -> torch.Tensor:
    """s = max|X|^α / max|W|^(1-α) per input channel, clamped to SCALE_RANGE."""
    scales = input_peak.clamp_min(1e-5).pow(alpha) / weight_peak.clamp_min(1e-5).pow(1.0 - alpha)
    return scales.clamp(*SCALE_RANGE)


@torch.no_grad()
def input_peaks(model, batches: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """max |x_j| over the calibration tokens for every input channel j of each distinct linear input
    (keyed by the reading linear in READERS)."""
    peaks: dict[str, torch.Tensor] = {}

    def accumulate(name, x):
        peak = x.detach().abs().amax(0).float()
        peaks[name] = torch.maximum(peaks[name], peak) if name in peaks else peak

    readers = {name: linear for name, linear in fake_quant.decoder_linears(model).items() if name.endswith(READERS)}
    feed_inputs(model, readers, batches, accumulate)
    return peaks


def column_peak(*linears) -> torch.Tensor:
    """max |W_:,j| over the rows of all ``linears`` (which read the same input)."""
    return torch.stack([linear.weight.detach().abs().amax(0) for linear in linears]).amax(0)


def ffn_input_norm(layer):
    """The norm whose output gate|up read: Gemma 3's pre_feedforward_layernorm (its post_attention_layernorm
    normalises the attention's output before the residual add), the post-attention norm of the Llama family."""
    norm = getattr(layer, "pre_feedforward_layernorm", None)
    return norm if norm is not None else layer.post_attention_layernorm


def fold_into_norm(norm, linears, input_peak: torch.Tensor, alpha: float, other_readers=(),
                   offset: float = 0.0) -> float:
    """Divide the RMSNorm's scale by s and multiply the columns of the ``linears`` it feeds by s; returns max s.
    ``other_readers`` (linears that also read the norm's output but are not quantized, such as a power
    adapter's first projection) take the same column scales without setting them. ``offset`` 1 is a norm that
    scales by 1 + weight (Gemma3RMSNorm): its weight becomes (1 + w) / s - 1, computed in float64 so the one
    rounding is to the stored dtype."""
    scales = migration_scales(input_peak, column_peak(*linears), alpha)
    if offset:
        weight = norm.weight
        weight.copy_(((weight.double() + offset) / scales.double() - offset).to(weight.dtype))
    else:
        norm.weight.div_(scales)
    for linear in (*linears, *other_readers):
        linear.weight.mul_(scales[None, :])
    return float(scales.max())


@torch.no_grad()
def smooth_model(model, peaks: dict[str, torch.Tensor], config: SmoothConfig) -> dict[str, float]:
    """Apply the migration in place; returns, per site, the largest scale applied (the strongest outlier)."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    offset = 1.0 if cfg.model_type in OFFSET_NORMS else 0.0
    largest: dict[str, list[float]] = {site: [] for site in config.sites}
    for index, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        prefix = f"model.layers.{index}."
        if "qkv" in config.sites:
            largest["qkv"].append(fold_into_norm(layer.input_layernorm, (attn.q_proj, attn.k_proj, attn.v_proj),
                                                 peaks[prefix + "self_attn.q_proj"], config.alpha, offset=offset))
        if "gate_up" in config.sites:
            adapter = getattr(mlp, "power_adapter", None)  # a power gate reads the FFN input too
            largest["gate_up"].append(fold_into_norm(ffn_input_norm(layer), (mlp.gate_proj, mlp.up_proj),
                                                     peaks[prefix + "mlp.gate_proj"], config.alpha,
                                                     (adapter.proj1,) if adapter is not None else (), offset))
        if "down" in config.sites:
            scales = migration_scales(peaks[prefix + "mlp.down_proj"], column_peak(mlp.down_proj), config.alpha)
            mlp.up_proj.weight.div_(scales[:, None])  # rows of up are down's input channels
            if mlp.up_proj.bias is not None:  # Llama mlp_bias: up's output channel j is W_j·x + b_j
                mlp.up_proj.bias.div_(scales)
            mlp.down_proj.weight.mul_(scales[None, :])
            largest["down"].append(float(scales.max()))
        if "o" in config.sites:
            kv_heads = attn.v_proj.out_features // head_dim
            group = attn.o_proj.in_features // attn.v_proj.out_features
            # (Hq*hd,) -> (Hkv, G, hd) -> max over the G query heads sharing each V row -> (Hkv*hd,)
            input_peak = peaks[prefix + "self_attn.o_proj"].reshape(kv_heads, group, head_dim).amax(1).reshape(-1)
            weight_peak = column_peak(attn.o_proj).reshape(kv_heads, group, head_dim).amax(1).reshape(-1)
            scales = migration_scales(input_peak, weight_peak, config.alpha)  # (Hkv*hd,)
            attn.v_proj.weight.div_(scales[:, None])
            if attn.v_proj.bias is not None:  # Qwen2 / Llama attention_bias: V's output row j is W_j·x + b_j
                attn.v_proj.bias.div_(scales)
            # (Hkv*hd,) -> (Hkv, 1, hd) -> (Hkv, G, hd) -> (Hq*hd,): each o column takes its V row's scale
            expanded = scales.reshape(kv_heads, 1, head_dim).expand(-1, group, -1).reshape(-1)
            attn.o_proj.weight.mul_(expanded[None, :])
            largest["o"].append(float(scales.max()))
    return {site: round(max(values), 3) for site, values in largest.items() if values}


@register_stage("smooth", SmoothConfig, after=("power",),
                description="SmoothQuant: activation outliers moved into the weights before per-tensor INT8")
def smooth_stage(model, config: SmoothConfig, ctx: BuildContext):
    model.eval()
    if fake_quant.QuantScheme.of(model) is not None:
        raise ValueError("smooth must run before qat: the weights are already on an INT8 grid")
    data = ctx.training_data()
    batches = data.batches(config.calibration_batches, config.batch_size, config.sequence_length, config.seed,
                           "smooth")
    scales = smooth_model(model, input_peaks(model, batches), config)
    ctx.metrics.update({"alpha": config.alpha, "largest_scale": scales}, **stage_metrics(model, ctx.eval_ids()))
    return model
