"""Which of the seed's stabilisers help power-adapter training (seed 000 §3.3), on SmolLM2-135M.

The same short on-policy run (same prompts, same seed) with each stabiliser switched off in turn:
z-scored per-sample KL, square-rooted power KL, the 0.3 gradient factor below mean power, the
entropy-weight schedule (replaced by its final value throughout). Each
run is scored on held-out WikiText-2 tokens at the training threshold: NLL increase over the
ungated model (quality), share of FFN blocks run (compute), windowed power entropy.

    python -m pytest tests/benchmarks/test_power_stabilisers.py -m benchmark -s
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

pytestmark = pytest.mark.benchmark

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "wikitext-2-raw" / "wiki.valid.raw"
ROUNDS = 6

VARIANTS = {
    "all stabilisers": {},
    "no z-score": {"zscore": False},
    "no sqrt clip": {"clip": False},
    "no 0.3 re-weighting": {"low_power_scale": 1.0},
    "flat entropy weight": {"entropy_start": 0.08},
}


def _score(model, state, info, ids) -> dict:
    import torch

    from edgesdk.power import vector
    from edgesdk.power.train import _forward

    valid = torch.ones_like(ids, dtype=torch.float32)
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    with torch.no_grad():
        ungated = _forward(model, state, ids, valid, gated=False)
        state.clear()
        state.enabled, state.record, state.straight_through, state.tau = True, True, False, 0.5
        gated = model(ids, use_cache=False).logits
        executed = float(torch.stack(state.masks).mean())
        power = info.power(state, positions)
    nll = [float(torch.nn.functional.cross_entropy(x[:, :-1].reshape(-1, x.shape[-1]), ids[:, 1:].reshape(-1)))
           for x in (ungated, gated)]
    prob, _ = vector.windowed(power, valid)
    state.clear()
    state.record, state.tau = False, 0.0
    return {"nll_increase": nll[1] - nll[0], "executed": executed, "entropy": float(vector.entropy(prob).mean())}


def test_stabiliser_ablation():
    if not DATA.is_file():
        pytest.skip(f"WikiText-2 validation text not found beside the checkout ({DATA.name})")
    torch = pytest.importorskip("torch")
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model
    from edgesdk.power import adapter, train
    from edgesdk.power.profiler import CostStats

    torch.set_num_threads(1)
    text = DATA.read_text(encoding="utf-8")
    rows = {}
    for name, change in VARIANTS.items():
        loaded = load_model(resolve_model("smollm2-135m"))
        model, tokenizer = loaded.model, loaded.tokenizer
        ids = torch.tensor(tokenizer(text[200_000:])["input_ids"])
        pool, heldout = ids[:-1024], ids[-1024:].reshape(4, 256)
        state = adapter.install_adapters(model, 32, gate_init=0.5)
        peak, ffn = train.calibrate_scales(model, state, pool[:512].reshape(4, 128))
        cost = CostStats(64, [0.0] * 64, {}, 0.0, 0.0)  # c_t constant here: the stabilisers are compared
        info = train.PowerModelInfo((0.25, 0.5, 0.25), peak, ffn, 1.0, cost)
        config = replace(train.PowerTrainConfig(rounds=ROUNDS, lr=3e-3, budget=0.75, weight_budget=10.0), **change)
        log = train.train_adapters(model, state, info, pool, config, [tokenizer.eos_token_id], tokenizer.eos_token_id)
        rows[name] = {**_score(model, state, info, heldout), "final_loss": log.last("loss")}
    print(f"\n{'variant':<22}{'NLL increase':>14}{'FFN run':>10}{'entropy':>10}{'last loss':>11}  ({ROUNDS} rounds)")
    for name, row in rows.items():
        print(f"{name:<22}{row['nll_increase']:>14.4f}{row['executed']:>10.1%}{row['entropy']:>10.3f}"
              f"{row['final_loss']:>11.3f}")
    assert all(math.isfinite(v) for row in rows.values() for v in row.values())
    assert all(0 < row["executed"] <= 1 for row in rows.values())
