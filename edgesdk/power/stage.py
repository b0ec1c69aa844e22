"""Build stage ``power``: learned per-token compute gates (seed 000, "power distillation").

1. c_t: time the model's own fused graph at several cache lengths (``profiler``), store per bucket.
2. Install a PowerAdapter per decoder layer (<= ``max_fraction`` of the model's parameters).
3. Calibrate the component scales (mean attention peak, mean FFN output norm per layer).
4. Train the adapters on-policy with the backbone frozen (``train.train_adapters``).
5. Choose alpha, beta, gamma by a latency-quality sweep on held-out tokens, with the run-time
   controller in the loop (``train.sweep_weights``).

Everything the exporter and the runtime need (weights, scales, cost table, window) is written to
``model.config.edgesdk_power``; the adapters travel in the checkpoint's safetensors.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from edgesdk.build import checkpoint
from edgesdk.build.registry import BuildContext, register_stage
from edgesdk.compress.data import eos_ids
from edgesdk.compress.measure import _EXPORT, computed_scheme, holds_a_window, stage_metrics
from edgesdk.compress.train import check_checkpoint_interval, current_progress
from edgesdk.errors import BuildError
from edgesdk.power import adapter, train
from edgesdk.power.controller import ADAPTERS_OFF_TAU, ControllerConfig, TauController
from edgesdk.power.distribution import FLOOR, SMOOTH, WINDOW, check_entropy_target
from edgesdk.power.profiler import REPEATS, CostStats, buckets_timeable, measure_kv_cost

# The report's curve: these, tau_train and 0 (every FFN run, the adapters' scales acting). The gates start at
# sigmoid(gate_init) = 0.62 and, on SmolLM2-135M, end between 0.5 (82 % of the FFN blocks run) and 0.7 (none run),
# so the points lie in that band.
CURVE_TAUS = (0.55, 0.6, 0.65, 0.7)
SAMPLE_TOKENS = 8 * WINDOW  # tokens of the held-out text whose power distribution the report plots


@dataclass(frozen=True)
class PowerConfig:
    """Power-adapter training settings (defaults sized for SmolLM2-135M on a 2-core host, ~15 min)."""

    rank: int = 32  # adapter bottleneck; 32 keeps SmolLM2-135M's adapters at 0.84 % of the model
    max_fraction: float = 0.01  # adapters never exceed this share of the model (the rank shrinks to fit)
    gate_init: float = 0.5  # gate logit at start: sigmoid(0.5) = 0.62 > tau_train, every FFN runs at first
    tau_train: float = 0.5  # the threshold the gates are trained against (and the runtime starts from)
    peak_layers: tuple[int, ...] = (-1,)  # layers whose attention peak makes a_t (one: the graph reads its QK)
    rounds: int = 40  # on-policy rounds, one optimizer step each (~20 s per round for SmolLM2-135M)
    rollout: int = 8  # continuations the gated model samples per round
    micro_batch: int = 2  # sequences per backward (gradient accumulation over the rollout)
    prompt_tokens: int = 32  # prompt length cut from the training text
    new_tokens: int = 64  # continuation length (the tokens trained on)
    lr: float = 3e-3  # adapters only (backbone frozen); 1e-2 moved the channel scales so far that KL hit 0.5
    # the gate rows' learning rate over lr. At 1 (lr for them too) SmolLM2's gates ended 40 rounds within 0.01 of each
    # other across tokens (0.04 across layers), so tau skipped the same layers for every token. At 10 the budget term
    # shut 87 % of the FFN blocks within 5 rounds (token KL 4.4); 40 rounds brought them back to 49 % at KL 0.74, with
    # the adapters' scales left at perplexity 486 where every FFN runs (33 at 1). 1 until a schedule tames it.
    gate_gain: float = 1.0
    budget: float = 0.75  # executed-FFN fraction the budget term allows during training
    # the token KL's weight: the weights below were tuned while the KL term was summed over a micro-batch of 2
    # (twice the rollout's mean it is now); 2 keeps the balance they were tuned at
    weight_token_kl: float = 2.0
    weight_power_kl: float = 0.1  # KL(P_proxy || P_student)
    weight_budget: float = 10.0  # compute-budget term; at 2 the z-scored KL kept 99 % of FFN blocks on
    entropy_start: float = 0.01  # seed §3.3 entropy-weight schedule: start ...
    entropy_end: float = 0.08  # ... and end
    low_power_scale: float = 0.3  # gradient factor of tokens below mean power (seed §3.3); 1 = off
    zscore: bool = True  # z-score per-sample KL under gradient accumulation (seed §3.3)
    clip: bool = True  # square-root the power KL above 0.5 (seed §3.3)
    entropy_target: float | None = None  # nats; None = the target profile's power.entropy_target
    weights: tuple[float, float, float] = (0.25, 0.5, 0.25)  # alpha, beta, gamma while training
    sweep: tuple[tuple[float, float, float], ...] = (  # alpha, beta, gamma candidates for the runtime
        (0.25, 0.5, 0.25), (0.0, 1.0, 0.0), (0.5, 0.5, 0.0), (0.2, 0.6, 0.2))
    sweep_tokens: int = 160  # held-out tokens decoded per sweep point (teacher-forced, controller in the loop)
    max_nll_increase: float = 0.049  # sweep quality bound: ln(1.05), i.e. +5 % perplexity
    bucket_size: int = 64  # positions per c_t bucket
    profile_up_to: int = 1024  # longest cache length timed by the c_t profiler
    profile_buckets: int = 8  # cache lengths timed
    seed: int = 0  # prompts and sampling
    # keep the training in flight at most this often, at round boundaries (0: after every round)
    checkpoint_interval_s: float = 300.0

    def __post_init__(self):
        # each refusal names the setting and its value (the registry adds the stage and the fix's --set form)
        check_checkpoint_interval(self.checkpoint_interval_s)
        if self.rank < 1:
            raise ValueError(f"rank={self.rank}: the adapters' bottleneck width must be at least 1; set power.rank "
                             "to 1 or more (default 32)")
        if not 0 < self.max_fraction <= adapter.MAX_FRACTION:
            raise ValueError(f"max_fraction={self.max_fraction}: the adapters' largest share of the model must be in "
                             f"(0, {adapter.MAX_FRACTION}]; set power.max_fraction to e.g. 0.01 (the default)")
        if not 0 < self.tau_train < 1:
            raise ValueError(f"tau_train={self.tau_train}: the gates' threshold must be in (0, 1) (gates are "
                             "sigmoids); set power.tau_train to e.g. 0.5 (the default)")
        if not 0 < self.budget <= 1:
            raise ValueError(f"budget={self.budget}: the executed-FFN fraction allowed must be in (0, 1]; set "
                             "power.budget to e.g. 0.75 (the default)")
        # A fresh adapter gives every token the gate sigmoid(gate_init); below tau_train every FFN is skipped from
        # the first rollout, and Adam moves the gate logit by about lr a round, so the gates stay shut (tau_train
        # 0.7 with the default gate_init: no FFN block ran in any round of a tiny model's training).
        opened = 1.0 / (1.0 + math.exp(-self.gate_init)) if self.gate_init > -700 else 0.0
        if opened < self.tau_train:
            least = math.log(self.tau_train / (1.0 - self.tau_train))
            raise ValueError(f"gate_init={self.gate_init} starts every gate at sigmoid({self.gate_init}) = {opened:.3f}, "
                             f"below tau_train={self.tau_train}, so every FFN would be skipped from the first rollout; "
                             f"set power.gate_init above {least:.3f} (the logit of tau_train), e.g. {least + 0.5:.2f}")
        for name, least, what, why in (("rounds", 0, "on-policy rounds", " (0: no training)"),
                                       ("rollout", 1, "continuations sampled per round", ""),
                                       ("new_tokens", WINDOW, "tokens per continuation", " (one entropy window)")):
            if getattr(self, name) < least:
                raise ValueError(f"{name}={getattr(self, name)}: the {what} must be at least {least}{why}; set "
                                 f"power.{name} to {least} or more")
        if self.micro_batch < 1:  # train.train_adapters took max(1, ...): 0 or -4 quietly ran micro-batches of 1
            raise ValueError(f"micro_batch={self.micro_batch}: the sequences per backward pass (gradient accumulation "
                             f"over the rollout of {self.rollout}) must be at least 1; set power.micro_batch to 1 or "
                             "more (default 2)")
        if not self.max_nll_increase >= 0:  # NaN or below 0: no sweep point within it, the lowest NLL chosen unsaid
            raise ValueError(f"max_nll_increase={self.max_nll_increase}: the sweep's quality bound (nats of held-out "
                             "NLL over gating off) must be a number >= 0; set power.max_nll_increase to e.g. 0.049 "
                             "(+5 % perplexity, the default), or a large number for no bound")
        if not (math.isfinite(self.lr) and self.lr > 0):  # AdamW refused a negative one after the c_t profile
            raise ValueError(f"lr must be a positive finite number (the adapters' learning rate), got {self.lr}; "
                             "set power.lr to e.g. 0.003 (the default)")
        if isinstance(self.gate_gain, bool) or not (math.isfinite(self.gate_gain) and self.gate_gain > 0):
            raise ValueError(f"gate_gain={self.gate_gain!r}: the gate rows' learning rate over lr must be a positive "
                             "finite number; set power.gate_gain to e.g. 1 (the default: lr alone) or 3")
        # A negative loss weight ascends its term (moves the gates away from the target, over the budget);
        # a low-power factor below 0 does so for those tokens' KL, above 1 weights them more, not less.
        weights = ("weight_token_kl", "weight_power_kl", "weight_budget", "entropy_start", "entropy_end")
        signs = {name: getattr(self, name) for name in weights if not getattr(self, name) >= 0}
        if signs:
            raise ValueError(f"{', '.join(f'{k}={v}' for k, v in signs.items())}: loss weights must be >= 0 (0 "
                             "switches the term off); set " + ", ".join(f"power.{k} to 0 or more (default "
                                                                         f"{getattr(PowerConfig, k)})" for k in signs))
        if not 0 <= self.low_power_scale <= 1:
            raise ValueError(f"low_power_scale must be in [0, 1] (the gradient factor of tokens below mean power; "
                             f"1 = off), got {self.low_power_scale}; set power.low_power_scale to e.g. 0.3 (the "
                             "default) or 1 to switch the re-weighting off")
        if self.sweep_tokens < WINDOW:  # 0 or less decoded nothing: no point had an executed fraction, a TypeError
            raise ValueError(f"sweep_tokens={self.sweep_tokens}: the weight sweep decodes that many held-out tokens "
                             f"with the controller steering, which needs at least {WINDOW} (one entropy window); "
                             f"set power.sweep_tokens to {WINDOW} or more (default 160)")
        for weights in (self.weights, *self.sweep):
            if len(weights) != 3 or not all(math.isfinite(w) and w >= 0 for w in weights) or sum(weights) <= 0:
                raise ValueError(f"power weights (alpha, beta, gamma) must be three finite numbers >= 0 with a "
                                 f"positive sum, got {weights}; set power.weights and each power.sweep point to "
                                 "such a triple, e.g. [0.25, 0.5, 0.25] (the default weights)")
        if not self.sweep:
            raise ValueError("sweep needs at least one (alpha, beta, gamma) point, got none; set power.sweep to a "
                             "list of them, e.g. [[0.25, 0.5, 0.25], [0.0, 1.0, 0.0]]")
        small = {name: getattr(self, name) for name in ("prompt_tokens", "bucket_size", "profile_up_to",
                                                        "profile_buckets") if getattr(self, name) < 1}
        if small:  # bucket_size 0 divided by zero in the c_t profiler; profile_buckets 0 made c_t zero
            raise ValueError(f"{', '.join(f'{k}={v}' for k, v in small.items())}: each must be at least 1; set "
                             + ", ".join(f"power.{k} to 1 or more (default {getattr(PowerConfig, k)})"
                                         for k in small))
        # c_t is the slope of a line through step times at several cache lengths: one length gives none (c_t 0
        # at every position), and a bucket wider than profile_up_to timed a cache longer than the profiling graph.
        if self.profile_buckets < 2:
            raise ValueError(f"profile_buckets={self.profile_buckets}: the c_t profiler fits a line through the "
                             "decode-step times at that many cache lengths, and one gives no slope (c_t 0 at every "
                             "position); set power.profile_buckets to 2 or more (default 8)")
        if self.profile_up_to < 2 * self.bucket_size:
            raise ValueError(f"profile_up_to={self.profile_up_to} with bucket_size={self.bucket_size}: the c_t profiler "
                             "times one cache length per bucket below profile_up_to and needs two buckets; raise "
                             f"power.profile_up_to to {2 * self.bucket_size} or more, or lower power.bucket_size to "
                             f"{max(1, self.profile_up_to // 2)} or less")
        if self.entropy_target is not None:
            check_entropy_target(self.entropy_target)


if adapter.restore_adapters not in checkpoint.LOAD_HOOKS:  # adapters survive a resumed build
    checkpoint.LOAD_HOOKS.append(adapter.restore_adapters)


def _drop_gguf_marker(model) -> None:
    """A GGUF source is de-quantized to float32 when loaded, but transformers keeps it marked as
    quantized and refuses ``save_pretrained`` (the stage checkpoint). The weights are plain
    float32: drop the marker so the checkpoint writes them as they are."""
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config


@register_stage("power", PowerConfig, description="per-token FFN gates trained on-policy (seed 000)")
def power_stage(model, config: PowerConfig, ctx: BuildContext):
    torch.manual_seed(config.seed)
    _drop_gguf_marker(model)
    target = config.entropy_target or float(ctx.profile.power.entropy_target)
    try:  # a profile written before its schema checked the floor: refused here, not by the sweep after training
        check_entropy_target(target)
    except ValueError as exc:
        raise BuildError(f"{ctx.profile.name}'s power.entropy_target: {exc}",
                         "set power.entropy_target in the target profile (or "
                         f"{checkpoint.said('--set', ctx.terms, 'power.entropy_target=...')}) inside that range") from exc
    data = ctx.training_data()
    ids, bos = data.ids, data.bos_id  # bos: None where the tokenizer puts no BOS first (SmolLM2)
    held = min(max(config.sweep_tokens + 1, 64), ids.numel() // 5)
    pool, heldout = ids[:-held], ids[-held:]  # the sweep's tokens are never trained on
    if pool.numel() < config.prompt_tokens or held < WINDOW + 2:  # a pool of one prompt gives that prompt
        raise BuildError(f"the power stage has {ids.numel()} training tokens, too few for prompts of "
                         f"{config.prompt_tokens} and a held-out sweep of at least {WINDOW + 2} tokens (one fifth)",
                         "pass more --data text or lower power.prompt_tokens" if ctx.terms != "python" else
                         "pass more training text in data, or lower power.prompt_tokens "
                         f"({checkpoint.said('--set', ctx.terms, 'power.prompt_tokens=N')})")
    max_context = int(getattr(model.config, "max_position_embeddings", 4096))
    if buckets_timeable(max_context, config.bucket_size, config.profile_up_to) < 2:
        raise BuildError(f"the model's context of {max_context} positions holds fewer than two c_t buckets of "
                         f"power.bucket_size={config.bucket_size} positions to time decode steps in, and the c_t "
                         "profiler's cost line needs two (with one, c_t is 0 at every position)",
                         f"lower power.bucket_size to {max(1, (max_context - REPEATS - 1) // 2)} or less")
    train_config = train.PowerTrainConfig(
        rounds=config.rounds, rollout=config.rollout, micro_batch=config.micro_batch,
        prompt_tokens=config.prompt_tokens, new_tokens=config.new_tokens, lr=config.lr, gate_gain=config.gate_gain,
        tau_train=config.tau_train,
        budget=config.budget, entropy_target=target, weight_token_kl=config.weight_token_kl,
        weight_power_kl=config.weight_power_kl,
        weight_budget=config.weight_budget, entropy_start=config.entropy_start, entropy_end=config.entropy_end,
        low_power_scale=config.low_power_scale, zscore=config.zscore, clip=config.clip, seed=config.seed,
        bos_id=bos, checkpoint_interval_s=config.checkpoint_interval_s)
    eos = sorted(eos_ids(model, ctx.tokenizer))
    pad = ctx.tokenizer.pad_token_id if ctx.tokenizer.pad_token_id is not None else (eos[0] if eos else 0)
    # the rounds a stopped build trained, with the c_t profile and scales they trained on: measured again, the
    # profile (timings) would differ, and the rounds left would train on another p_t than those kept
    keeper = current_progress()
    identity, kept = train.read_kept(keeper, train_config, pool, eos, pad) if keeper is not None else (None, None)
    if kept is not None:
        cost = CostStats(**kept["info"]["cost"])
    else:
        cost = measure_kv_cost(model, max_context, config.bucket_size, config.profile_up_to, config.profile_buckets)

    rank = adapter.adapter_rank(model, config.rank, config.max_fraction)
    state = adapter.install_adapters(model, rank, config.gate_init, config.peak_layers, terms=ctx.terms)
    backbone = sum(p.numel() for n, p in model.named_parameters() if ".power_adapter." not in n)
    width = min(128, max_context)  # rows of 128 tokens, or of the model's positions where it has fewer
    calib = pool[: 4 * width].reshape(-1, width) if pool.numel() >= 4 * width else pool[None, : min(pool.numel(), width)]
    if bos is not None:  # each row as the runtime reads a text: after BOS
        calib = calib.clone()
        calib[:, 0] = bos
    peak_scale, ffn_scales = train.calibrate_scales(model, state, calib)
    if kept is not None:
        peak_scale, ffn_scales = float(kept["info"]["peak_scale"]), [float(v) for v in kept["info"]["ffn_scales"]]
    span = min(config.profile_up_to, max_context)
    cost_scale = max(float(cost.cost(torch.arange(span).numpy()).mean()), 1e-6)
    info = train.PowerModelInfo(weights=tuple(config.weights), peak_scale=peak_scale, ffn_scales=ffn_scales,
                                cost_scale=cost_scale, cost=cost)
    log = train.train_adapters(model, state, info, pool, train_config, eos, pad, ctx.progress, kept, identity)

    def make_controller():
        return TauController(ControllerConfig(entropy_target=target, tau_init=config.tau_train))

    sweep_ids = heldout[: config.sweep_tokens + 1]
    if bos is not None:  # the sweep decodes its text after BOS, as the runtime does
        sweep_ids = torch.cat([torch.tensor([bos], dtype=sweep_ids.dtype), sweep_ids[:-1]])
    chosen, points = train.sweep_weights(model, state, info, sweep_ids, make_controller, list(config.sweep),
                                         config.max_nll_increase)
    info.weights = chosen
    settings = {
        "rank": rank, "gate_init": config.gate_init, "peak_layers": list(state.peak_layers),
        "tau_init": config.tau_train, "weights": list(chosen), "peak_scale": peak_scale,
        "ffn_scales": ffn_scales, "cost_scale": cost_scale, "cost": cost.to_json(),
        "window": WINDOW, "smooth": SMOOTH, "floor": FLOOR, "entropy_target": target,
    }
    setattr(model.config, adapter.CONFIG_KEY, settings)
    ctx.metrics.update({
        "adapter_parameters": adapter.adapter_count(model), "adapter_fraction": round(
            adapter.adapter_count(model) / backbone, 5), "rank": rank, "entropy_target": target,
        "train": log.rounds, "sweep": points, "weights": list(chosen),
        "kv_cost_ms_per_token": cost.slope_ms_per_token,
    })
    eval_ids = ctx.eval_ids()
    ctx.metrics.update(stage_metrics(model, None))  # the report's row: parameters (adapters too), bytes, layers
    if holds_a_window(eval_ids):  # beside the manifest's baseline (no adapters)
        # measured as every other stage's row is: with the fake quantization recorded by then on
        with fake_quantization_on(model):
            # gating off: the loaded model (no adapter acts); tau 0: every FFN runs, the adapters' scales act
            ctx.metrics["heldout"] = {"gating_off": train.gated_heldout(model, state, eval_ids, ADAPTERS_OFF_TAU),
                                      "every_ffn": train.gated_heldout(model, state, eval_ids, 0.0),
                                      "at_tau_train": train.gated_heldout(model, state, eval_ids, config.tau_train)}
            ctx.metrics["heldout_perplexity"] = ctx.metrics["heldout"]["gating_off"]["perplexity"]
            # the report's quality / compute curve: held-out perplexity against the FFN blocks run, over tau
            known = {config.tau_train: ctx.metrics["heldout"]["at_tau_train"], 0.0: ctx.metrics["heldout"]["every_ffn"]}
            ctx.metrics["curve"] = [known.get(tau) or train.gated_heldout(model, state, eval_ids, tau)
                                    for tau in sorted({0.0, config.tau_train, *CURVE_TAUS})]
            ctx.metrics["sample_power"] = train.sample_power(model, state, info, eval_ids[:SAMPLE_TOKENS])
    return model


@contextlib.contextmanager
def fake_quantization_on(model):
    """The fake quantization an earlier stage recorded (a qat stage before this one), switched on while the block
    runs and off again after (weights untouched), as ``compress/measure.py`` ``quantized_heldout_perplexity`` scores
    every other stage's row: the report states its held-out perplexity "with the fake quantization recorded by then
    on". Measured plain, a power stage after QAT reported its row (gating off: the QAT model itself) in float
    activations, another figure than the qat row above it for the same function. A model with none is as it is, and
    so is one whose build exports float32 (``compress/measure.py`` ``computed_scheme``: that graph computes the baked
    weights with float activations, and the qat row is measured so)."""
    from edgesdk.compress.fake_quant import CONFIG_KEY, QuantLinear, QuantScheme, attach, detach

    scheme = computed_scheme(QuantScheme.of(model), _EXPORT.get())
    if scheme is None or any(isinstance(module, QuantLinear) for module in model.modules()):
        yield
        return
    recorded = getattr(model.config, CONFIG_KEY)
    attach(model, scheme)
    try:
        yield
    finally:
        detach(model, bake=False)
        setattr(model.config, CONFIG_KEY, recorded)  # the scheme as the earlier stage left it
