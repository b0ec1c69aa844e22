"""Build stage ``prune``: structured pruning by Fisher saliency (seed 004 §3).

Importance comes from squared gradients accumulated on training text with the QAT fake
quantization on (seed §3.1 calls the Fisher diagonal E[g^2] the "Hessian trace"). A structure's
saliency is the second-order cost of removing it, sum over its weights of ½·E[g^2]·w^2 (LeCun et
al. 1990, optimal brain damage with the Fisher standing in for the Hessian): the squared
gradient alone would rank a large, rarely-moving weight below a small, noisy one.

* FFN channels (a row of gate and up, a column of down) are ranked globally across layers, so each
  layer's ratio follows the importance distribution (seed §3.2, not a hard-coded table); a layer
  keeps at least ``min_ffn_keep`` (rounded up) and a multiple of ``ffn_multiple`` channels (the
  MatMulNBits block, so no block is padded where it is a multiple of qat.block_size); the floors come out
  of the global budget, so ``ffn_ratio`` of all channels goes even where a layer is held at its floor, and
  a ratio the floors cannot allow is refused; equal saliencies are broken by rank, never by a threshold
  that keeps all or none of them.
* Attention is pruned by whole grouped-query groups (one KV head and the query heads that read
  it): removing single query heads would leave groups of unequal size, which GQA cannot express.
  The seed's cooperative rule (§3.3) picks among neighbours: the least salient remaining group
  (layer i, group g) puts (i-1, g), (i, g) and (i+1, g) into a pool, the least salient of the pool
  is removed and the pool is closed for this pass. Each layer keeps one group: a ratio that asks for more,
  or that removes none (one KV head per layer, multi-query attention), is refused, not cut short.

* Whole decoder layers (depth pruning, ``layers_removed``) go first, before the channels are ranked
  on what remains. A layer's importance is what the model loses without it: the mean per-token
  KL(P_model || P_without the layer) on calibration text, the distillation-consistent form of the
  loss-based criterion of Minitron (Muralidharan et al. 2024, §2.2 "depth": LM loss with the layer
  removed) and Shortened LLaMA (Kim et al. 2024: one-shot perplexity criterion). The layers are
  scored once on the whole model and the least important go (one shot); ``depth_rescore`` scores
  the rest again after each removal (greedy). ``depth_criterion: block-influence`` scores a layer by
  ShortGPT's Block Influence instead (how little it changes its input; one forward pass a round). On SmolLM2-135M (30 layers) the one-shot choice kept
  held-out perplexity lower than the greedy one at 2, 3 and 4 layers removed, the greedy one at 6
  (tests/benchmarks/test_depth_pruning.py): past a few layers the layers' costs stop adding up.

Weights are physically removed and the per-layer structure recorded (structure.py), so the
exported graph is smaller.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from edgesdk.build.registry import BuildContext, register_stage
from edgesdk.compress import fake_quant
from edgesdk.compress.measure import stage_metrics
from edgesdk.compress.structure import (
    LAYERS_KEY,
    head_dim,
    keep_ffn_channels,
    keep_kv_groups,
    keep_layers,
    layer_records,
    slice_linear,
    teacher_layers,
)
from edgesdk.errors import BuildError

DEPTH_CRITERIA = ("kl", "block-influence")


@dataclass(frozen=True)
class PruneConfig:
    """Structured pruning settings."""

    ffn_ratio: float = 0.25  # fraction of all FFN channels removed (FFN is ~75 % of decoder weights)
    kv_group_ratio: float = 0.0  # fraction of all GQA groups removed (attention is cheaper, riskier)
    layers_removed: int = 0  # whole decoder layers removed (depth pruning), the least important first
    layer_calibration_batches: int = 4  # batches scoring each layer's removal (KL to the model with it)
    depth_rescore: bool = False  # score the remaining layers again after each removal (greedy) instead of once
    depth_criterion: str = "kl"  # "kl": KL to the model without the layer; "block-influence": ShortGPT's BI
    min_ffn_keep: float = 0.25  # no layer keeps fewer FFN channels than this fraction
    ffn_multiple: int = 32  # kept channels per layer round to this (the quantization block)
    cooperative: bool = True  # seed §3.3: neighbouring layers' same group compete, one is removed
    calibration_batches: int = 32  # batches of squared gradients (32 x 2 x 256 = 16k tokens)
    batch_size: int = 2  # sequences per calibration batch (memory)
    sequence_length: int = 256  # tokens per sequence
    seed: int = 1  # batch sampling (blocks of one shape drawn with the same seed are the same in every stage)

    def __post_init__(self):
        for name in ("ffn_ratio", "kv_group_ratio"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0.0 < self.min_ffn_keep <= 1.0:
            raise ValueError(f"min_ffn_keep must be in (0, 1], got {self.min_ffn_keep}")
        if self.ffn_multiple < 1:
            raise ValueError(f"ffn_multiple must be >= 1, got {self.ffn_multiple}")
        if self.layers_removed < 0:
            raise ValueError(f"layers_removed must be >= 0, got {self.layers_removed}")
        if self.layer_calibration_batches < 1:
            raise ValueError(f"layer_calibration_batches must be >= 1, got {self.layer_calibration_batches}")
        if self.depth_criterion not in DEPTH_CRITERIA:
            raise ValueError(f"depth_criterion must be one of {', '.join(DEPTH_CRITERIA)}, got {self.depth_criterion!r}")
        if self.calibration_batches < 1:  # no batch: every saliency 0, the ranking is arbitrary
            raise ValueError(f"calibration_batches must be >= 1, got {self.calibration_batches}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.sequence_length < 2:  # one token has no next token: no gradient, every saliency 0
            raise ValueError(f"sequence_length must be >= 2, got {self.sequence_length}")


@contextlib.contextmanager
def running_layers(model, positions: list[int]) -> Iterator[None]:
    """The model computing with only its decoder layers at ``positions`` (in the current model), as the model
    with the others removed does: the module list, and where the config lists each layer's attention kind
    (``layer_types``: Gemma 3's sliding and full layers), those kinds, which transformers reads by a layer's
    position for its mask and rotary table. Both are put back on leaving."""
    config = model.config
    layers, kinds = model.model.layers, getattr(config, "layer_types", None)
    model.model.layers = nn.ModuleList([layers[i] for i in positions])
    if kinds:
        config.layer_types = [kinds[i] for i in positions]
    try:
        yield
    finally:
        model.model.layers = layers
        if kinds:
            config.layer_types = kinds


def layer_removal_costs(model, batches: list[torch.Tensor], reference: list[torch.Tensor]) -> list[float]:
    """Per current decoder layer: mean per-token KL(reference || the model without that layer) in nats, where
    ``reference`` holds the log-probabilities (B, S, V) of the model being pruned on each batch."""
    count = len(model.model.layers)
    costs = []
    for skipped in range(count):
        with running_layers(model, [i for i in range(count) if i != skipped]):
            total = 0.0
            for batch, ref in zip(batches, reference, strict=True):
                logp = F.log_softmax(model(batch, use_cache=False).logits.float(), dim=-1)  # (B, S, V)
                total += float((ref.exp() * (ref - logp)).sum(-1).mean())
        costs.append(total / len(batches))
    return costs


def block_influence(model, batches: list[torch.Tensor]) -> list[float]:
    """Per current decoder layer: ShortGPT's Block Influence (Men et al. 2024), 1 - the mean cosine between the
    hidden states entering and leaving it; a layer that changes its input little scores near 0. transformers'
    last hidden state is the final norm's output, so the last layer's own output is taken by a hook."""
    totals = [0.0] * len(model.model.layers)
    last: list[torch.Tensor] = []

    def keep_output(module, args, output) -> None:
        last.append(output[0] if isinstance(output, tuple) else output)

    handle = model.model.layers[-1].register_forward_hook(keep_output)
    try:
        for batch in batches:
            last.clear()
            states = model(batch, output_hidden_states=True, use_cache=False).hidden_states  # L+1 x (B, S, D)
            leaving_each = [*states[1:-1], last[-1]]  # each layer's output; the last one's before the final norm
            for index, (entering, leaving) in enumerate(zip(states[:-1], leaving_each, strict=True)):
                totals[index] += 1.0 - float(F.cosine_similarity(entering.float(), leaving.float(), dim=-1).mean())
    finally:
        handle.remove()
    return [total / len(batches) for total in totals]


def plan_depth(model, batches: list[torch.Tensor], remove: int, rescore: bool = False,
               criterion: str = "kl") -> tuple[list[int], list[list[float]]]:
    """Positions of the layers to keep after removing the ``remove`` cheapest to lose, scored once on the whole
    model, or (``rescore``) one at a time with the rest scored again after each removal; and the scores of each
    round (for the build record). ``criterion``: "kl" (:func:`layer_removal_costs`) or "block-influence"
    (:func:`block_influence`)."""
    count = len(model.model.layers)
    if remove >= count:
        raise ValueError(f"layers_removed={remove} leaves no decoder layer of {count}; remove at most {count - 1}")
    kept = list(range(count))
    rounds = []
    with torch.no_grad():
        reference = None
        if criterion == "kl":
            reference = [F.log_softmax(model(batch, use_cache=False).logits.float(), dim=-1) for batch in batches]
        while len(kept) > count - remove:
            with running_layers(model, kept):
                costs = block_influence(model, batches) if reference is None else \
                    layer_removal_costs(model, batches, reference)
            rounds.append([round(c, 6) for c in costs])
            cheapest = sorted(range(len(costs)), key=costs.__getitem__)
            gone = cheapest[:1] if rescore else cheapest[:remove]
            kept = [layer for position, layer in enumerate(kept) if position not in gone]
    return kept, rounds


def fisher_diagonal(model, batches: list[torch.Tensor], progress: bool = False) -> dict[str, torch.Tensor]:
    """E[g^2] of every decoder linear weight over ``batches`` (next-token cross-entropy)."""
    from tqdm import tqdm

    linears = fake_quant.decoder_linears(model)
    for p in model.parameters():
        p.requires_grad_(False)
    for linear in linears.values():
        linear.weight.requires_grad_(True)
    sums = {name: torch.zeros_like(linear.weight) for name, linear in linears.items()}
    for batch in tqdm(batches, desc="fisher", disable=not progress, unit="batch"):
        logits = model(batch).logits[:, :-1]  # (B, S-1, V)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch[:, 1:].reshape(-1))
        loss.backward()
        for name, linear in linears.items():
            sums[name] += linear.weight.grad.pow(2)
            linear.weight.grad = None
    for linear in linears.values():
        linear.weight.requires_grad_(False)
    return {name: total / max(1, len(batches)) for name, total in sums.items()}


def saliencies(model, fisher: dict[str, torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per layer: FFN channel saliency (F,) and GQA group saliency (G,), sum of ½·E[g^2]·w^2."""
    dim = head_dim(model)
    q_per_kv = model.config.num_attention_heads // model.config.num_key_value_heads
    ffn, groups = [], []
    for index, layer in enumerate(model.model.layers):
        def cost(name: str, weight: torch.Tensor, index: int = index) -> torch.Tensor:
            return 0.5 * fisher[f"model.layers.{index}.{name}"] * weight.pow(2)

        mlp, attention = layer.mlp, layer.self_attn
        ffn.append(cost("mlp.gate_proj", mlp.gate_proj.weight).sum(1) + cost("mlp.up_proj", mlp.up_proj.weight).sum(1)
                   + cost("mlp.down_proj", mlp.down_proj.weight).sum(0))
        n_kv = attention.k_proj.out_features // dim
        q = cost("self_attn.q_proj", attention.q_proj.weight).sum(1).reshape(n_kv, q_per_kv * dim).sum(1)
        o = cost("self_attn.o_proj", attention.o_proj.weight).sum(0).reshape(n_kv, q_per_kv * dim).sum(1)
        k = cost("self_attn.k_proj", attention.k_proj.weight).sum(1).reshape(n_kv, dim).sum(1)
        v = cost("self_attn.v_proj", attention.v_proj.weight).sum(1).reshape(n_kv, dim).sum(1)
        groups.append(q + o + k + v)
    return ffn, groups


def _ranked(scores: torch.Tensor) -> torch.Tensor:
    """Indices by descending saliency; equal saliencies keep their index order (a stable rank, so ties
    never make a layer keep more or fewer channels than asked)."""
    return torch.argsort(scores, descending=True, stable=True)


def ffn_floor(width: int, config: PruneConfig) -> int:
    """The fewest FFN channels a layer of ``width`` keeps: ``min_ffn_keep`` of it rounded up to ``ffn_multiple``
    (1 for a layer narrower than the multiple), at least one multiple, at most the width."""
    multiple = config.ffn_multiple if width >= config.ffn_multiple else 1
    floor = math.ceil(math.ceil(config.min_ffn_keep * width - 1e-9) / multiple) * multiple  # never below it
    return min(width, max(multiple, floor))


def plan_ffn(scores: list[torch.Tensor], config: PruneConfig) -> list[list[int]]:
    """Channels each layer keeps: its ``min_ffn_keep`` floor (rounded up) of most salient channels, then the
    globally most salient of the others up to ``total - remove`` (ties broken by rank), rounded to ``ffn_multiple``
    per layer with the total kept as near ``total - remove`` as the multiples allow (:func:`_round_to_multiples`).
    The floor's channels come out of the global budget, so a layer held at its floor leaves its
    share of the removal to the others and ``ffn_ratio`` of all channels still goes; only a ratio past what the
    floors allow keeps the floors (:func:`check_width_ratios` refuses that in the stage)."""
    total = sum(s.numel() for s in scores)
    remove = int(round(config.ffn_ratio * total))
    if remove == 0:
        return [list(range(s.numel())) for s in scores]
    floors = [ffn_floor(s.numel(), config) for s in scores]
    orders = [_ranked(s) for s in scores]
    spare = torch.cat([s[order[floor:]] for s, order, floor in zip(scores, orders, floors, strict=True)])
    layer_of = torch.cat([torch.full((s.numel() - floor,), i)
                          for i, (s, floor) in enumerate(zip(scores, floors, strict=True))])
    chosen = layer_of[_ranked(spare)[: max(0, total - remove - sum(floors))]]
    wanted = [floor + int((chosen == index).sum()) for index, floor in enumerate(floors)]
    keeps = _round_to_multiples(wanted, floors, [s.numel() for s in scores], config.ffn_multiple, total - remove)
    return [sorted(order[:keep].tolist()) for order, keep in zip(orders, keeps, strict=True)]


def _round_to_multiples(wanted: list[int], floors: list[int], widths: list[int], ffn_multiple: int,
                        target: int) -> list[int]:
    """Per layer, ``wanted`` channels rounded to its multiple (``ffn_multiple``, 1 for a layer narrower than it;
    the full width is allowed), never below its floor, so that the total lands as near ``target`` as multiples
    allow: each layer is rounded down and the ones nearest their next multiple go up while that brings the total
    nearer (the largest-remainder method). Rounding each layer on its own missed the ratio by up to half a
    multiple per layer: SmolLM2-135M (30 layers of 1536, multiple 32) kept every channel at ffn_ratio 0.005
    (230 asked) and lost 896 at 0.015 (691 asked)."""
    keeps, remainders = [], []
    for want, floor, width in zip(wanted, floors, widths, strict=True):
        multiple = ffn_multiple if width >= ffn_multiple else 1
        keep = width if want >= width else max(floor, want // multiple * multiple)
        keeps.append(keep)
        remainders.append((want - keep) / multiple)
    for index in sorted(range(len(keeps)), key=lambda i: -remainders[i]):  # stable: equal remainders by layer
        multiple = ffn_multiple if widths[index] >= ffn_multiple else 1
        step = min(widths[index], keeps[index] + multiple) - keeps[index]
        if remainders[index] > 0 and step and 2 * (target - sum(keeps)) >= step:
            keeps[index] += step
    return keeps


def plan_groups(scores: list[torch.Tensor], config: PruneConfig) -> list[list[int]]:
    """GQA groups each layer keeps, under the cooperative neighbour rule (seed §3.3)."""
    total = sum(s.numel() for s in scores)
    remove = int(round(config.kv_group_ratio * total))
    kept = [set(range(s.numel())) for s in scores]
    removed = 0
    while removed < remove:
        closed: set[tuple[int, int]] = set()
        progress = False
        order = sorted(((float(s[g]), i, g) for i, s in enumerate(scores) for g in kept[i]))
        for _, layer, group in order:
            if removed >= remove:
                break
            if (layer, group) in closed:
                continue
            neighbours = (layer - 1, layer, layer + 1) if config.cooperative else (layer,)
            pool = [(i, group) for i in neighbours if 0 <= i < len(scores) and group in kept[i]
                    and len(kept[i]) > 1 and (i, group) not in closed]
            if not pool:
                continue
            victim = min(pool, key=lambda unit: float(scores[unit[0]][unit[1]]))
            kept[victim[0]].discard(victim[1])
            closed.update((i, group) for i in neighbours)
            removed += 1
            progress = True
        if not progress:
            break
    return [sorted(k) for k in kept]


def keep_adapter_heads(previous_layer, groups: list[int], q_per_kv: int) -> None:
    """A power adapter (stage ``power``) in ``previous_layer`` scales each query head of the next layer: keep
    the outputs of the query heads that the next layer's kept ``groups`` hold (scales and gate untouched)."""
    adapter = getattr(previous_layer.mlp, "power_adapter", None)
    if adapter is None:
        return
    hidden = adapter.hidden_size
    heads = [g * q_per_kv + j for g in groups for j in range(q_per_kv)]
    rows = [*range(hidden), *(hidden + h for h in heads), hidden + adapter.next_heads]  # [scales | heads | gate]
    slice_linear(adapter.proj2, rows=rows)
    adapter.next_heads = len(heads)


def apply_plans(model, ffn_plan: list[list[int]], group_plan: list[list[int]]) -> None:
    """Slice every layer to the FFN channels and GQA groups it keeps (positions in its current structure),
    a power adapter's next-layer head outputs with them, and record the structure in the config."""
    dim = head_dim(model)
    q_per_kv = model.config.num_attention_heads // model.config.num_key_value_heads
    records = layer_records(model)
    layers = list(model.model.layers)
    for index, (layer, record, channels, groups) in enumerate(zip(layers, records, ffn_plan, group_plan, strict=True)):
        keep_ffn_channels(layer, channels)
        keep_kv_groups(layer, groups, q_per_kv, dim)
        if index > 0:
            keep_adapter_heads(layers[index - 1], groups, q_per_kv)
        record["ffn"] = [record["ffn"][c] for c in channels]
        record["kv_heads"] = [record["kv_heads"][g] for g in groups]
        record["heads"] = [record["heads"][g * q_per_kv + j] for g in groups for j in range(q_per_kv)]
    setattr(model.config, LAYERS_KEY, records)


@register_stage("prune", PruneConfig, after=("qat",), description="structured pruning (Fisher saliency, GQA groups)")
def prune_stage(model, config: PruneConfig, ctx: BuildContext):
    model.eval()
    scheme = fake_quant.reattach(model)  # importance measured on the quantized model (seed §5 lesson)
    depth = {}
    if config.layers_removed:
        if any(".power_adapter." in name for name, _ in model.named_parameters()):
            raise BuildError("prune.layers_removed: a power-gated model's adapters scale the next layer's attention "
                             "heads, so its layers cannot be removed",
                             "prune depth in a recipe without the power stage, or leave prune.layers_removed at 0")
        count = len(model.model.layers)
        if config.layers_removed >= count:
            raise BuildError(f"prune.layers_removed is {config.layers_removed}, but the model has {count} decoder "
                             "layers: removing them all leaves no model",
                             f"remove at most {count - 1} (--prune-layers {count - 1}, or --set "
                             f"prune.layers_removed={count - 1})")
        check_width_ratios_after_depth(model, config, ctx.terms)
        layer_batches = ctx.training_data().batches(config.layer_calibration_batches, config.batch_size,
                                                    config.sequence_length, config.seed + 1, "prune")
        before = teacher_layers(model)
        kept, rounds = plan_depth(model, layer_batches, config.layers_removed, config.depth_rescore,
                                  config.depth_criterion)
        if scheme is not None:  # its linears carry their names, which removing layers renumbers
            fake_quant.detach(model, bake=False)
        keep_layers(model, kept)
        scheme = fake_quant.reattach(model)
        depth = {"layers_removed": sorted(set(before) - set(teacher_layers(model))),
                 f"layer_removal_{config.depth_criterion.replace('-', '_')}": rounds}
    width = {}
    if config.ffn_ratio or config.kv_group_ratio:
        width = _prune_width(model, config, ctx, scheme)
    elif scheme is not None:
        fake_quant.detach(model, bake=False)  # weights are already on the grid from QAT
    ctx.metrics.update({**depth, **width}, **stage_metrics(model, ctx.eval_ids()))
    return model


def _how(terms: str, flag: str, setting: str) -> str:
    """How a caller sets ``setting`` (``stage.field=value``): `` (--ffn-ratio)`` / `` (--set ...)`` for the CLI,
    `` (overrides=['stage.field=value'])`` for build_bundle() (edgesdk.build.checkpoint.said_sets)."""
    from edgesdk.build.checkpoint import said_sets

    return f" ({flag})" if terms != "python" else f" ({said_sets(terms, setting)})"


def check_width_ratios(model, config: PruneConfig, terms: str = "cli") -> None:
    """Refuse, before any calibration, a width ratio the model's structure cannot carry out: ``ffn_ratio`` past
    what the layers' ``min_ffn_keep`` floors let go (:func:`plan_ffn` would keep the floors and remove less than
    asked) or so small that rounding the layers to ``ffn_multiple`` removes no channel, and a ``kv_group_ratio``
    that removes no GQA group (one KV head per layer, as Gemma 3's multi-query attention, or a ratio of the groups
    that rounds to none) or more than all but one group of every layer
    (each layer keeps one: :func:`plan_groups` would stop short). Either way the pruned model would not be the
    one the recipe asked for, and nothing said so."""
    widths = [layer.mlp.gate_proj.out_features for layer in model.model.layers]
    total = sum(widths)
    remove = int(round(config.ffn_ratio * total))
    floors = sum(ffn_floor(width, config) for width in widths)
    # the fewest channels a layer can lose: down to its width's last multiple of ffn_multiple (1 if narrower)
    smallest = min(width % config.ffn_multiple or config.ffn_multiple if width >= config.ffn_multiple else 1
                   for width in widths)
    if config.ffn_ratio and 2 * remove <= smallest:  # plan_ffn rounds the total removed to those steps: none
        least = math.ceil((smallest // 2 + 1) / total * 1e4) / 1e4
        raise BuildError(_ffn_rounds_to_none(config, remove, total),
                         f"raise prune.ffn_ratio to at least {least}"
                         f"{_how(terms, '--ffn-ratio', f'prune.ffn_ratio={least}')}"
                         + (f", lower prune.ffn_multiple"
                            f"{_how(terms, '--set prune.ffn_multiple=...', 'prune.ffn_multiple=...')}" if remove else "")
                         + ", or set prune.ffn_ratio to 0")
    if remove > total - floors:
        most = math.floor((total - floors) / total * 1e4) / 1e4  # a ratio that removes no more than that
        raise BuildError(f"prune.ffn_ratio is {config.ffn_ratio}, but min_ffn_keep {config.min_ffn_keep} keeps at "
                         f"least {floors} of the {total} FFN channels (each layer's floor rounded up to ffn_multiple "
                         f"{config.ffn_multiple}), so at most {most} of them can go",
                         f"lower prune.ffn_ratio to {most} or less{_how(terms, '--ffn-ratio', f'prune.ffn_ratio={most}')}"
                         f", or lower prune.min_ffn_keep"
                         f"{_how(terms, '--set prune.min_ffn_keep=...', 'prune.min_ffn_keep=...')}")
    if not config.kv_group_ratio:
        return
    dim = head_dim(model)
    groups = [layer.self_attn.k_proj.out_features // dim for layer in model.model.layers]
    total, removable = sum(groups), sum(count - 1 for count in groups)
    remove = int(round(config.kv_group_ratio * total))
    where = f"the model has {total} GQA groups (KV heads) in {len(groups)} layers"
    least, most = math.ceil(1e4 / total) / 1e4, math.floor(removable / total * 1e4) / 1e4  # one group; all removable
    if removable == 0:
        raise BuildError(f"prune.kv_group_ratio is {config.kv_group_ratio}, but {where}, one per layer "
                         "(multi-query attention), and each layer keeps one: no group can be removed",
                         f"set prune.kv_group_ratio to 0{_how(terms, '--set prune.kv_group_ratio=0', 'prune.kv_group_ratio=0')}"
                         " and prune FFN channels or "
                         "layers instead")
    if remove == 0:
        raise BuildError(f"prune.kv_group_ratio is {config.kv_group_ratio}, but {where}: "
                         f"{config.kv_group_ratio} of them rounds to no group removed",
                         f"set prune.kv_group_ratio to at least {least} (one group)"
                         f"{_how(terms, f'--set prune.kv_group_ratio={least}', f'prune.kv_group_ratio={least}')}, "
                         "or to 0")
    if remove > removable:
        raise BuildError(f"prune.kv_group_ratio is {config.kv_group_ratio} ({remove} groups), but {where} and each "
                         f"layer keeps at least one, so at most {removable} can go",
                         f"lower prune.kv_group_ratio to {most} or less"
                         f"{_how(terms, f'--set prune.kv_group_ratio={most}', f'prune.kv_group_ratio={most}')}")


def _ffn_rounds_to_none(config: PruneConfig, remove: int, total: int) -> str:
    """Why ``ffn_ratio`` removes no channel: the ratio of all ``total`` channels rounds to none, which no
    ``ffn_multiple`` changes, or the ``remove`` it asks for is less than half the fewest a layer can lose."""
    if not remove:
        return (f"prune.ffn_ratio is {config.ffn_ratio}: {config.ffn_ratio} of the model's {total} FFN channels "
                "rounds to no channel removed")
    return (f"prune.ffn_ratio is {config.ffn_ratio}: {remove} of the model's {total} FFN channels, but each layer "
            f"keeps a multiple of ffn_multiple {config.ffn_multiple} channels, so that rounds to no channel removed")


def check_width_ratios_after_depth(model, config: PruneConfig, terms: str = "cli") -> None:
    """:func:`check_width_ratios` on the model that removing ``layers_removed`` decoder layers leaves, before any
    layer is scored, where the shapes alone tell its widths: every layer of one FFN width and one KV-head count
    (an unpruned model), so whichever layers the depth plan picks, the shortened model's are the same. Layers of
    several shapes are checked once the plan has picked them (the stage checks the shortened model again). A
    refusal says the counts it names are the shortened model's."""
    layers = model.model.layers
    shapes = {(layer.mlp.gate_proj.out_features, layer.self_attn.k_proj.out_features) for layer in layers}
    if len(shapes) != 1 or not 0 < config.layers_removed < len(layers):
        return
    kept = len(layers) - config.layers_removed
    with running_layers(model, list(range(kept))), _after_depth(config, kept, len(layers)):
        check_width_ratios(model, config, terms)


@contextlib.contextmanager
def _after_depth(config: PruneConfig, kept: int, total: int):
    """A width refusal of the model depth pruning shortened, told as that model's (its counts are not the loaded
    model's)."""
    try:
        yield
    except BuildError as exc:
        if not config.layers_removed:
            raise
        raise BuildError(f"after prune.layers_removed={config.layers_removed} ({kept} of {total} layers kept): "
                         f"{exc.problem}", exc.fix) from None


def _prune_width(model, config: PruneConfig, ctx: BuildContext, scheme) -> dict:
    """FFN channels and GQA groups by Fisher saliency; returns what the build record keeps of it. With layers
    removed first, the model is the shortened one."""
    kept = len(model.model.layers)
    with _after_depth(config, kept, kept + config.layers_removed):
        check_width_ratios(model, config, "cli" if ctx is None else ctx.terms)
    batches = ctx.training_data().batches(config.calibration_batches, config.batch_size, config.sequence_length,
                                          config.seed, "prune")
    fisher = fisher_diagonal(model, batches, ctx.progress)
    if scheme is not None:
        fake_quant.detach(model, bake=False)  # weights are already on the grid from QAT
    ffn_scores, group_scores = saliencies(model, fisher)
    ffn_plan, group_plan = plan_ffn(ffn_scores, config), plan_groups(group_scores, config)
    apply_plans(model, ffn_plan, group_plan)
    if scheme is not None:  # removed down-projection columns shift its K blocks: back onto the grid
        fake_quant.attach(model, scheme)
        fake_quant.detach(model, bake=True)
    return {
        "ffn_saliency_per_layer": [round(float(s.sum()), 6) for s in ffn_scores],
        "group_saliency_per_layer": [[round(float(v), 6) for v in s] for s in group_scores],
        "calibration_tokens": sum(int(b.numel()) for b in batches),
    }
