"""PowerAdapter: per-layer gates installed into a transformers Llama-family model (seed 000 §3.2).

Each decoder layer ``l`` gets a small adapter reading its post-attention hidden state (the
normalized input of the FFN, ``h``). It outputs, per token:

* ``gate``   (B, S)        per-token layer gate in (0, 1); at run time the layer's FFN is skipped
                           for the token when ``gate < tau`` (the threshold the runtime passes);
* ``scales`` (B, S, D)     channel scales of the FFN output (seed §3.2: "scale acts on every
                           channel of the FFN output");
* ``heads``  (B, S, H')    a soft mask on the pre-softmax attention scores of layer ``l + 1``
                           (one factor per query head, multiplying the query, hence every score
                           of that head: the seed's "mask on the softmax input"); absent for the
                           last layer.

Architecture (seed §3.2, two linear layers with a sigmoid between): ``z = sigmoid(h W1 + b1)``
(rank r), ``o = z W2 + b2`` split into [scales | heads | gate logit]. ``W2`` starts at zero and
``b2`` at 1 for the scales and heads and at ``gate_init`` for the gate logit, so a fresh adapter
leaves the model unchanged and its gates open.

Gating semantics (identical in PyTorch and in the exported graph):

    y_l = FFN_l(h) * scales * m,   m = 1[gate >= tau]          (tau >= 0)
    y_l = FFN_l(h)                                              (tau < 0: gating off, no scale acts)

so with gating off (the runtime's default) the model is the loaded one, not one whose channel and head scales were
trained for skipped FFNs.

During training ``m`` is the straight-through estimate ``1[gate >= tau] + gate - stopgrad(gate)``:
the forward value is the hard decision the runtime makes, the gradient reaches the gate.

The adapters are installed by swapping the class of the existing MLP and query-projection
modules (no weights move), so the model keeps its state-dict keys, ``save_pretrained`` writes the
adapters beside the backbone (``model.layers.{i}.mlp.power_adapter.*``) and the exporter reads
the backbone weights as before. ``model.config.edgesdk_power`` carries the adapter settings and
the power statistics (it is saved in config.json); :func:`restore_adapters` reinstalls them after
``from_pretrained``.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from edgesdk.build.checkpoint import said
from edgesdk.errors import BuildError

CONFIG_KEY = "edgesdk_power"
MAX_FRACTION = 0.05  # the largest power.max_fraction the stage accepts (stage.PowerConfig)


class PowerAdapter(nn.Module):
    """Two linear layers (D -> r -> D + H' + 1) with a sigmoid between (seed §3.2)."""

    def __init__(self, hidden_size: int, rank: int, next_heads: int, gate_init: float = 3.0):
        super().__init__()
        self.hidden_size, self.rank, self.next_heads = hidden_size, rank, next_heads
        self.proj1 = nn.Linear(hidden_size, rank)
        self.proj2 = nn.Linear(rank, hidden_size + next_heads + 1)
        with torch.no_grad():
            nn.init.normal_(self.proj1.weight, std=hidden_size ** -0.5)
            self.proj1.bias.zero_()
            self.proj2.weight.zero_()
            self.proj2.bias.fill_(1.0)
            self.proj2.bias[-1] = gate_init
        # The gate logit's token-dependent weights (proj2's last row) act times this while training (gate_gain):
        # Adam steps each weight by about lr whatever its gradient, so the row moves gain times faster than the
        # scales' rows; :func:`fold_gate_gain` folds it into the row, after which the gate is the plain proj2 one.
        self.gate_gain = 1.0

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """h (B, S, D) -> gate (B, S), scales (B, S, D), heads (B, S, H') or None."""
        z = torch.sigmoid(self.proj1(h))  # (B, S, r)
        out = self.proj2(z)  # (B, S, D + H' + 1)
        scales = out[..., : self.hidden_size]
        heads = out[..., self.hidden_size: self.hidden_size + self.next_heads] if self.next_heads else None
        logit = out[..., -1]  # (B, S)
        if self.gate_gain != 1.0:  # the row's contribution gate_gain times: (gain - 1) more of z . w
            logit = logit + (self.gate_gain - 1.0) * (z @ self.proj2.weight[-1])
        gate = torch.sigmoid(logit)
        return gate, scales, heads


@dataclass
class PowerState:
    """Shared by the gated modules of one model: the threshold, the mode and what a forward recorded."""

    head_dim: int
    num_layers: int
    peak_layers: tuple[int, ...]
    tau: float | torch.Tensor = 0.0  # threshold; 0 = every FFN runs (scales act); < 0 = gating off (none acts)
    enabled: bool = True  # False: the adapters are bypassed (the ungated model, the distillation target)
    straight_through: bool = False  # training: hard forward, gradient to the gate
    record: bool = False  # keep gates, masks, FFN norms and attention peaks of the next forward
    pending_heads: dict = field(default_factory=dict)  # layer -> (B, S, Hq*hd) query scales
    gates: list = field(default_factory=list)
    masks: list = field(default_factory=list)
    ffn_norms: list = field(default_factory=list)
    peaks: list = field(default_factory=list)

    def clear(self) -> None:
        self.pending_heads.clear()
        self.gates.clear()
        self.masks.clear()
        self.ffn_norms.clear()
        self.peaks.clear()


class GatedMLP(nn.Module):
    """A Llama MLP whose class was swapped in place: same children plus ``power_adapter``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        state: PowerState = self._power_state
        y = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))  # (B, S, D)
        if not state.enabled:
            if state.record:
                state.ffn_norms.append(y.norm(dim=-1))
            return y
        gate, scales, heads = self.power_adapter(x)
        if bool(state.tau < 0):  # gating off (ADAPTERS_OFF_TAU): the gates are read, nothing acts
            if state.record:
                state.gates.append(gate)
                state.masks.append(torch.ones_like(gate))
                state.ffn_norms.append(y.norm(dim=-1))
            return y
        y = y * scales
        hard = (gate >= state.tau).to(y.dtype)  # (B, S)
        # (gate - gate.detach()) is exactly 0 forward; hard + gate - gate.detach() rounded 1 + gate and read 0.99999994
        mask = hard + (gate - gate.detach()) if state.straight_through else hard
        if heads is not None:  # (B, S, H') -> (B, S, H'*hd): one factor per query channel
            state.pending_heads[self._power_index + 1] = heads.repeat_interleave(state.head_dim, dim=-1)
        if state.record:
            state.gates.append(gate)
            state.masks.append(mask)
            # ||y * m|| = m * ||y|| for m in {0, 1}; taken after masking, a skipped block's norm is
            # the norm of zeros, whose gradient is 0: its f_t would not depend on its gate.
            state.ffn_norms.append(y.norm(dim=-1) * mask)
        return y * mask.unsqueeze(-1)


class ScaledQueryProjection(nn.Linear):
    """``q_proj`` whose output is scaled per head by the previous layer's adapter (class swapped in place)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = super().forward(x)
        state = self._power_state
        scale = state.pending_heads.pop(self._power_index, None)
        return q if scale is None or not state.enabled else q * scale


def adapter_rank(model, rank: int, max_fraction: float) -> int:
    """The largest rank <= ``rank`` whose adapters stay within ``max_fraction`` of the model's parameters."""
    config = model.config
    layers = config.num_hidden_layers
    hidden = config.hidden_size
    heads = config.num_attention_heads
    budget = max_fraction * sum(p.numel() for n, p in model.named_parameters() if "power_adapter" not in n)
    # per layer: D*r + r + r*(D + H + 1) + (D + H + 1)
    per_rank = layers * (2 * hidden + heads + 2)
    fixed = layers * (hidden + heads + 1)
    fitting = int((budget - fixed) // per_rank)
    if fitting < 1:
        params = budget / max_fraction
        least = (fixed + per_rank) / params  # the share rank-1 adapters take
        fix = (f"set power.max_fraction to {math.ceil(least * 1e4) / 1e4:g} or more" if least <= MAX_FRACTION else
               f"drop the power stage for this model (max_fraction stops at {MAX_FRACTION:g})")
        raise BuildError(f"power adapters cannot fit in power.max_fraction={max_fraction:g} ({max_fraction:.2%}) of "
                         f"a {params:,.0f}-parameter model even at rank 1: rank 1 takes {fixed + per_rank:,} "
                         f"parameters ({least:.2%})", fix)
    return min(rank, fitting)


def install_adapters(model, rank: int, gate_init: float = 3.0, peak_layers: tuple[int, ...] = (),
                     settings: dict | None = None, terms: str = "cli") -> PowerState:
    """Add a PowerAdapter to every decoder layer of ``model`` (in place) and return the shared state. ``terms``:
    whose names a refusal's fix gives the override, ``edgesdk build``'s (``--set``) or build_bundle()'s
    (``overrides=[...]``): BuildConfig.terms, as the build's context carries it."""
    inner = model.model
    layers = list(inner.layers)
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if not layers or not hasattr(layers[0], "mlp") or not hasattr(layers[0].mlp, "gate_proj"):
        raise BuildError(f"power adapters need a Llama-family decoder (SwiGLU MLP); got {type(model).__name__}",
                         "drop the power stage from the recipe for this model")
    if getattr(model, "_power_state", None) is not None:
        raise BuildError("power adapters are already installed in this model", "run the power stage once")
    outside = [p for p in peak_layers if not -len(layers) <= p < len(layers)]
    if outside:  # taken modulo the layer count, layer 12 of 12 read the first layer's attention peak
        raise BuildError(f"power.peak_layers names layer{'s' if len(outside) > 1 else ''} "
                         f"{', '.join(map(str, outside))}, but the model has {len(layers)} decoder layers "
                         f"(0 to {len(layers) - 1}, or -1 to -{len(layers)} counted from the last)",
                         "set power.peak_layers to layers the model has, e.g. "
                         + (said("--set", terms, "power.peak_layers=[-1]") if terms == "python" else
                            "--set 'power.peak_layers=[-1]'") + " (the last)")
    peaks = tuple(sorted({p % len(layers) for p in peak_layers})) or (len(layers) - 1,)
    state = PowerState(head_dim=head_dim, num_layers=len(layers), peak_layers=peaks)
    for index, layer in enumerate(layers):
        next_heads = layers[index + 1].self_attn.q_proj.out_features // head_dim if index + 1 < len(layers) else 0
        mlp = layer.mlp
        adapter = PowerAdapter(config.hidden_size, rank, next_heads, gate_init)
        mlp._power_original_class = type(mlp)
        mlp.__class__ = GatedMLP
        mlp.power_adapter = adapter.to(next(mlp.parameters()).dtype)
        mlp._power_state, mlp._power_index = state, index
        if index > 0:
            q_proj = layer.self_attn.q_proj
            q_proj.__class__ = ScaledQueryProjection
            q_proj._power_state, q_proj._power_index = state, index
    for index in peaks:
        attention = layers[index].self_attn
        attention._power_state = state  # read by the hook through the module: a deep copy gets its own
        attention.register_forward_hook(_record_peak)
    model.set_attn_implementation("eager")  # attention probabilities for the peak a_t
    model._power_state = state
    setattr(config, CONFIG_KEY, {**(settings or {}), "rank": rank, "gate_init": gate_init,
                                 "peak_layers": list(peaks)})
    return state


def _record_peak(module, args, output) -> None:
    """Forward hook on a peak layer's attention: a_t = mean over heads of the largest probability."""
    state = module._power_state
    if state.record and isinstance(output, tuple) and output[1] is not None:
        state.peaks.append(output[1].amax(dim=-1).mean(dim=1))  # (B, H, S, T) -> (B, S)


def power_state(model) -> PowerState | None:
    return getattr(model, "_power_state", None)


@contextmanager
def gating_off(model):
    """While the block runs, ``model``'s adapters are read but do not act (tau ``ADAPTERS_OFF_TAU``): the model
    computes the loaded decoder, as the gated graph at the runtime's default (``edgesdk run`` without ``--gating``,
    edgesdk/runtime/ort_gated_backend.py pins tau to ADAPTERS_OFF_TAU). The build runs every stage after the power
    stage so (qat, distill, prune's saliency, smooth's statistics): the power stage leaves tau at 0, where the
    adapters' channel and head scales act, and QAT or distillation then trained the backbone to undo those scales
    toward the teacher, a function the runtime's default does not compute. Afterwards tau is 0 again (every FFN
    runs, scales acting), as the export's check runs the gated graph (edgesdk/runtime/ort_fused_backend.py's
    neutral tau). A model without adapters is left as it is."""
    from edgesdk.power.controller import ADAPTERS_OFF_TAU

    state = power_state(model)
    if state is None:
        yield
        return
    before = state.tau
    state.tau = ADAPTERS_OFF_TAU
    try:
        yield
    finally:
        state.tau = before


def adapter_named_parameters(model) -> dict[str, nn.Parameter]:
    """The adapters' parameters by name (``.power_adapter.`` in it), in the model's order."""
    return {n: p for n, p in model.named_parameters() if ".power_adapter." in n}


def adapter_parameters(model) -> list[nn.Parameter]:
    return list(adapter_named_parameters(model).values())


def set_gate_gain(model, gain: float) -> None:
    """Train the gates' token-dependent weights ``gain`` times faster than the other adapter weights
    (:attr:`PowerAdapter.gate_gain`); :func:`fold_gate_gain` undoes the reparametrisation."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, PowerAdapter):
                # the row stored divided by the new gain over the old: the same gates (a trained row trains on)
                module.proj2.weight[-1] *= module.gate_gain / float(gain)
                module.gate_gain = float(gain)


@torch.no_grad()
def fold_gate_gain(model) -> None:
    """Fold each adapter's gate gain into proj2's gate row (the same gates, computed as the exported graph
    computes them: from proj2 alone) and set the gain back to 1."""
    for module in model.modules():
        if isinstance(module, PowerAdapter) and module.gate_gain != 1.0:
            module.proj2.weight[-1] *= module.gate_gain
            module.gate_gain = 1.0


def adapter_count(model) -> int:
    return sum(p.numel() for p in adapter_parameters(model))


def restore_adapters(model, checkpoint: Path):
    """After ``from_pretrained``: reinstall the adapters named in the config and load their weights."""
    settings = getattr(model.config, CONFIG_KEY, None)
    if not settings or power_state(model) is not None:
        return model
    from safetensors import safe_open

    install_adapters(model, int(settings["rank"]), float(settings["gate_init"]), tuple(settings["peak_layers"]),
                     settings)
    wanted = {n for n, _ in model.named_parameters() if ".power_adapter." in n}
    found: dict[str, torch.Tensor] = {}
    for file in sorted(Path(checkpoint).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():
                if key in wanted:
                    found[key] = handle.get_tensor(key)
    missing = sorted(wanted - set(found))
    if missing:
        raise BuildError(f"checkpoint {checkpoint} names power adapters in its config but lacks {missing[:3]}",
                         "rebuild without --resume")
    model.load_state_dict(found, strict=False)
    return model.eval()
