"""Build stage ``distill``: attention-aligned knowledge distillation (seed 004 §4).

The teacher is the model as loaded, before any stage. The student (quantized and pruned; its
fake quantization stays on, so it learns the weights it will ship) is trained on

    L = w_logits * KL_T(teacher || student) + w_attention * (a_tok L_token + a_layer L_layer + a_glob L_global)

with the seed's attention terms (losses.py) and their weight schedule (token-level first, then
layer-level, then global), dropout off (the seed's warning; modules are kept in eval mode), and
training text from the build's data plus teacher-generated text (data-free distillation).

Departures from the seed: the per-layer temperature T_layer = 2 + 2·sigmoid(0.1·(l-12)) (§4.3)
has nothing to act on, since only the last layer produces logits, so there is one temperature;
the teacher soft prompt (§4.2) is "learnable" yet "frozen throughout", i.e. a fixed random
prefix: it is an option (``soft_prompt_tokens``) whose effect is measured, off by default.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from edgesdk.build.checkpoint import said_sets
from edgesdk.build.registry import BuildContext, register_stage
from edgesdk.compress import fake_quant, sparsify
from edgesdk.compress.losses import (
    attention_weights,
    global_attention_cosine,
    layer_attention_kl,
    logits_kl,
    token_attention_kl,
)
from edgesdk.compress.measure import stage_metrics
from edgesdk.compress.structure import layer_records, teacher_layers
from edgesdk.compress.train import (
    LoopSettings,
    check_checkpoint_interval,
    check_optimiser_settings,
    run_training,
    trains_with_the_backbone,
)
from edgesdk.errors import BuildError


@dataclass(frozen=True)
class DistillConfig:
    """Distillation settings; the token budget is steps x batch_size x sequence_length."""

    steps: int = 128  # batches; 128 x 2 x 256 = 66k tokens
    batch_size: int = 2  # sequences per batch (memory: the build stays well under 8 GiB)
    sequence_length: int = 256  # tokens per sequence
    grad_accumulation: int = 4  # batches per optimizer step (effective batch 8)
    lr: float = 1e-4  # ~32 updates; pruned weights must move further than QAT rounding nudges
    temperature: float = 1.0  # logits KL temperature (one: only the last layer has logits)
    logits_weight: float = 1.0  # the next-token distributions are what the user sees
    attention_weight: float = 0.5  # seed §4.1 attention alignment, relative to the logits term
    schedule: bool = True  # seed §4.1 weight schedule (token -> layer -> global emphasis)
    soft_prompt_tokens: int = 0  # seed §4.2 frozen random prefix; off: +0.5 % perplexity (test_stage_options)
    train_embedding: bool = False  # keep the tied embedding / LM head as QAT left it
    seed: int = 2  # batch sampling (blocks of one shape drawn with the same seed are the same in every stage)
    # inside a build, keep the training in flight at most this often (seconds; 0: after every update), so a stopped
    # or killed build's --resume goes on from there; not part of the build key
    checkpoint_interval_s: float = 300.0

    def __post_init__(self):
        for name, least in (("steps", 0), ("batch_size", 1), ("sequence_length", 2), ("soft_prompt_tokens", 0)):
            if getattr(self, name) < least:
                raise ValueError(f"{name} must be >= {least}, got {getattr(self, name)}")
        for name in ("logits_weight", "attention_weight"):
            if not getattr(self, name) >= 0:  # NaN too
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.steps and not (self.logits_weight or self.attention_weight):  # a loss of 0 x KL: zero gradients
            raise ValueError(f"logits_weight and attention_weight are both 0 with steps {self.steps}: the loss is 0, "
                             "so the training changes no weight; give either term a weight > 0, or set steps 0 "
                             "to skip the training")
        check_optimiser_settings(self.lr, self.temperature, self.grad_accumulation)
        check_checkpoint_interval(self.checkpoint_interval_s)


def check_soft_prompt(config: DistillConfig, model_config, terms: str = "cli") -> None:
    """The teacher reads ``soft_prompt_tokens`` random embeddings before each block of ``sequence_length``
    tokens: both must fit the model's positions, or the teacher computes past its trained context (and 100,000
    prefix tokens asked for a 40 GB attention mask, failing inside torch with an out-of-memory RuntimeError).
    ``terms``: whose names the fix gives the overrides in, ``edgesdk build``'s (``--set``) or build_bundle()'s
    (``overrides=[...]``). Checked before the stage trains; build pipelines call it before any stage runs
    (edgesdk.build.pipeline.check_stage_positions), and both reckon by edgesdk.build.pipeline.positions_past, so they
    refuse the same sizes; with ``steps`` 0 nothing is read, and nothing refused.
    Without a prefix the blocks alone must fit: a ``sequence_length`` past the model's positions trained the student
    to match the teacher where neither was trained, on positions the bundle (whose context stops at them) never runs."""
    from edgesdk.build.pipeline import positions_past, stage_positions

    positions = getattr(model_config, "max_position_embeddings", None)
    if not isinstance(positions, int):
        return
    past = next(filter(None, (positions_past("distill", what, settings, positions, terms)
                              for what, settings in stage_positions("distill", config))), None)
    if past is None:
        return
    reached, fix = past
    prefix, length = config.soft_prompt_tokens, config.sequence_length
    if not prefix:
        raise BuildError(
            f"distill.sequence_length is {length}, more than the model's max_position_embeddings {positions}: the "
            "teacher and the student would compute past their trained context, on positions the bundle never runs",
            fix)
    without = said_sets(terms, *([f"distill.sequence_length={positions}"] if length > positions else []),
                        "distill.soft_prompt_tokens=0")
    if length == positions:  # the prefix lowered to fit is 0, none: a prefix kept needs a shorter sequence
        fix = f"{said_sets(terms, f'distill.sequence_length={positions // 2}')} or less with a shorter prefix"
    elif length > positions and positions - prefix < 2:  # fix is already the sequence at the positions, no prefix
        without = None
    raise BuildError(
        f"distill.soft_prompt_tokens is {prefix}: with distill.sequence_length {length} the teacher reads "
        f"{reached} positions, more than the model's max_position_embeddings {positions}",
        fix + (f", or {without} (no prefix, the default)" if without else ""))


@contextmanager
def eager_attention(*models):
    """While the block runs, ``models`` compute attention in transformers' eager implementation, the only one that
    returns attention probabilities (``sdpa`` returns an empty tuple for ``output_attentions``). Afterwards each has
    the implementation it came with: the stage set ``sdpa`` on the student and on the teacher, so a model the power
    stage had set to ``eager`` (edgesdk/power/adapter.py: its attention-peak hook reads the probabilities) recorded
    no peak after distillation, and a model resumed from the stage's checkpoint (whose load hook sets ``eager``
    again) computed its attention otherwise than the same model built in one run."""
    before = [model.config._attn_implementation for model in models]
    for model in models:
        model.set_attn_implementation("eager")
    try:
        yield
    finally:
        for model, implementation in zip(models, before, strict=True):
            model.set_attn_implementation(implementation)


def check_attention_maps(maps, who: str, model, config: DistillConfig) -> None:
    """The attention terms need one map per layer from ``who`` (the student or the teacher, ``model``); a model in
    the ``sdpa`` implementation returns none, which failed in ``zip()`` ("argument 2 is longer than argument 1")."""
    if maps is None or len(maps) == 0:
        raise ValueError(f"the {who} returned no attention maps, which distill.attention_weight "
                         f"{config.attention_weight} needs: its attention implementation is "
                         f"{model.config._attn_implementation!r}, and only 'eager' returns them; run the loss inside "
                         "eager_attention(teacher, student), as distill_stage does, or set attention_weight 0")


class TeacherWithPrefix:
    """The teacher, optionally reading a fixed random prefix of ``tokens`` embeddings first; its
    logits and attention maps are cut back to the real positions (rows renormalised)."""

    def __init__(self, teacher, tokens: int, seed: int):
        self.teacher, self.tokens = teacher, tokens
        if tokens:
            generator = torch.Generator().manual_seed(seed)
            ids = torch.randint(0, teacher.config.vocab_size, (tokens,), generator=generator)
            self.prefix = teacher.model.embed_tokens(ids).detach()  # (P, D)

    @torch.no_grad()
    def __call__(self, batch: torch.Tensor):
        if not self.tokens:
            out = self.teacher(batch, output_attentions=True)
            return out.logits, out.attentions
        embeds = self.teacher.model.embed_tokens(batch)  # (B, S, D)
        prefix = self.prefix.unsqueeze(0).expand(batch.shape[0], -1, -1)  # (B, P, D)
        out = self.teacher(inputs_embeds=torch.cat([prefix, embeds], dim=1), output_attentions=True)
        p = self.tokens
        maps = []
        for attention in out.attentions:  # (B, H, P+S, P+S)
            real = attention[:, :, p:, p:]
            maps.append(real / real.sum(-1, keepdim=True).clamp_min(1e-12))
        return out.logits[:, p:], maps


def kept_teacher_maps(teacher_maps, kept_heads) -> list[torch.Tensor]:
    """Per student layer, the teacher's attention maps (B, H_t, S, S) of the heads that layer kept (``kept_heads[i]``,
    teacher indices): (B, H_s, S, S), the teacher's own tensor where every head was kept."""
    maps = []
    for attention, heads in zip(teacher_maps, kept_heads, strict=True):
        heads = list(heads)
        maps.append(attention if heads == list(range(attention.shape[1])) else attention[:, heads])
    return maps


def distillation_loss(student, teacher: TeacherWithPrefix, kept_heads, config: DistillConfig,
                      teacher_index: list[int] | None = None):
    """The stage's loss; ``teacher_index[i]`` is the teacher layer whose attention student layer i matches
    (depth pruning removes layers; by default layer i matches layer i).

    Every attention term compares a pruned layer's surviving heads with the same heads of the teacher
    (:func:`kept_teacher_maps`): the token-level term head by head, the layer-level term and the global cosine
    through their head-mean maps. Averaged over all the teacher's heads, removed ones included, the layer and
    global targets were maps no surviving set of heads computes: a student whose kept heads attended exactly as
    their teacher heads do still had a loss above 0 there, and its gradient pulled those heads away from the
    teacher heads the token-level term matched them to (losses.py: each term is 0 when student and teacher agree)."""
    def loss_fn(batch: torch.Tensor, fraction: float) -> tuple[torch.Tensor, dict]:
        teacher_logits, teacher_maps = teacher(batch)
        out = student(batch, output_attentions=config.attention_weight > 0)
        parts = {"logits": logits_kl(out.logits, teacher_logits, config.temperature)}
        loss = config.logits_weight * parts["logits"]
        if config.attention_weight > 0:
            check_attention_maps(teacher_maps, "teacher", teacher.teacher, config)
            check_attention_maps(out.attentions, "student", student, config)
            if teacher_index is not None:
                teacher_maps = [teacher_maps[i] for i in teacher_index]
            weights = attention_weights(fraction, config.schedule)
            kept_maps = kept_teacher_maps(teacher_maps, kept_heads)  # (B, H_s, S, S) per layer
            parts["token"] = token_attention_kl(out.attentions, teacher_maps, kept_heads)
            parts["layer"] = layer_attention_kl(out.attentions, kept_maps)
            parts["global"] = global_attention_cosine(out.attentions, kept_maps)
            loss = loss + config.attention_weight * sum(weights[k] * parts[k] for k in weights)
        return loss, {k: v.item() for k, v in parts.items()}
    return loss_fn


@register_stage("distill", DistillConfig, after=("qat", "prune", "sparsify"),
                description="attention-aligned distillation from the uncompressed teacher")
def distill_stage(model, config: DistillConfig, ctx: BuildContext):
    check_soft_prompt(config, ctx.teacher.config, ctx.terms)
    teacher = ctx.teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    for m in (teacher, model):
        m.eval()  # dropout off (seed §4 warning)
    scheme = fake_quant.reattach(model)
    metrics, held, trained = {}, [], False
    try:
        for name, p in model.named_parameters():
            p.requires_grad_(trains_with_the_backbone(name, config.train_embedding))
        kept_heads = [record["heads"] for record in layer_records(model)]
        teacher_index = teacher_layers(model)
        if config.steps:
            batches = ctx.training_data().batches(config.steps, config.batch_size, config.sequence_length,
                                                  config.seed, "distill")
            loss_fn = distillation_loss(model, TeacherWithPrefix(teacher, config.soft_prompt_tokens, config.seed),
                                        kept_heads, config, teacher_index)
            settings = LoopSettings(lr=config.lr, grad_accumulation=config.grad_accumulation,
                                    checkpoint_interval_s=config.checkpoint_interval_s)
            held = sparsify.hold_masks(model)  # dropped blocks stay dropped
            with eager_attention(teacher, model):
                metrics["training"] = run_training(model, loss_fn, batches, settings, desc="distill",
                                                   progress=ctx.progress)
        trained = True
    finally:  # a failed run too leaves the model without the stage's gradient hooks and fake quantization
        for handle in held:
            handle.remove()
        if scheme is not None:
            fake_quant.detach(model, bake=trained)  # a failed run's weights are left as they were, not rounded
        for p in model.parameters():
            p.requires_grad_(False)
    sparsify.apply_masks(model)  # exact zeros whatever the optimizer's epsilon did
    ctx.metrics.update(metrics, **stage_metrics(model, ctx.eval_ids()))
    return model
