"""Build stage ``qat``: quantization-aware training (seed 004 §2; Jacob et al. 2018).

Weights are fake-quantized symmetrically (per output channel for the QDQ/TensorRT form, per
block of ``block_size`` input features for ONNX Runtime's MatMulNBits), activations per tensor
with observed scales (QDQ) or per weight block at run time (MatMulNBits accuracy level 4); norms
stay in float (§2.2). The student learns, through the straight-through estimator, to match the
unquantized model's next-token distributions (KL to the teacher: the loaded model is the best
label we have). At the end the weights are baked onto the integer grid, so the export re-derives
exactly these codes.

Departures from the seed: the teacher KL replaces a task loss (no labelled data on the host);
the gradient-scaling schedule (§2.3) is an option, off by default, because Adam divides a common
gradient factor out of its update (SmolLM2-135M, int4, 16 batches: held-out perplexity 34.846
without, 34.818 with; tests/benchmarks/test_stage_options.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from edgesdk.build.registry import BuildContext, register_stage
from edgesdk.compress import fake_quant
from edgesdk.compress.losses import logits_kl
from edgesdk.compress.measure import stage_metrics
from edgesdk.compress.mixed_precision import check_eight_bit_budget, eight_bit_linears
from edgesdk.compress.train import (
    LoopSettings,
    check_checkpoint_interval,
    check_optimiser_settings,
    run_training,
    setting_up,
    trains_with_the_backbone,
)


@dataclass(frozen=True)
class QATConfig:
    """Quantization-aware training settings (defaults: SmolLM2-class models on a 2-core host)."""

    weight_bits: int = 8  # 8 = INT8; 4 = INT4 weight-only (the int4 / aggressive recipes)
    granularity: str = "block"  # block (MatMulNBits, ORT CPU form) | channel (QDQ, TensorRT form)
    block_size: int = 32  # 32: least rounding error; 64 decodes faster (default recipe); = export.block_size
    activations: str = "block"  # block: what MatMulNBits acc-4 does at run time; tensor: QDQ observers
    embedding_bits: int | None = 8  # embedding and LM head (tied or not) at 8 bits: the head scores every token
    eight_bit_fraction: float = 0.0  # weight_bits 4: this fraction of the linear weights stays at 8 bits,
    # the units whose INT4 rounding costs most by Fisher-weighted error (compress/mixed_precision.py)
    fisher_batches: int = 8  # calibration batches for that choice (8 x 2 x 256 = 4k tokens, ~1 min)
    train_embedding: bool = False  # the embedding is 21 % of SmolLM2; frozen saves optimizer memory
    steps: int = 64  # batches; 64 x 2 x 256 = 33k tokens
    batch_size: int = 2  # sequences per batch: activations + 49k-vocab logits of 2x256 tokens ~2 GB
    sequence_length: int = 256  # tokens per sequence
    grad_accumulation: int = 4  # batches per optimizer step (effective batch 8; seed §2.3 accumulates too)
    lr: float = 1e-4  # ~16 updates: enough to move weights across a fraction of an int4 step
    temperature: float = 1.0  # logits KL temperature
    grad_scaling: bool = False  # seed §2.3 schedule 1 / (1 + 0.001 step); a no-op under Adam (measured)
    observer_batches: int = 8  # batches to observe per-tensor activation ranges (activations=tensor)
    seed: int = 0  # batch sampling
    # inside a build, keep the training in flight at most this often (seconds; 0: after every update), so a stopped
    # or killed build's --resume goes on from there; not part of the build key
    checkpoint_interval_s: float = 300.0

    def scheme(self) -> fake_quant.QuantScheme:
        return fake_quant.QuantScheme(weight_bits=self.weight_bits, granularity=self.granularity,
                                      block_size=self.block_size, activations=self.activations,
                                      embedding_bits=self.embedding_bits)

    def __post_init__(self):
        self.scheme()  # validates the quantization fields
        check_optimiser_settings(self.lr, self.temperature, self.grad_accumulation)
        check_checkpoint_interval(self.checkpoint_interval_s)
        for name, least in (("steps", 0), ("batch_size", 1), ("sequence_length", 2)):
            if getattr(self, name) < least:
                raise ValueError(f"{name} must be >= {least}, got {getattr(self, name)}")
        if not 0.0 <= self.eight_bit_fraction <= 1.0:
            raise ValueError(f"eight_bit_fraction must be in [0, 1], got {self.eight_bit_fraction}")
        if self.activations == "tensor" and self.observer_batches < 1:  # no scale: a QDQ graph without activation Q/DQ
            raise ValueError(f"activations tensor needs observer_batches >= 1 (they set the static scales), got "
                             f"{self.observer_batches}")
        if self.eight_bit_fraction and self.fisher_batches < 1:  # no batch: every unit's gain 0, an arbitrary choice
            raise ValueError(f"eight_bit_fraction needs fisher_batches >= 1 (they rank the units), got "
                             f"{self.fisher_batches}")
        if self.eight_bit_fraction and (self.weight_bits != 4 or self.granularity != "block"):
            raise ValueError("eight_bit_fraction mixes 8-bit into 4-bit block weights: it needs weight_bits 4 and "
                             f"granularity block, got weight_bits {self.weight_bits}, granularity {self.granularity}")


def reads_text(config: QATConfig) -> bool:
    """Whether the stage puts blocks of training text through the model: to train, to observe the static
    activation scales, or to choose the units kept at 8 bits."""
    return bool(config.steps or config.activations == "tensor" or config.eight_bit_fraction)


def significant(value: float, digits: int = 6) -> float:
    """``value`` to ``digits`` significant digits: a unit's rounding gain is a loss of 1e-7 to 1e-3 nats
    (SmolLM2-135M: median 5.5e-6), which six decimal places would leave as 0.0 or a single digit."""
    return float(f"{value:.{digits}g}")


def distill_to_teacher(teacher, temperature: float):
    """A loss function: KL(teacher || student) of next-token distributions on a batch."""
    def loss_fn(student, batch: torch.Tensor) -> tuple[torch.Tensor, dict]:
        with torch.no_grad():
            target = teacher(batch).logits
        loss = logits_kl(student(batch).logits, target, temperature)
        return loss, {}
    return loss_fn


@register_stage("qat", QATConfig, after=("smooth",), description="quantization-aware training (fake quantization, STE)")
def qat_stage(model, config: QATConfig, ctx: BuildContext):
    teacher = ctx.teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    model.eval()  # no dropout (seed §4 warning); gradients still flow
    check_eight_bit_budget(model, config.eight_bit_fraction, ctx.terms)  # from the shapes, before any text is drawn
    metrics = {}
    data = ctx.training_data() if reads_text(config) else None  # the first stage to read the text loads it, saying so
    scheme = config.scheme()
    if config.eight_bit_fraction:
        setting_up(f"choosing the units kept at 8 bits from their Fisher-weighted INT4 rounding error on "
                   f"{config.fisher_batches} batches", "that choice is not kept")
        calibration = data.batches(config.fisher_batches, config.batch_size, config.sequence_length, config.seed + 2,
                                   "qat")
        chosen, units, gains = eight_bit_linears(model, calibration, config.eight_bit_fraction, config.block_size,
                                                 ctx.progress)
        scheme = replace(scheme, eight_bit_linears=chosen)
        metrics["eight_bit_units"] = units
        metrics["int4_rounding_gain"] = {unit: significant(gain) for unit, gain in gains.items()}
    fake_quant.attach(model, scheme)
    for name, p in model.named_parameters():
        p.requires_grad_(trains_with_the_backbone(name, config.train_embedding))
    metrics["trained_parameters"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if config.activations == "tensor":
        setting_up(f"observing the activation ranges for the fake-quant scales on {config.observer_batches} batches",
                   "the ranges observed are kept with the training, from its first update on")
        fake_quant.set_observing(model, True)
        with torch.no_grad():
            for batch in data.batches(config.observer_batches, config.batch_size, config.sequence_length,
                                      config.seed + 1, "qat"):
                model(batch)
        fake_quant.set_observing(model, False)
    if config.steps:
        batches = data.batches(config.steps, config.batch_size, config.sequence_length, config.seed, "qat")
        loss = distill_to_teacher(teacher, config.temperature)
        settings = LoopSettings(lr=config.lr, grad_accumulation=config.grad_accumulation,
                                grad_scaling=config.grad_scaling, checkpoint_interval_s=config.checkpoint_interval_s)
        metrics["training"] = run_training(model, lambda b, _: loss(model, b), batches, settings, desc="qat",
                                           progress=ctx.progress)
    fake_quant.detach(model, bake=True)
    for p in model.parameters():
        p.requires_grad_(False)
    ctx.metrics.update(metrics, **stage_metrics(model, ctx.eval_ids()))
    return model
