"""Build stage ``sparsify``: block sparsity for bandwidth-bound decode (seed 004 §5.1).

Batch-1 decode reads every weight once per token, so on a GPU its speed follows the bytes read.
Zeroing whole ``block x block`` tiles (32 x 32 by default, the profile's ``sparsity_block``) lets
the block-sparse kernels (``edgesdk.kernels``) skip them: unlike 2:4 sparsity, which current
NVIDIA stacks do not turn into decode speed (reference/anchors-mission.md §4), a dropped block is
never loaded.

* Block importance is either the Fisher saliency ½·E[g²]·w² summed over the block (the pruning
  stage's measure; LeCun et al. 1990 with the Fisher for the Hessian), which estimates the loss
  change of removing it and so compares across layers, or Wanda's |W|·‖x‖ (Sun et al. 2023,
  "A Simple and Effective Pruning Approach for LLMs"), normalised per weight so its global
  ranking compares how skewed each weight's blocks are rather than their absolute scale.
* Per-weight densities come from one global threshold over all decoder linears (the importance
  distribution decides, not a table); each weight keeps at least ``min_density`` of its blocks.
* Masks travel in ``model.config.edgesdk_sparsity`` (one string of 0/1 per block row); later
  stages keep masked blocks at exactly zero (:func:`hold_masks`), and the exporter stores only
  the non-zero blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from edgesdk.build.registry import BuildContext, register_stage
from edgesdk.compress import fake_quant
from edgesdk.compress.measure import stage_metrics

SPARSITY_KEY = "edgesdk_sparsity"
IMPORTANCE = ("fisher", "wanda")


@dataclass(frozen=True)
class SparsifyConfig:
    """Block-sparsity settings."""

    density: float = 0.85  # fraction of decoder-linear blocks kept (SmolLM2: +1.1 % ppl after distill, README)
    block_size: int | None = None  # block edge; None = the target profile's sparsity_block
    importance: str = "fisher"  # fisher (loss-change estimate, comparable across layers) | wanda
    min_density: float = 0.25  # no weight keeps fewer blocks than this (a starved layer breaks the model)
    calibration_batches: int = 16  # batches of gradients / activations (16 x 2 x 256 = 8k tokens)
    batch_size: int = 2  # sequences per calibration batch (memory)
    sequence_length: int = 256  # tokens per sequence
    seed: int = 3  # batch sampling (differs from QAT, pruning and distillation)

    def __post_init__(self):
        if not 0.0 < self.density <= 1.0:
            raise ValueError(f"density must be in (0, 1], got {self.density}")
        if not 0.0 < self.min_density <= 1.0:
            raise ValueError(f"min_density must be in (0, 1], got {self.min_density}")
        if self.importance not in IMPORTANCE:
            raise ValueError(f"importance must be one of {', '.join(IMPORTANCE)}, got '{self.importance}'")
        if self.block_size is not None and self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")


def block_sums(values: torch.Tensor, block: int) -> torch.Tensor:
    """(N, K) element scores -> (ceil(N/b), ceil(K/b)) block totals (edges zero-padded)."""
    rows, cols = values.shape
    padded = F.pad(values, (0, -cols % block, 0, -rows % block))
    grid = padded.reshape(padded.shape[0] // block, block, padded.shape[1] // block, block)  # (Nb, b, Kb, b)
    return grid.sum(dim=(1, 3))


def expand_mask(mask: torch.Tensor, shape: tuple[int, int], block: int) -> torch.Tensor:
    """(Nb, Kb) block mask -> (N, K) element mask."""
    full = mask.repeat_interleave(block, 0).repeat_interleave(block, 1)  # (Nb*b, Kb*b)
    return full[: shape[0], : shape[1]]


@torch.no_grad()
def input_norms(model, linears: dict, batches: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """‖x_k‖₂ over all calibration tokens for every input channel k of every decoder linear."""
    sums = {name: torch.zeros(linear.in_features) for name, linear in linears.items()}

    def hook(name):
        def accumulate(module, args):
            x = args[0].detach().float()
            sums[name] += x.reshape(-1, x.shape[-1]).pow(2).sum(0)  # (tokens, K) -> (K,)
        return accumulate

    handles = [linear.register_forward_pre_hook(hook(name)) for name, linear in linears.items()]
    try:
        for batch in batches:
            model(batch)
    finally:
        for handle in handles:
            handle.remove()
    return {name: total.sqrt() for name, total in sums.items()}


def block_importance(model, batches: list[torch.Tensor], config: SparsifyConfig, block: int,
                     progress: bool = False) -> dict[str, torch.Tensor]:
    """Per decoder linear, a (Nb, Kb) importance per block (see module docstring)."""
    linears = fake_quant.decoder_linears(model)
    if config.importance == "fisher":
        from edgesdk.compress.prune import fisher_diagonal

        fisher = fisher_diagonal(model, batches, progress)
        return {name: block_sums(0.5 * fisher[name] * linear.weight.detach().pow(2), block)
                for name, linear in linears.items()}
    norms = input_norms(model, linears, batches)
    scores = {}
    for name, linear in linears.items():
        blocks = block_sums(linear.weight.detach().abs() * norms[name][None, :], block)
        scores[name] = blocks / blocks.mean().clamp_min(1e-30)
    return scores


def plan_masks(scores: dict[str, torch.Tensor], config: SparsifyConfig) -> dict[str, torch.Tensor]:
    """Blocks each weight keeps: one global threshold, then each weight's ``min_density`` floor."""
    flat = torch.cat([s.flatten() for s in scores.values()])
    keep_total = max(1, int(round(config.density * flat.numel())))
    threshold = flat.sort(descending=True).values[keep_total - 1]
    masks = {}
    for name, s in scores.items():
        mask = s >= threshold
        floor = math.ceil(config.min_density * s.numel())
        if int(mask.sum()) < floor:
            mask = torch.zeros_like(mask)
            mask.view(-1)[s.flatten().topk(floor).indices] = True
        masks[name] = mask
    return masks


def encode_mask(mask: torch.Tensor) -> list[str]:
    return ["".join("1" if v else "0" for v in row.tolist()) for row in mask]


def decode_mask(rows: list[str]) -> torch.Tensor:
    return torch.tensor([[c == "1" for c in row] for row in rows], dtype=torch.bool)


def recorded_masks(model) -> tuple[int, dict[str, torch.Tensor]] | None:
    """(block, {linear name: (Nb, Kb) bool}) recorded by this stage, or None."""
    stored = getattr(model.config, SPARSITY_KEY, None)
    if not stored:
        return None
    return int(stored["block"]), {name: decode_mask(rows) for name, rows in stored["masks"].items()}


@torch.no_grad()
def apply_masks(model) -> None:
    """Zero every masked block of the decoder linears (in place)."""
    recorded = recorded_masks(model)
    if recorded is None:
        return
    block, masks = recorded
    linears = fake_quant.decoder_linears(model)
    for name, mask in masks.items():
        weight = linears[name].weight
        weight.mul_(expand_mask(mask, tuple(weight.shape), block).to(weight.dtype))


def hold_masks(model) -> list:
    """Keep masked blocks at zero while training: their gradients are zeroed (AdamW without weight
    decay then never moves them). Returns hook handles; remove them when training ends."""
    recorded = recorded_masks(model)
    if recorded is None:
        return []
    block, masks = recorded
    linears = fake_quant.decoder_linears(model)
    handles = []
    for name, mask in masks.items():
        weight = linears[name].weight
        if not weight.requires_grad:  # frozen: nothing can move it
            continue
        element_mask = expand_mask(mask, tuple(weight.shape), block).to(weight.dtype)
        handles.append(weight.register_hook(lambda grad, m=element_mask: grad * m))
    return handles


def density_summary(masks: dict[str, torch.Tensor]) -> dict:
    kept = sum(int(m.sum()) for m in masks.values())
    total = sum(m.numel() for m in masks.values())
    return {"density": round(kept / total, 4), "per_weight": {n: round(float(m.float().mean()), 4)
                                                              for n, m in masks.items()}}


@register_stage("sparsify", SparsifyConfig, after=("qat", "prune"),
                description="block sparsity (Fisher or Wanda block importance, global density)")
def sparsify_stage(model, config: SparsifyConfig, ctx: BuildContext):
    model.eval()
    block = config.block_size or ctx.profile.sparsity_block
    scheme = fake_quant.reattach(model)  # importance measured on the quantized model, as for pruning
    batches = ctx.training_data().batches(config.calibration_batches, config.batch_size, config.sequence_length,
                                          config.seed)
    scores = block_importance(model, batches, config, block, ctx.progress)
    if scheme is not None:
        fake_quant.detach(model, bake=False)
    masks = plan_masks(scores, config)
    setattr(model.config, SPARSITY_KEY, {"block": block, "importance": config.importance,
                                         "masks": {name: encode_mask(m) for name, m in masks.items()}})
    apply_masks(model)
    if scheme is not None:  # a row whose largest weight was dropped gets a finer grid: re-bake
        fake_quant.attach(model, scheme)
        fake_quant.detach(model, bake=True)
        apply_masks(model)
    summary = density_summary(masks)
    ctx.metrics.update({"block": block, "density": summary["density"], "density_per_weight": summary["per_weight"],
                        "calibration_tokens": sum(int(b.numel()) for b in batches)},
                       **stage_metrics(model, ctx.eval_ids()))
    return model
