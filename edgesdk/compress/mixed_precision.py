"""Mixed precision for INT4 builds: which decoder linears stay at 8 bits.

The fused graph multiplies each layer's QKV, O, gate/up and down as one matrix each, so those
are the units. A unit's score is the loss its INT4 rounding adds beyond INT8 rounding, estimated
with the diagonal Fisher information F = E[g²] of the next-token loss on calibration text:

    gain(unit) = ½ · Σ F ⊙ ((Q4(W) − W)² − (Q8(W) − W)²)

(the second-order loss model of optimal brain damage, LeCun et al. 1990, used for bit allocation
as in HAWQ, Dong et al. 2019, and FIT, Zandonati et al. 2023). Units are then taken by gain per
extra byte (half a byte per weight) until ``fraction`` of the decoder's linear weights is at
8 bits, a greedy knapsack. llama.cpp's Q4_K_M makes the same trade with a fixed rule (half of
the V and FFN-down matrices at 6 bits); here the model's own sensitivity decides.
"""

from __future__ import annotations

import torch

from edgesdk.compress import fake_quant
from edgesdk.compress.prune import fisher_diagonal
from edgesdk.export.fused_graph import UNIT_LINEARS


def unit_linears(model) -> dict[str, list[str]]:
    """Fused unit (``layers.{i}.attn.qkv`` …) -> the qualified names of its decoder linears."""
    return {f"layers.{i}.{unit}": [f"model.layers.{i}.{module}" for module in modules]
            for i in range(len(model.model.layers)) for unit, modules in UNIT_LINEARS.items()}


def rounding_gains(model, fisher: dict[str, torch.Tensor], block_size: int) -> dict[str, float]:
    """Per unit: the Fisher-weighted loss INT4 rounding adds over INT8 rounding (block scales)."""
    linears = fake_quant.decoder_linears(model)
    gains = {}
    for unit, names in unit_linears(model).items():
        total = 0.0
        for name in names:
            weight = linears[name].weight.detach()
            error4 = fake_quant.quantize_weight(weight, 4, "block", block_size) - weight
            error8 = fake_quant.quantize_weight(weight, 8, "block", block_size) - weight
            total += 0.5 * float((fisher[name] * (error4.pow(2) - error8.pow(2))).sum())
        gains[unit] = total
    return gains


def choose_units(model, gains: dict[str, float], fraction: float) -> list[str]:
    """The units to keep at 8 bits: by gain per weight until ``fraction`` of all decoder linear
    weights is spent."""
    linears = fake_quant.decoder_linears(model)
    units = unit_linears(model)
    sizes = {unit: sum(linears[name].weight.numel() for name in names) for unit, names in units.items()}
    budget = fraction * sum(sizes.values())
    chosen, spent = [], 0
    for unit in sorted(gains, key=lambda u: gains[u] / sizes[u], reverse=True):
        if gains[unit] > 0 and spent + sizes[unit] <= budget:
            chosen.append(unit)
            spent += sizes[unit]
    return chosen


def eight_bit_linears(model, batches: list[torch.Tensor], fraction: float, block_size: int,
                      progress: bool = False) -> tuple[tuple[str, ...], list[str], dict[str, float]]:
    """Measure on ``batches`` and choose: (the linears at 8 bits, their units, every unit's gain)."""
    if fraction <= 0:
        return (), [], {}
    gains = rounding_gains(model, fisher_diagonal(model, batches, progress), block_size)
    units = choose_units(model, gains, fraction)
    names = unit_linears(model)
    return tuple(sorted(name for unit in units for name in names[unit])), units, gains
