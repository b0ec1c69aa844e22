"""Build stage ``sparsify``: block sparsity for bandwidth-bound decode (seed 004 §5.1).

Batch-1 decode reads every weight once per token, so on a GPU its speed follows the bytes read.
Zeroing whole ``block x block`` tiles (32 x 32 by default, the profile's ``sparsity_block``) lets
the block-sparse kernels (``edgesdk.kernels``) skip them: unlike 2:4 sparsity, which current
NVIDIA stacks do not turn into decode speed (reference/anchors-mission.md §4), a dropped block is
never loaded.

* Within a weight, blocks are ranked by Wanda's |W|·‖x‖ summed over the block (Sun et al. 2023,
  "A Simple and Effective Pruning Approach for LLMs": the output error of dropping a weight on
  the calibration inputs) or by the Fisher saliency ½·E[g²]·w² (the pruning stage's measure).
* How many blocks each weight keeps comes from measurement (``allocation: sensitivity``): each
  weight in turn loses its ``probe_fraction`` least important blocks and the KL of the model's
  next-token distributions to the intact model is its cost c_w; with costs growing as the square
  of the fraction removed, the densities that minimise the summed cost for the global density are
  r_w ∝ n_w / c_w (:func:`allocate_densities`). On SmolLM2-135M a single threshold over Fisher
  saliencies (``allocation: global``, the seed's one-shot ranking) put most of the cut on the
  query projections, whose saliency is small because softmax gradients are, and cost +330 %
  perplexity at density 0.9 against +108 % for the measured allocation with refitting
  (tests/benchmarks/test_block_sparsity_quality.py).
* Before ranking (``reorder``, opt-in), channels can be reordered so that weights of low
  importance share blocks (TETRIS, Ji et al. 2018, "TETRIS: TilE-matching the TRemendous
  Irregular Sparsity"): the residual stream's channels once for the whole model and each layer's
  FFN channels, both by their summed Wanda importance (:func:`reorder_channels`). A permutation
  commutes with RMSNorm and with every linear, so the model computes exactly what it did; only
  the blocks change.
* The kept blocks are then refit to the dense outputs (``reconstruct``): per block row the kept
  input columns S are shared, so w_S = (w·H[:, S])·H[S, S]⁻¹ with H = X·Xᵀ from the calibration
  inputs (the least-squares problem SparseGPT solves column-wise; Frantar & Alistarh 2023).
* Masks travel in ``model.config.edgesdk_sparsity`` (one string of 0/1 per block row); later
  stages keep masked blocks at exactly zero (:func:`hold_masks`), and the exporter stores only
  the non-zero blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from edgesdk.build.checkpoint import said_sets
from edgesdk.build.registry import BuildContext, register_stage
from edgesdk.compress import fake_quant
from edgesdk.compress.measure import stage_metrics
from edgesdk.compress.structure import LAYERS_KEY
from edgesdk.errors import BuildError
from edgesdk.power.adapter import CONFIG_KEY as POWER_KEY

SPARSITY_KEY = "edgesdk_sparsity"
IMPORTANCE = ("fisher", "wanda")
ALLOCATION = ("sensitivity", "global")


@dataclass(frozen=True)
class SparsifyConfig:
    """Block-sparsity settings."""

    density: float = 0.95  # fraction of decoder-linear blocks kept (SmolLM2: see the README block-sparsity table)
    block_size: int | None = None  # block edge; None = the target profile's sparsity_block
    importance: str = "wanda"  # ranks blocks within a weight: wanda (|W|·‖x‖, local output error) | fisher
    allocation: str = "sensitivity"  # per-weight density: sensitivity (measured) | global (floors, then one ranking)
    probe_fraction: float = 0.3  # sensitivity: share of a weight's blocks dropped to measure its cost
    probe_batches: int = 2  # sensitivity: batches each probe is scored on (drawn beyond calibration_batches if more)
    min_density: float = 0.25  # no weight keeps fewer blocks than this (a starved layer breaks the model)
    reconstruct: bool = True  # refit kept blocks to the dense outputs (least squares on calibration inputs)
    calibration_batches: int = 16  # batches of gradients / activations (16 x 2 x 256 = 8k tokens)
    batch_size: int = 2  # sequences per calibration batch (memory)
    sequence_length: int = 256  # tokens per sequence
    seed: int = 3  # batch sampling (differs from QAT, pruning and distillation)
    reorder: bool = False  # permute hidden and FFN channels so unimportant weights share blocks (TETRIS; README)

    def __post_init__(self):
        if not 0.0 < self.density <= 1.0:
            raise ValueError(f"density must be in (0, 1], got {self.density}")
        if not 0.0 < self.min_density <= 1.0:
            raise ValueError(f"min_density must be in (0, 1], got {self.min_density}")
        if self.density < self.min_density:
            raise ValueError(f"density {self.density} is below min_density {self.min_density}, the share of blocks "
                             f"every weight keeps, so the model would keep {self.min_density}; lower min_density too")
        for name in ("calibration_batches", "probe_batches", "batch_size", "sequence_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.importance not in IMPORTANCE:
            raise ValueError(f"importance must be one of {', '.join(IMPORTANCE)}, got '{self.importance}'")
        if self.importance == "fisher" and self.sequence_length < 2:  # no next token: no gradient, every score 0
            raise ValueError(f"importance fisher needs sequence_length >= 2 (its squared gradients come from "
                             f"next-token targets), got {self.sequence_length}; or use importance wanda")
        if self.allocation not in ALLOCATION:
            raise ValueError(f"allocation must be one of {', '.join(ALLOCATION)}, got '{self.allocation}'")
        if not 0.0 < self.probe_fraction < 1.0:
            raise ValueError(f"probe_fraction must be in (0, 1), got {self.probe_fraction}")
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
def feed_inputs(model, modules: dict, batches: list[torch.Tensor], on_input) -> None:
    """Run ``batches`` through ``model``, calling ``on_input(name, x)`` with every listed module's
    input as (tokens, K)."""
    def hook(name):
        def call(module, args):
            on_input(name, args[0].detach().reshape(-1, args[0].shape[-1]))  # (B, S, K) -> (B*S, K)
        return call

    handles = [module.register_forward_pre_hook(hook(name)) for name, module in modules.items()]
    try:
        for batch in batches:
            model(batch)
    finally:
        for handle in handles:
            handle.remove()


def input_norms(model, linears: dict, batches: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """‖x_k‖₂ over all calibration tokens for every input channel k of every decoder linear."""
    sums = {name: torch.zeros(linear.in_features) for name, linear in linears.items()}

    def accumulate(name, x):
        sums[name] += x.float().pow(2).sum(0)

    feed_inputs(model, linears, batches, accumulate)
    return {name: total.sqrt() for name, total in sums.items()}


def wanda(linear, norms: torch.Tensor) -> torch.Tensor:
    """Per-weight importance |W|·‖x‖ (N, K) from the input norms (K,) (Sun et al. 2023)."""
    return linear.weight.detach().abs() * norms[None, :]


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
        blocks = block_sums(wanda(linear, norms[name]), block)
        scores[name] = blocks / blocks.mean().clamp_min(1e-30)
    return scores


def channel_keys(model, batches: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Summed Wanda importance |W|·‖x‖ of every residual-stream channel (D,) and of every layer's
    FFN channels [(F_l,)]: what the weights reading and writing that channel lose if it goes."""
    linears = fake_quant.decoder_linears(model)
    norms = input_norms(model, linears, batches)

    def importance(name: str) -> torch.Tensor:  # (N, K)
        return wanda(linears[name], norms[name])

    hidden = torch.zeros(model.config.hidden_size)
    ffn = []
    for index in range(len(model.model.layers)):
        prefix = f"model.layers.{index}."
        for kind in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            hidden += importance(prefix + kind).sum(0)  # readers: one column per channel
        for kind in ("self_attn.o_proj", "mlp.down_proj"):
            hidden += importance(prefix + kind).sum(1)  # writers: one row per channel
        ffn.append(importance(prefix + "mlp.down_proj").sum(0) + importance(prefix + "mlp.gate_proj").sum(1)
                   + importance(prefix + "mlp.up_proj").sum(1))
    return hidden, ffn


def _permute(parameter: torch.Tensor | None, order: torch.Tensor, dim: int) -> None:
    if parameter is not None:
        parameter.data = parameter.data.index_select(dim, order).contiguous()


# a decoder layer's norms over the residual stream's channels. Llama, Qwen, SmolLM3: the first two (before attention
# and before the FFN); Gemma 3 (transformers' Gemma3DecoderLayer): post_attention_layernorm normalises the
# attention's output, pre_feedforward_layernorm the FFN's input and post_feedforward_layernorm its output. A norm
# left out keeps its weights in the old channel order and scales the wrong channels (a tiny Gemma 3's logits moved
# by 2.0). Query / key norms (Qwen3, Gemma 3) act within a head and are not permuted.
HIDDEN_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                "post_feedforward_layernorm")


@torch.no_grad()
def permute_hidden(model, order: torch.Tensor) -> None:
    """Reorder the residual stream's channels (D,) everywhere they appear: embedding (and an untied
    LM head), every RMSNorm weight over the stream (:data:`HIDDEN_NORMS`: Gemma 3's layers have four, the
    pre- and post-FFN norms beside Llama's two), the columns of the linears that read the stream and the
    rows of those that write it. The logits are unchanged."""
    inner = model.model
    tied = fake_quant.is_tied(model)
    _permute(inner.embed_tokens.weight, order, 1)
    if not tied:
        _permute(model.lm_head.weight, order, 1)
    _permute(inner.norm.weight, order, 0)
    for layer in inner.layers:
        for name in HIDDEN_NORMS:
            norm = getattr(layer, name, None)
            if norm is not None:
                _permute(norm.weight, order, 0)
        for module in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                       layer.mlp.gate_proj, layer.mlp.up_proj):
            _permute(module.weight, order, 1)
        for module in (layer.self_attn.o_proj, layer.mlp.down_proj):
            _permute(module.weight, order, 0)
            _permute(module.bias, order, 0)


@torch.no_grad()
def permute_ffn(layer, order: torch.Tensor) -> None:
    """Reorder one layer's FFN channels (F,): rows of gate and up, columns of down. Exact."""
    for module in (layer.mlp.gate_proj, layer.mlp.up_proj):
        _permute(module.weight, order, 0)
        _permute(module.bias, order, 0)
    _permute(layer.mlp.down_proj.weight, order, 1)


def reorder_channels(model, batches: list[torch.Tensor]) -> None:
    """Sort the residual-stream channels and each layer's FFN channels by importance, in place, so
    the least important weights of every matrix gather in the same blocks (TETRIS's reordering
    with one sort per shared dimension instead of its alternating search). A pruned model's per-layer record
    (structure.py ``edgesdk_layers``: the teacher's FFN channel at each position) is permuted with the channels."""
    if getattr(model.config, POWER_KEY, None):
        raise BuildError("sparsify.reorder cannot run on a model with power adapters (they read the "
                         "hidden channels in their own order)", "run sparsify without reorder, or before power")
    scheme = fake_quant.QuantScheme.of(model)
    if scheme is not None and scheme.groups_hidden_channels:
        raise BuildError(
            f"sparsify.reorder cannot run on a model quantized in blocks along the hidden channels "
            f"(qat.granularity={scheme.granularity}, qat.embedding_bits={scheme.embedding_bits}): a permutation "
            "regroups the channels sharing a scale, so the re-baked weights would compute something else",
            "set qat.granularity=channel and qat.embedding_bits=null (the jetson recipes' grid), or run sparsify "
            "without reorder")
    hidden, ffn = channel_keys(model, batches)
    permute_hidden(model, hidden.argsort())
    orders = [keys.argsort() for keys in ffn]
    for layer, order in zip(model.model.layers, orders, strict=True):
        permute_ffn(layer, order)
    records = getattr(model.config, LAYERS_KEY, None)
    if records:  # a pruned model's record names the teacher's FFN channel at each position: it moves with them
        setattr(model.config, LAYERS_KEY, [{**record, "ffn": [record["ffn"][p] for p in order.tolist()]}
                                           for record, order in zip(records, orders, strict=True)])


def keep_top(scores: torch.Tensor, count: int) -> torch.Tensor:
    """(Nb, Kb) mask of the ``count`` highest-scoring blocks."""
    mask = torch.zeros_like(scores, dtype=torch.bool)
    mask.view(-1)[scores.flatten().topk(max(0, min(count, scores.numel()))).indices] = True
    return mask


@torch.no_grad()
def weight_sensitivity(model, scores: dict[str, torch.Tensor], batches: list[torch.Tensor], block: int,
                       fraction: float, progress: bool = False) -> dict[str, float]:
    """Per decoder linear, the mean KL(model || model with that weight's ``fraction`` least important
    blocks dropped, one at least) over ``batches``: what losing blocks there really costs, all else intact.

    A whole number of blocks drops a share that can differ from ``fraction`` (one of 2 blocks at 0.1 is 0.5, 5 of 18
    at 0.3 is 0.28), so each cost is scaled to ``fraction`` under :func:`allocate_densities`'s model (cost growing as
    the square of the share dropped): unscaled, the allocation compared costs measured at different shares as if
    they were measured at one, and spared the weights of few blocks (25 times the cost of one of 2 blocks at 0.1)."""
    from tqdm import tqdm

    linears = fake_quant.decoder_linears(model)
    # (B, S, V) each, float32: a build with bfloat16 references and float32 Hessians measured worse
    # (SmolLM2 held-out perplexity after sparsify 45.5 against 39.4) and its peak memory was no lower
    reference = [F.log_softmax(model(batch).logits.float(), dim=-1) for batch in batches]
    costs = {}
    for name in tqdm(list(scores), desc="sensitivity", disable=not progress, unit="weight"):
        weight = linears[name].weight
        saved = weight.detach().clone()
        # at least one block: a probe dropping none measured cost 0, and the allocation took the weight for free
        # and cut it to min_density unmeasured (a weight of 4 blocks at probe_fraction 0.1)
        blocks = scores[name].numel()
        dropped = max(1, round(fraction * blocks))
        keep = keep_top(scores[name], blocks - dropped)
        weight.data.mul_(expand_mask(keep, tuple(weight.shape), block).to(weight.dtype))
        total = 0.0
        for ref, batch in zip(reference, batches, strict=True):
            logp = F.log_softmax(model(batch).logits.float(), dim=-1)
            total += float(F.kl_div(logp, ref, log_target=True, reduction="none").sum(-1).mean())
        weight.data.copy_(saved)
        costs[name] = total / len(batches) * (fraction * blocks / dropped) ** 2  # at the share ``fraction``
    return costs


def allocate_densities(costs: dict[str, float], sizes: dict[str, int], config: SparsifyConfig) -> dict[str, float]:
    """Per-weight densities minimising the summed cost for the global density.

    Model: dropping a fraction r of weight w costs c_w·(r/p)² (c_w measured at r = p). With
    sum_w r_w·n_w fixed, the Lagrange condition gives r_w = λ·n_w / c_w; λ is found by bisection
    and each r_w clipped to [0, 1 - min_density].
    """
    total = sum(sizes.values())
    target = (1.0 - config.density) * total
    limit = 1.0 - config.min_density

    def removed(lam: float) -> dict[str, float]:
        return {n: min(limit, lam * sizes[n] / max(costs[n], 1e-12)) for n in costs}

    low, high = 0.0, 1.0
    while sum(r * sizes[n] for n, r in removed(high).items()) < target and high < 1e12:
        high *= 2
    for _ in range(60):
        middle = (low + high) / 2
        if sum(r * sizes[n] for n, r in removed(middle).items()) < target:
            low = middle
        else:
            high = middle
    return {n: 1.0 - r for n, r in removed(high).items()}


def floor_blocks(min_density: float, blocks: int) -> int:
    """The fewest blocks a weight of ``blocks`` blocks keeps under ``min_density``: ceil(min_density x blocks),
    computed so that float error does not add a block (0.55 x 100 is 55.00000000000001 in binary floating point,
    whose plain ceil is 56)."""
    return min(blocks, math.ceil(round(min_density * blocks, 9)))


def plan_masks_by_density(scores: dict[str, torch.Tensor], densities: dict[str, float],
                          min_density: float = 0.0, total: int | None = None) -> dict[str, torch.Tensor]:
    """Each weight's ``densities[name]`` share of its best blocks, rounded so that the blocks kept over all
    weights are ``total`` (by default the allocation's total, rounded; :func:`_round_blocks`), one at least and
    never fewer than its ``min_density`` floor (:func:`floor_blocks`): rounding 0.25 x 10 blocks to 2 would starve
    it below the floor the allocation clipped it to."""
    counts = _round_blocks({n: densities[n] * s.numel() for n, s in scores.items()},
                           {n: max(1, floor_blocks(min_density, s.numel())) for n, s in scores.items()},
                           {n: s.numel() for n, s in scores.items()}, total)
    return {n: keep_top(s, counts[n]) for n, s in scores.items()}


def _round_blocks(wanted: dict[str, float], floors: dict[str, int], sizes: dict[str, int],
                  total: int | None = None) -> dict[str, int]:
    """Per weight, its ``wanted`` (fractional) block count as a whole count between its floor and its size, the
    total as near ``total`` (by default the wanted total, rounded) as the floors allow: each weight is rounded down
    and those nearest their next block go up until the total is reached (the largest-remainder method, as the prune
    stage rounds FFN widths); where floors rounded up (ceil(0.3 x 32) = 10 for 9.6 wanted) took the total past it,
    the weights above their floors nearest their lower block give one back.
    Rounding each weight on its own missed the density by up to half a block per weight: 30 weights of 108 blocks
    at density 0.95 (102.6 each) kept 0.9537, and weights of 4 blocks at density 0.9 (3.6 each) kept them all."""
    counts = {n: min(sizes[n], max(floors[n], math.floor(round(w, 9)))) for n, w in wanted.items()}
    missing = (round(sum(wanted.values())) if total is None else total) - sum(counts.values())
    for n in sorted(wanted, key=lambda n: counts[n] - wanted[n]):  # largest remainder first; stable by name order
        if missing <= 0:
            break
        if wanted[n] > counts[n] and counts[n] < sizes[n]:
            counts[n] += 1
            missing -= 1
    while missing < 0:  # floors past the total: smallest remainder gives back first
        above = sorted((n for n in wanted if counts[n] > floors[n]), key=lambda n: wanted[n] - counts[n])
        for n in above[:-missing]:
            counts[n] -= 1
            missing += 1
        if not above:
            break
    return counts


def budget_blocks(blocks: dict[str, int], density: float) -> int:
    """The blocks kept of all ``blocks`` (per weight name) at ``density``: one at least."""
    return max(1, int(round(density * sum(blocks.values()))))


def check_floor_budget(blocks: dict[str, int], config: SparsifyConfig, terms: str = "cli") -> int:
    """The blocks ``allocation: global`` keeps (``density`` of all ``blocks``, per weight name), or a BuildError
    where the ``min_density`` floors alone (:func:`floor_blocks`, rounded up per weight) need more: the config's
    ``density >= min_density`` check cannot see the rounding, and keeping the floors would deliver a density
    above the one asked, under either allocation (``sensitivity`` keeps every weight's floor too,
    :func:`plan_masks_by_density`). ``terms``: whose names the fix gives the override in, ``edgesdk build``'s (``--set``)
    or build_bundle()'s (``overrides=[...]``)."""
    total = sum(blocks.values())
    keep_total = budget_blocks(blocks, config.density)
    needed = sum(floor_blocks(config.min_density, count) for count in blocks.values())
    if needed > keep_total:
        least = math.ceil(needed / total * 1e4) / 1e4
        raise BuildError(
            f"sparsify.density {config.density} keeps {keep_total} of the model's {total} blocks, but the "
            f"min_density floors alone need {needed} ({needed / total:.4f} of all blocks: "
            f"ceil({config.min_density} x blocks) per weight)",
            f"raise sparsify.density to at least {least} ({said_sets(terms, f'sparsify.density={least}')}) or lower "
            "sparsify.min_density")
    return keep_total


def block_counts(model, block: int) -> dict[str, int]:
    """Per decoder linear, its number of ``block x block`` blocks (edges padded, as :func:`block_sums` pads)."""
    return {name: -(-linear.weight.shape[0] // block) * -(-linear.weight.shape[1] // block)
            for name, linear in fake_quant.decoder_linears(model).items()}


def plan_masks(scores: dict[str, torch.Tensor], config: SparsifyConfig) -> dict[str, torch.Tensor]:
    """Blocks each weight keeps under ``allocation: global``: the ``density`` share of all blocks overall, each
    weight's ``min_density`` floor (:func:`floor_blocks`, its best blocks) taken out of that budget first and
    what remains given to the highest-scoring blocks of any weight.

    The floors come out of the budget, as in ModelOpt's and SparseGPT-style global allocation where the asked
    density is the density delivered: added on top of the global ranking they kept more than asked (density
    0.7 gave 0.79 on SmolLM2-135M with Fisher scores, whose query projections rank low everywhere). A density
    whose budget cannot hold the floors alone (ceil per weight can exceed ``min_density`` overall) is refused.

    The blocks are picked by rank (``topk``), not by a score threshold: a threshold keeps every block tied with
    the last one kept, so equal scores (all-zero blocks score 0 under either measure) kept far more blocks than
    asked, up to all of them. The prune stage breaks equal saliencies by rank for the same reason."""
    keep_total = check_floor_budget({name: s.numel() for name, s in scores.items()}, config)
    floors = {name: floor_blocks(config.min_density, s.numel()) for name, s in scores.items()}
    needed = sum(floors.values())
    masks = {name: keep_top(s, floors[name]) for name, s in scores.items()}
    # the rest of the budget, by rank over every block not already kept as a floor
    flat = torch.cat([s.flatten().masked_fill(masks[name].flatten(), -math.inf) for name, s in scores.items()])
    chosen = torch.zeros(flat.numel(), dtype=torch.bool)
    chosen[flat.topk(keep_total - needed).indices] = True
    start = 0
    for name, s in scores.items():
        masks[name] = masks[name] | chosen[start:start + s.numel()].reshape(s.shape)
        start += s.numel()
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


def input_hessians(model, linears: dict, batches: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """H = Σ x xᵀ over calibration tokens for the input of every decoder linear, (K, K) float64.
    Linears reading the same tensor (Q, K, V; gate, up) share one matrix."""
    shared: dict[str, str] = {}
    for name in linears:
        layer, kind = name.rsplit(".", 1)
        source = {"q_proj": "k_proj", "v_proj": "k_proj", "up_proj": "gate_proj"}.get(kind, kind)
        shared[name] = f"{layer}.{source}"
    totals: dict[str, torch.Tensor] = {}

    def accumulate(name, x):
        x = x.double()  # SmolLM2's outlier channels reach |x| ~ 1e3: float32 sums of x² lose the small ones
        totals[name] = totals.get(name, 0) + x.T @ x  # (K, K)

    feed_inputs(model, {name: linears[name] for name in set(shared.values())}, batches, accumulate)
    return {name: totals[source] for name, source in shared.items()}


@torch.no_grad()
def reconstruct(model, masks: dict[str, torch.Tensor], hessians: dict[str, torch.Tensor], block: int,
                damping: float = 0.01) -> None:
    """Refit each masked weight's kept blocks, in place, to reproduce its dense outputs.

    For the rows of one block row the kept input columns S are shared, so min ‖w_S X_S − w X‖²
    has the closed form w_S = (w·H[:, S])·H[S, S]⁻¹ with H = X Xᵀ from the calibration inputs,
    damped by ``damping`` × its mean diagonal as SparseGPT does (Frantar & Alistarh 2023, which
    solves the same problem column by column for unstructured masks). A layer-by-layer variant
    correcting upstream error (cross term X_dense X_sparseᵀ) measured far worse on SmolLM2-135M
    (perplexity 767 against 29.7 at density 0.95) and was dropped.
    """
    linears = fake_quant.decoder_linears(model)
    for name, mask in masks.items():
        weight = linears[name].weight
        dense = weight.detach().double()  # (N, K)
        hessian = hessians[name].double()
        hessian = hessian + damping * hessian.diagonal().mean() * torch.eye(hessian.shape[0], dtype=hessian.dtype)
        target = dense @ hessian  # (N, K): w H for every row
        refit = torch.zeros_like(dense)
        columns = expand_mask(mask, tuple(weight.shape), block)  # (N, K) bool
        for start in range(0, weight.shape[0], block):
            keep = columns[start].nonzero().flatten()  # the block row's kept input columns
            if keep.numel() == 0:
                continue
            h_ss = hessian.index_select(0, keep).index_select(1, keep)  # (|S|, |S|)
            rhs = target[start:start + block].index_select(1, keep)  # (b, |S|)
            refit[start:start + block].index_copy_(1, keep, torch.linalg.solve(h_ss, rhs.T).T)  # H_SS symmetric
        weight.copy_(refit.to(weight.dtype))


def plan(model, scores: dict[str, torch.Tensor], batches: list[torch.Tensor], block: int, config: SparsifyConfig,
         progress: bool = False) -> dict[str, torch.Tensor]:
    """The masks under the configured allocation (see module docstring)."""
    if config.allocation == "global":
        return plan_masks(scores, config)
    costs = weight_sensitivity(model, scores, batches[: config.probe_batches], block, config.probe_fraction, progress)
    sizes = {n: s.numel() for n, s in scores.items()}
    densities = allocate_densities(costs, sizes, config)
    # the total the budget check computes from the density: re-rounding the allocation's float sum could miss it
    # by one block where density x blocks ends in a half (147.49999999 for 147.5)
    return plan_masks_by_density(scores, densities, config.min_density, budget_blocks(sizes, config.density))


def check_block_fits(model, block: int, from_profile: str | None = None, terms: str = "cli") -> None:
    """Refuse a block edge that makes a decoder weight one single (padded) block: the density cannot choose among
    its blocks (the whole weight stays or goes), and a block of 100,000 padded each weight to 100,000 x 100,000 (a
    40 GB allocation failing inside torch). A weight shorter than the block on one side only (a KV projection that
    pruning left one group) is padded as the export pads it. ``from_profile``: the name of the target profile whose
    sparsity_block gave the edge (no sparsify.block_size set); ``terms``: whose names the fix gives the override in
    (:func:`check_floor_budget`). Checked before the stage measures anything; build pipelines call it before any
    stage runs."""
    linears = fake_quant.decoder_linears(model)
    if not linears:
        return
    name, longest = min(((name, max(linear.weight.shape)) for name, linear in linears.items()), key=lambda x: x[1])
    if block < longest:
        return
    shape = "x".join(map(str, linears[name].weight.shape))
    given = (f"the target profile {from_profile}'s sparsity_block is {block} (no sparsify.block_size set)"
             if from_profile else f"sparsify.block_size is {block}")
    edge = f"sparsify.block_size={1 << ((longest - 1).bit_length() - 1)}"  # the largest power of two below longest
    # a block-sparse export (export.sparse: the jetson-sparse recipe) stores the profile's sparsity_block blocks and
    # refuses any other block_size (edgesdk.build.pipeline.check_sparse_block): a smaller edge needs it off
    raise BuildError(f"{given}, but the model's decoder weight {name} is {shape}, so one block of {block} x {block} "
                     f"covers it whole and the density cannot choose among its blocks: the block edge must be below "
                     f"{longest}",
                     f"{said_sets(terms, edge)} or less (a power of two); where the recipe exports block-sparse "
                     f"weights (export.sparse, as jetson-sparse does), whose blocks are the profile's sparsity_block, "
                     f"{said_sets(terms, edge, 'export.sparse=false')} (the bundle then runs its weights dense on "
                     f"TensorRT or ONNX Runtime), or use a target profile whose sparsity_block is below {longest}")


@register_stage("sparsify", SparsifyConfig, after=("qat", "prune"),
                description="block sparsity (blocks ranked per weight, measured per-weight density, refit)")
def sparsify_stage(model, config: SparsifyConfig, ctx: BuildContext):
    model.eval()
    block = config.block_size or ctx.profile.sparsity_block
    check_block_fits(model, block, None if config.block_size else ctx.profile.name, ctx.terms)
    check_floor_budget(block_counts(model, block), config, ctx.terms)  # before any calibration: shapes only
    # the sensitivity probes score on their own probe_batches, drawn with the calibration batches (the first
    # calibration_batches of the draw, the same blocks whatever probe_batches is): cut to calibration_batches, a
    # probe_batches above it was silently scored on fewer batches than the config asks
    probes = config.probe_batches if config.allocation == "sensitivity" else 0
    drawn = ctx.training_data().batches(max(config.calibration_batches, probes), config.batch_size,
                                        config.sequence_length, config.seed, "sparsify")
    batches = drawn[: config.calibration_batches]
    if config.reorder:
        reorder_channels(model, batches)
    scheme = fake_quant.reattach(model)  # importance measured on the quantized model, as for pruning
    scores = block_importance(model, batches, config, block, ctx.progress)
    if scheme is not None:
        fake_quant.detach(model, bake=False)
    masks = plan(model, scores, drawn, block, config, ctx.progress)
    if config.reconstruct:
        reconstruct(model, masks, input_hessians(model, fake_quant.decoder_linears(model), batches), block)
    setattr(model.config, SPARSITY_KEY, {"block": block, "importance": config.importance,
                                         "masks": {name: encode_mask(m) for name, m in masks.items()}})
    apply_masks(model)
    if scheme is not None:  # a row whose largest weight was dropped gets a finer grid: re-bake
        fake_quant.attach(model, scheme)
        fake_quant.detach(model, bake=True)
        apply_masks(model)
    summary = density_summary(masks)
    ctx.metrics.update({"block": block, "reorder": config.reorder, "density": summary["density"],
                        "density_per_weight": summary["per_weight"],
                        "calibration_tokens": sum(int(b.numel()) for b in batches),
                        **({"probe_tokens": sum(int(b.numel()) for b in drawn[:probes])} if probes else {})},
                       **stage_metrics(model, ctx.eval_ids()))
    return model
