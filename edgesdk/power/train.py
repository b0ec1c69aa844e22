"""On-policy training of the power adapters (seed 000 §2.2, §3.3, §4.3).

One round: the gated model (threshold ``tau_train``) samples continuations of prompts cut from
the training text (on-policy: the tokens trained on are the gated model's own); on those tokens
the frozen backbone without adapters gives the target distributions and the student power
distribution, and the gated model (straight-through gates) is trained on

    L = z(w_t * KL(ungated || gated))            token KL, low-power tokens weighted 0.3, z-scored
      + lambda_p * clip(KL(P_proxy || P_student)) power KL, square-rooted above 0.5
      + lambda_H(progress) * (H(P_proxy) - target)^2
      + lambda_B * max(0, executed - budget)

with gradient accumulation over micro-batches: every term is the round's, whatever the split (the budget
hinge on the round's executed fraction, counted by a gated pass without gradients before the first
backward). Every stabiliser can be switched off (``PowerTrainConfig``) so their effect can be measured.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from edgesdk.compress.measure import heldout_perplexity
from edgesdk.errors import BuildError
from edgesdk.evaluate import exp_or_inf
from edgesdk.power import losses, vector
from edgesdk.power.adapter import (
    PowerState,
    adapter_named_parameters,
    adapter_parameters,
    fold_gate_gain,
    set_gate_gain,
)
from edgesdk.power.distribution import FLOOR, SMOOTH, WINDOW


@dataclass
class PowerModelInfo:
    """What turns recorded components into p_t (stored in the bundle's power.json)."""

    weights: tuple[float, float, float]  # alpha, beta, gamma
    peak_scale: float  # mean attention peak a_t, ungated, on calibration text
    ffn_scales: list[float]  # mean FFN output norm per layer, ungated
    cost_scale: float  # mean c_t over the calibration positions
    cost: object  # profiler.CostStats
    window: int = WINDOW
    smooth: int = SMOOTH
    floor: float = FLOOR

    def components(self, state: PowerState, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                              torch.Tensor]:
        """(a_t / â, f_t, c_t / ĉ) from a recorded forward: each (B, T)."""
        peak = torch.stack(state.peaks).mean(0) / self.peak_scale
        scales = torch.tensor(self.ffn_scales, dtype=peak.dtype)
        ffn = (torch.stack(state.ffn_norms, -1) / scales).mean(-1)  # (B, T, L) -> (B, T)
        cost = torch.from_numpy(self.cost.cost(positions.numpy())).to(peak.dtype) / self.cost_scale
        return peak, ffn, cost

    def power(self, state: PowerState, positions: torch.Tensor, weights=None) -> torch.Tensor:
        a, f, c = self.components(state, positions)
        alpha, beta, gamma = weights or self.weights
        return alpha * a + beta * f + gamma * c


@dataclass(frozen=True)
class PowerTrainConfig:
    rounds: int = 8  # rollout rounds (one optimizer step each)
    rollout: int = 8  # sequences the gated model generates per round
    micro_batch: int = 2  # sequences per backward; rollout / micro_batch micro-batches accumulate
    prompt_tokens: int = 32
    new_tokens: int = 64
    top_p: float = 0.95
    temperature: float = 1.0
    lr: float = 3e-3
    gate_gain: float = 1.0  # the gate rows' learning rate over lr (adapter.set_gate_gain)
    tau_train: float = 0.5
    budget: float = 0.6
    entropy_target: float = 1.5
    weight_token_kl: float = 2.0  # the balance the other weights were tuned at (the KL counted micro_batch=2 times)
    weight_power_kl: float = 0.1
    weight_budget: float = 2.0
    entropy_start: float = 0.01
    entropy_end: float = 0.08
    low_power_scale: float = 0.3  # 1.0 switches the re-weighting off
    zscore: bool = True
    clip: bool = True
    seed: int = 0
    bos_id: int | None = None  # the token the tokenizer puts first (Gemma, Llama 2): every prompt starts with it
    checkpoint_interval_s: float = 300.0  # inside a build: keep the training in flight at most this often


@dataclass
class TrainLog:
    rounds: list[dict] = field(default_factory=list)

    def last(self, key: str, n: int = 3) -> float:
        values = [r[key] for r in self.rounds[-n:] if r[key] is not None]  # None: not measured that round
        return float(np.mean(values)) if values else float("nan")


def sample_prompts(pool: torch.Tensor, count: int, length: int, generator: torch.Generator,
                   bos_id: int | None = None) -> torch.Tensor:
    """``count`` prompts of ``length`` tokens cut from ``pool`` at random starts, (N, prompt). With ``bos_id``
    (a tokenizer that puts BOS first) each prompt's first token is replaced by it, as the runtime always decodes
    after BOS (edgesdk/compress/data.py ``TokenData.batches``, llama.cpp's chunks)."""
    if pool.numel() < length:
        raise BuildError(f"the power stage's text has {pool.numel()} tokens, fewer than one prompt of {length}",
                         "pass more --data text or lower power.prompt_tokens")
    # every start from 0 to the last whole prompt's, pool.numel() - length (randint's high is exclusive)
    starts = torch.randint(0, pool.numel() - length + 1, (count,), generator=generator)
    prompts = torch.stack([pool[s: s + length] for s in starts.tolist()])  # (N, prompt): copies of the pool
    if bos_id is not None and length > 1:
        prompts[:, 0] = bos_id
    return prompts


@torch.no_grad()
def rollout(model, state: PowerState, prompts: torch.Tensor, config: PowerTrainConfig, eos_ids: list[int],
            pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated model's own continuations: (ids (N, P+T), loss mask (N, P+T) over generated tokens)."""
    state.enabled, state.straight_through, state.record, state.tau = True, False, False, config.tau_train
    state.clear()
    out = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, top_p=config.top_p,
                         temperature=config.temperature, max_new_tokens=config.new_tokens, min_new_tokens=1,
                         pad_token_id=pad_id, eos_token_id=eos_ids or None)
    state.clear()
    generated = out[:, prompts.shape[1]:]
    mask = torch.ones_like(generated, dtype=torch.float32)
    if eos_ids:  # tokens after the first EOS are padding
        is_eos = torch.isin(generated, torch.tensor(eos_ids))
        after = (is_eos.cumsum(-1) - is_eos.long()) > 0
        mask[after] = 0.0
    full_mask = torch.cat([torch.zeros(prompts.shape, dtype=torch.float32), mask], dim=1)
    return out, full_mask


def power_windows(p_proxy: torch.Tensor, p_student: torch.Tensor, loss_mask: torch.Tensor, prompt: int,
                  info: PowerModelInfo) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(P_proxy, P_student, window mask) over the generated tokens of a rollout: (b, T) -> (b, n, window).

    The prompt (the first ``prompt`` positions, masked out of P) is cut off first, so the windows
    start at the first generated token whatever the prompt length; otherwise a prompt that is not a
    multiple of the window leaves a window holding only its last few generated tokens (entropy
    capped at ln of their count, below the target) and the tail of the continuation outside every window.

    The powers are smoothed before the cut, over the prompt and the continuation together, as the runtime's
    controller smooths the stream it observes (a prompt's powers included): the first generated token is averaged
    with the prompt's last. Smoothed after the cut, it stood alone, and the first window's entropy was not the one
    the runtime holds (1.62 nats against 1.02 after a prompt ending on a power spike).
    """
    read = loss_mask.clone()
    read[:, :prompt] = 1.0  # (b, P+T): the prompt's powers are read by the smoothing, not scored
    mask = loss_mask[:, prompt:]
    cut = [vector.smooth(p, read, info.smooth)[:, prompt:] for p in (p_proxy, p_student)]  # (b, T) each
    # width 1: already smoothed
    P_proxy, wm = vector.windowed(cut[0], mask, info.window, 1, info.floor)
    P_student, _ = vector.windowed(cut[1], mask, info.window, 1, info.floor)
    return P_proxy, P_student, wm


def window_terms(P_proxy: torch.Tensor, P_student: torch.Tensor, window_mask: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """KL(P_proxy || P_student) and H(P_proxy) of the whole windows of :func:`power_windows` (each (n,)).

    Whole windows only, for both terms, as the runtime measures its entropy. A rollout that ends
    early is padded to the longest one in its micro-batch; its last window is then partial, and
    the same rollout unpadded (alone, or in a batch it ends last) has that tail outside every
    window. Counting partial windows would make a row's power KL depend on the rows beside it.
    """
    full = window_mask.sum(-1) == window_mask.shape[-1]  # (b, n)
    return vector.power_kl(P_proxy, P_student, window_mask)[full], vector.entropy(P_proxy)[full]


def whole_windows(loss_mask: torch.Tensor, prompt: int, window: int) -> int:
    """How many whole windows of generated tokens the rollouts hold (N, P+T): the windows :func:`window_terms` scores,
    counted over the whole round, so every micro-batch's share of the power terms is its windows over this."""
    mask = loss_mask[:, prompt:]
    n = (mask.shape[-1] // window) * window
    windows = mask[:, :n].reshape(mask.shape[0], n // window, window)  # (N, T/W, W)
    return int((windows.sum(-1) == window).sum())


def _forward(model, state: PowerState, ids: torch.Tensor, valid: torch.Tensor, *, gated: bool):
    state.clear()
    state.enabled, state.record = gated, True
    state.straight_through = gated
    logits = model(ids, attention_mask=valid.long(), use_cache=False).logits
    return logits


@torch.no_grad()
def executed_blocks(model, state: PowerState, ids: torch.Tensor, valid: torch.Tensor, loss_mask: torch.Tensor,
                    micro: int) -> float:
    """How many FFN blocks the gated model runs on the generated tokens of a rollout (N, P+T) at the threshold in
    force: the forward value of the straight-through masks the training pass computes, summed over tokens and
    layers, in micro-batches of ``micro`` sequences."""
    run = 0.0
    for start in range(0, ids.shape[0], micro):
        part = slice(start, start + micro)
        _forward(model, state, ids[part], valid[part], gated=True)
        masks = torch.stack(state.masks, -1)  # (b, T, L)
        run += float((masks * loss_mask[part].unsqueeze(-1)).sum())
    state.clear()
    return run


def kept_identity(keeper, config: PowerTrainConfig, pool: torch.Tensor, eos_ids: list[int], pad_id: int) -> str:
    """What a kept training of the rounds must have been made under: the build's inputs to the stage
    (``keeper.identity``), the training's settings, the text the prompts are cut from and the stop and pad tokens."""
    from edgesdk.compress.train import KEPT_LAYOUT, PROGRESS_ONLY_FIELDS

    digest = hashlib.sha256()
    settings = {k: v for k, v in asdict(config).items() if k not in PROGRESS_ONLY_FIELDS}
    digest.update(json.dumps([KEPT_LAYOUT, "rounds", keeper.stage, keeper.identity, settings, eos_ids, pad_id,
                              list(pool.shape), str(pool.dtype)]).encode())
    digest.update(pool.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def read_kept(keeper, config: PowerTrainConfig, pool: torch.Tensor, eos_ids: list[int], pad_id: int
              ) -> tuple[str, dict | None]:
    """The identity of the rounds a build's ``keeper`` (edgesdk/compress/train.py TrainingProgress) keeps, and the
    training a stopped build kept under it (None where there is none, or none of this stage's inputs)."""
    keeper.unit, keeper.total = "round", config.rounds
    identity = kept_identity(keeper, config, pool, eos_ids, pad_id)
    return identity, keeper.read(identity)


def train_adapters(model, state: PowerState, info: PowerModelInfo, pool: torch.Tensor, config: PowerTrainConfig,
                   eos_ids: list[int], pad_id: int, progress: bool = False, kept: dict | None = None,
                   identity: str | None = None) -> TrainLog:
    """Train the adapters in place (backbone frozen); returns per-round measurements. The gate rows train
    ``config.gate_gain`` times faster than the other adapter weights, folded back into them at the end.

    Inside a build (edgesdk/compress/train.py ``keeping_progress``) the training in flight is kept at round
    boundaries (a round is one optimizer step on its own rollout: a round cut short is trained again), at most every
    ``config.checkpoint_interval_s`` seconds, when the build is stopped and once the last round is done; ``kept``
    (:func:`read_kept`, under ``identity``) is the training a stopped build kept, and the
    rounds go on from it to the same adapters as a training run straight through on the same ``info``."""
    for p in model.parameters():
        p.requires_grad_(False)
    params = adapter_parameters(model)
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    set_gate_gain(model, config.gate_gain)
    try:
        return _train_rounds(model, state, info, pool, config, eos_ids, pad_id, params, optimizer, progress, kept,
                             identity)
    finally:
        fold_gate_gain(model)  # the gates as proj2 alone gives them: what the export reads


def _train_rounds(model, state: PowerState, info: PowerModelInfo, pool: torch.Tensor, config: PowerTrainConfig,
                  eos_ids: list[int], pad_id: int, params: list, optimizer, progress: bool, kept: dict | None,
                  identity: str | None) -> TrainLog:
    """The on-policy rounds of :func:`train_adapters`, one optimizer step each."""
    from tqdm import tqdm

    from edgesdk.compress.train import (
        _module_state,
        _restore,
        _rng_states,
        _set_rng_states,
        _stops_held,
        current_progress,
    )

    generator = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)
    running = losses.RunningZ()
    log = TrainLog()
    micro = max(1, min(config.micro_batch, config.rollout))
    keeper = current_progress() if identity is not None else None
    named = adapter_named_parameters(model)
    done = 0
    if keeper is not None and kept is not None:  # read_kept gave the keeper its unit (round) and total
        def restore() -> None:
            _restore(kept, model, named, optimizer)
            generator.set_state(kept["generator"])
            _set_rng_states(kept["rng"])
            running.__dict__.update(kept["running"])

        if keeper.take(kept, restore) is not None:
            done, log.rounds = kept["batch"], list(kept["rounds"])

    def boundary() -> dict:  # what the next round starts from besides the weights and the optimizer
        return {"generator": generator.get_state(), "rng": _rng_states(), "running": dict(vars(running)),
                "modules": _module_state(model)}

    reached = boundary() if keeper is not None else None
    last_kept = time.monotonic()

    def keep() -> None:
        keeper.write({"identity": identity, "batch": done, "rounds": log.rounds[:done],
                      "info": {"cost": asdict(info.cost), "peak_scale": info.peak_scale,
                               "ffn_scales": list(info.ffn_scales)},
                      "params": {name: p.detach() for name, p in named.items()}, "optimizer": optimizer.state_dict(),
                      **reached})

    try:
        for round_index in tqdm(range(done, config.rounds), desc="power adapters", disable=not progress,
                                unit="round", total=config.rounds, initial=done):
            def stepped(index: int = round_index) -> None:  # inside the step's held stops: the boundary, whole
                nonlocal done, reached
                done, reached = index + 1, boundary() if keeper is not None else None

            _train_round(model, state, info, pool, config, eos_ids, pad_id, params, optimizer, generator, running,
                         log, micro, round_index, stepped)
            if keeper is not None and time.monotonic() - last_kept >= config.checkpoint_interval_s:
                keep()
                last_kept = time.monotonic()
                if not progress:  # the bar shows the rounds; without it, this line
                    keeper.tell_kept(done)
    except (KeyboardInterrupt, SystemExit):  # stopped (Ctrl-C, SIGTERM): keep the last round boundary reached
        if keeper is not None and done and done != keeper.kept:
            keep()
        raise
    if keeper is not None and done != keeper.kept:
        # the finished rounds, kept until the stage's checkpoint is recorded: a build stopped in the weight sweep or
        # the checkpoint's write goes on from them, not from the last keep
        with _stops_held():
            keep()
    for p in params:
        p.requires_grad_(False)
    state.enabled, state.record, state.straight_through, state.tau = True, False, False, 0.0
    state.clear()
    return log


def _train_round(model, state: PowerState, info: PowerModelInfo, pool: torch.Tensor, config: PowerTrainConfig,
                 eos_ids: list[int], pad_id: int, params: list, optimizer, generator: torch.Generator,
                 running: losses.RunningZ, log: TrainLog, micro: int, round_index: int,
                 stepped: Callable[[], None]) -> None:
    """One on-policy round of :func:`_train_rounds`: a rollout, its losses and one optimizer step, logged in ``log``.
    The step, its log entry and ``stepped`` (the boundary it reaches) are taken together: a build stopped in the round
    stops before or after all of them."""
    from edgesdk.compress.train import _stops_held

    started = time.perf_counter()
    progress_frac = round_index / max(config.rounds - 1, 1)
    w_entropy = losses.entropy_weight(progress_frac, config.entropy_start, config.entropy_end)
    model.eval()
    prompts = sample_prompts(pool, config.rollout, config.prompt_tokens, generator, config.bos_id)
    ids, loss_mask = rollout(model, state, prompts, config, eos_ids, pad_id)
    valid = torch.ones_like(loss_mask)
    if eos_ids:  # attention sees prompt + generated tokens up to and including the first EOS
        valid = torch.cat([torch.ones(prompts.shape), loss_mask[:, prompts.shape[1]:]], 1)
        first_pad = (valid == 0).float().argmax(-1)
        for row, col in enumerate(first_pad.tolist()):
            if valid[row, col] == 0:
                valid[row, col] = 1.0  # the first pad after the EOS (loss_mask holds the EOS): masked out of every loss term
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    optimizer.zero_grad(set_to_none=True)
    record = {"token_kl": 0.0, "executed": 0.0, "loss": 0.0}
    # The power KL and the entropy exist only in windows: the log has their mean over the round's windows
    # (None without any); a micro-batch whose rollouts all ended early counted 0 in it (an entropy of 0
    # reads as all the power on one token).
    power_kls, entropies = [], []
    chunks = list(range(0, ids.shape[0], micro))
    windows = max(whole_windows(loss_mask, prompts.shape[1], info.window), 1)
    round_blocks = float(loss_mask.sum()) * state.num_layers  # (generated token, layer) blocks of the round
    # the round's executed fraction, for the budget term: one more gated pass, skipped where the term is off
    round_executed = executed_blocks(model, state, ids, valid, loss_mask, micro) / max(round_blocks, 1.0) \
        if config.weight_budget else None
    for start in chunks:
        part = slice(start, start + micro)
        x, vm, lm, pos = ids[part], valid[part], loss_mask[part], positions[part]
        with torch.no_grad():
            teacher_logits = _forward(model, state, x, vm, gated=False)
            p_student = info.power(state, pos)  # (b, T)
        student_logits = _forward(model, state, x, vm, gated=True)
        p_proxy = info.power(state, pos)
        masks = torch.stack(state.masks, -1)  # (b, T, L) straight-through executed flags
        # Row t predicts token t+1: score predictions of generated tokens.
        pred_mask = lm[:, 1:]
        kl_tok = losses.token_kl(teacher_logits[:, :-1], student_logits[:, :-1])  # (b, T-1)
        weights = losses.power_weights(p_student[:, :-1], pred_mask, config.low_power_scale)
        per_sample = (kl_tok * weights).sum(-1) / pred_mask.sum(-1).clamp_min(1)  # (b,)
        # A share of the rollout's mean: summed here and then divided by the number of micro-batches, the KL
        # term was micro_batch times that mean (its weight against the terms below moved with the setting),
        # and a short last micro-batch weighed its sequences more.
        kl_term = (running(per_sample) if config.zscore else per_sample).sum() / ids.shape[0]
        P_proxy, P_student, wm = power_windows(p_proxy, p_student, lm, prompts.shape[1], info)
        kl_pow, h = window_terms(P_proxy, P_student, wm)
        # shares of the means over the round's windows (a micro-batch's own mean, divided by the number of
        # micro-batches, weighed the windows of a short last micro-batch or of one with fewer windows more)
        power_term = entropy_term = torch.zeros(())
        if kl_pow.numel():
            kl_pow = losses.sqrt_clip(kl_pow) if config.clip else kl_pow
            power_term = kl_pow.sum() / windows
            power_kls.append(kl_pow.detach())
        if h.numel():
            entropy_term = losses.entropy_term(h, config.entropy_target).sum() / windows
            entropies.append(h.detach())
        run = (masks * lm.unsqueeze(-1)).sum()  # FFN blocks run on the generated tokens (straight-through)
        budget_term = torch.zeros(()) if round_executed is None else \
            losses.budget_share(run, lm.sum() * masks.shape[-1], round_executed, round_blocks, config.budget)
        loss = (config.weight_token_kl * kl_term + config.weight_power_kl * power_term + w_entropy * entropy_term
                + config.weight_budget * budget_term)
        loss.backward()
        record["token_kl"] += float(per_sample.detach().sum()) / ids.shape[0]
        record["executed"] += float(run.detach()) / max(round_blocks, 1.0)  # the round's fraction, not a mean of
        # the micro-batches' (a short last one, or one whose rollouts ended early, counted as much as a full one)
        record["loss"] += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    record.update(power_kl=float(torch.cat(power_kls).mean()) if power_kls else None,  # None: no window
                  entropy=float(torch.cat(entropies).mean()) if entropies else None)
    with _stops_held():
        optimizer.step()
        state.clear()
        record.update(round=round_index, entropy_weight=w_entropy, seconds=round(time.perf_counter() - started, 2))
        log.rounds.append({k: (round(v, 5) if isinstance(v, float) else v) for k, v in record.items()})
        stepped()


@torch.no_grad()
def calibrate_scales(model, state: PowerState, ids: torch.Tensor) -> tuple[float, list[float]]:
    """Mean attention peak and mean FFN output norm per layer of the ungated model on ``ids`` (B, T)."""
    _forward(model, state, ids, torch.ones_like(ids, dtype=torch.float32), gated=False)
    peak = float(torch.stack(state.peaks).mean())
    ffn = [max(float(n.mean()), 1e-6) for n in state.ffn_norms]
    state.clear()
    state.record = False
    state.enabled = True
    return max(peak, 1e-6), ffn


@torch.no_grad()
def controlled_decode(model, state: PowerState, info: PowerModelInfo, ids: torch.Tensor, controller,
                      weights=None) -> dict:
    """Teacher-forced decode of ``ids`` (T,) token by token with the controller setting tau each step.

    Returns the mean NLL of the tokens, the executed FFN fraction and the controller's summary:
    the latency-quality point of one setting.
    """
    from transformers import DynamicCache

    state.enabled, state.straight_through, state.record = True, False, True
    controller.reset()
    cache = DynamicCache()
    nll, count = 0.0, 0
    for t in range(ids.shape[0] - 1):
        state.clear()
        state.tau = controller.tau
        kwarg = {"cache": cache} if _takes_cache(model) else {"past_key_values": cache}
        logits = model(ids[t: t + 1][None], use_cache=True, **kwarg).logits[0, -1]
        nll += float(torch.log_softmax(logits.float(), -1)[ids[t + 1]].neg())
        count += 1
        p = info.power(state, torch.tensor([[t]]), weights)
        executed = torch.stack(state.masks, -1)[0, 0].numpy()
        controller.observe(float(p[0, 0]), executed)
    state.clear()
    state.record = False
    state.tau = 0.0
    return {"nll": nll / max(count, 1), **controller.summary()}


def _takes_cache(model) -> bool:
    import inspect

    return "cache" in inspect.signature(model.forward).parameters


def sweep_weights(model, state: PowerState, info: PowerModelInfo, ids: torch.Tensor, make_controller,
                  grid: list[tuple[float, float, float]], max_nll_increase: float) -> tuple[tuple, list[dict]]:
    """Latency-quality sweep of (alpha, beta, gamma) on validation tokens ``ids`` (T,).

    Each setting runs :func:`controlled_decode`; the chosen one executes the fewest FFN blocks
    among those within ``max_nll_increase`` nats of the ungated NLL (else the lowest NLL). Ungated is
    gating off, the loaded model (``ADAPTERS_OFF_TAU``), as the runtime runs it: ``tau`` 0 would keep
    the adapters' channel and head scales, a reference that already carries their cost.
    """
    from edgesdk.power.controller import ADAPTERS_OFF_TAU, ControllerConfig, TauController

    off = ControllerConfig(tau_init=ADAPTERS_OFF_TAU, tau_min=ADAPTERS_OFF_TAU, tau_max=ADAPTERS_OFF_TAU)
    base = controlled_decode(model, state, info, ids, TauController(off))
    points = []
    for weights in grid:
        point = controlled_decode(model, state, info, ids, make_controller(), weights)
        point.update(weights=list(weights), nll_increase=round(point["nll"] - base["nll"], 5))
        points.append(point)
    ok = [p for p in points if p["nll_increase"] <= max_nll_increase]
    best = min(ok, key=lambda p: p["executed_fraction"]) if ok else min(points, key=lambda p: p["nll"])
    return tuple(best["weights"]), [{"ungated_nll": round(base["nll"], 5)}, *points]


@torch.no_grad()
def gated_heldout(model, state: PowerState, ids: torch.Tensor, tau: float, length: int = 256) -> dict:
    """Held-out perplexity (windows of ``length``) with every gate below ``tau`` skipping its FFN,
    and the share of FFN blocks that ran; ``tau`` 0 runs every FFN with the adapters' channel and head scales,
    ``ADAPTERS_OFF_TAU`` (below 0) is gating off: the loaded model."""
    state.clear()
    state.enabled, state.straight_through, state.record, state.tau = True, False, True, tau
    perplexity = heldout_perplexity(model, ids, length)
    masks = [m.float().mean() for m in state.masks]  # one (1, length) mask per layer and window
    state.clear()
    state.record, state.tau = False, 0.0
    return {"perplexity": round(perplexity, 4), "tau": tau,
            "executed_fraction": round(float(torch.stack(masks).mean()), 4) if masks else 1.0}


def sample_power(model, state: PowerState, info: PowerModelInfo, ids: torch.Tensor) -> dict:
    """The power vector of a sample text (``ids`` (T,), read ungated, as training reads P_student; the proxy is the gated pass's): p_t per token,
    its distribution P within each window of ``info.window`` tokens (seed §2.2: smoothed, min-max plus the floor,
    L1) and each window's entropy in nats; what the bundle report plots."""
    before = state.enabled, state.straight_through, state.record
    with torch.no_grad():
        _forward(model, state, ids[None], torch.ones_like(ids[None], dtype=torch.bool), gated=False)
        positions = torch.arange(ids.shape[0])[None]  # (1, T)
        p = info.power(state, positions)  # (1, T)
        windows, _ = vector.windowed(p, torch.ones_like(p), info.window, info.smooth, info.floor)  # (1, T/W, W)
    state.clear()
    state.enabled, state.straight_through, state.record = before  # as the export finds it
    return {"p": [round(float(x), 5) for x in p[0]],
            "P": [round(float(x), 5) for x in windows[0].reshape(-1)],
            "entropy": [round(float(h), 4) for h in vector.entropy(windows[0])], "window": info.window}


def perplexity_of(nll: float) -> float:
    return exp_or_inf(nll)
