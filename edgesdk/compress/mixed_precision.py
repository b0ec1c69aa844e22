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

import math

import torch

from edgesdk.build.checkpoint import said_sets
from edgesdk.compress import fake_quant
from edgesdk.compress.prune import fisher_diagonal
from edgesdk.errors import BuildError
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


def unit_sizes(model) -> dict[str, int]:
    """Fused unit -> its number of weights."""
    linears = fake_quant.decoder_linears(model)
    return {unit: sum(linears[name].weight.numel() for name in names) for unit, names in unit_linears(model).items()}


def budget_weights(fraction: float, total: int) -> int:
    """``fraction`` of ``total`` weights, in whole weights: rounded down, except that a product float arithmetic
    left an ulp under a whole number (0.0384 x 40000 = 1535.9999999999998) is that number, so a fraction that is
    exactly a unit's share of the weights fits that unit."""
    return math.floor(fraction * total * (1 + 1e-12))


def check_eight_bit_budget(model, fraction: float, terms: str = "cli") -> None:
    """Refuse, before any calibration, an ``eight_bit_fraction`` smaller than the smallest unit: no unit fits the
    budget, so :func:`choose_units` kept none at 8 bits and the build went on all 4-bit with nothing said (a unit
    is a whole fused matrix; SmolLM2-135M's smallest, a layer's O projection, is 0.31 % of the weights)."""
    if fraction <= 0:
        return
    sizes = unit_sizes(model)
    total = sum(sizes.values())
    unit = min(sizes, key=sizes.__getitem__)
    if sizes[unit] <= budget_weights(fraction, total):
        return
    least = math.ceil(sizes[unit] / total * 1e4) / 1e4
    raise BuildError(f"qat.eight_bit_fraction is {fraction}, but the smallest unit that can stay at 8 bits ({unit}, "
                     f"{sizes[unit]} weights) is {sizes[unit] / total:.4f} of the model's {total} decoder linear "
                     "weights, so no unit fits and every weight would be 4-bit",
                     f"raise qat.eight_bit_fraction to at least {least} ({said_sets(terms, f'qat.eight_bit_fraction={least}')}), or "
                     "set it to 0 for a plain INT4 build")


def choose_units(model, gains: dict[str, float], fraction: float) -> list[str]:
    """The units to keep at 8 bits: by gain per weight until ``fraction`` of all decoder linear
    weights is spent."""
    sizes = unit_sizes(model)
    budget = budget_weights(fraction, sum(sizes.values()))
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
    check_eight_bit_budget(model, fraction)
    gains = rounding_gains(model, fisher_diagonal(model, batches, progress), block_size)
    units = choose_units(model, gains, fraction)
    names = unit_linears(model)
    return tuple(sorted(name for unit in units for name in names[unit])), units, gains
