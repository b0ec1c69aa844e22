"""Depth pruning of SmolLM2-135M (prune stage, ``layers_removed``): which criterion picks the layers,
and what it costs against width pruning of the same parameters. No distillation: the cost of
pruning alone.

- greedy KL (the stage's with ``depth_rescore``): remove the layer whose removal costs the least KL to
  the current model on calibration text, score the rest again, repeat;
- one-shot KL (the stage's default): score every layer once on the whole model, remove the k cheapest;
- Block Influence (ShortGPT, Men et al. 2024; the stage's ``depth_criterion: block-influence``): 1 - mean
  cosine between a layer's input and output hidden states, k lowest removed, one shot;
- the last k layers before the final one;
- FFN width pruning (the stage's Fisher ranking) removing as many decoder parameters as k layers.

Calibration: 4 batches of 2 x 256 tokens from WikiText-2 valid past its first 200,000 characters;
perplexity on its first 8,192 tokens (windows of 256), the build's held-out figure.

    python -m pytest tests/benchmarks/test_depth_pruning.py -m benchmark -s
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

pytestmark = pytest.mark.benchmark
torch = pytest.importorskip("torch")

WIKITEXT = Path(__file__).resolve().parents[3] / "shared" / "data" / "wikitext-2-raw" / "wiki.valid.raw"
REMOVED = (1, 2, 3, 4, 6)
EVAL_TOKENS, CALIBRATION_CHARS = 8192, 200_000


def _greedy_order(model, batches, count: int) -> tuple[list[int], list[float]]:
    """Teacher indices in the order the stage's greedy KL removes them, and the first round's costs (every
    layer scored on the whole model: the one-shot ranking)."""
    from edgesdk.compress.prune import plan_depth

    _, rounds = plan_depth(model, batches, count, rescore=True)
    left, order = list(range(len(model.model.layers))), []
    for costs in rounds:
        order.append(left.pop(min(range(len(costs)), key=costs.__getitem__)))
    return order, rounds[0]


def _perplexity_without(model, removed: list[int], eval_ids) -> float:
    from edgesdk.compress.measure import heldout_perplexity

    layers = model.model.layers
    model.model.layers = torch.nn.ModuleList([layer for i, layer in enumerate(layers) if i not in removed])
    try:
        with torch.no_grad():
            return heldout_perplexity(model, eval_ids)
    finally:
        model.model.layers = layers


def _width_pruned_perplexity(model, ffn_ratio: float, batches, eval_ids) -> float:
    from edgesdk.compress.measure import heldout_perplexity
    from edgesdk.compress.prune import (
        PruneConfig,
        apply_plans,
        fisher_diagonal,
        plan_ffn,
        plan_groups,
        saliencies,
    )

    pruned = copy.deepcopy(model)
    config = PruneConfig(ffn_ratio=ffn_ratio)
    ffn_scores, group_scores = saliencies(pruned, fisher_diagonal(pruned, batches))
    apply_plans(pruned, plan_ffn(ffn_scores, config), plan_groups(group_scores, config))
    with torch.no_grad():
        return heldout_perplexity(pruned, eval_ids)


def test_depth_pruning_criteria_against_width_pruning():
    if not WIKITEXT.is_file():
        pytest.skip("WikiText-2 validation text not found beside the checkout")
    from edgesdk.compress.measure import heldout_perplexity
    from edgesdk.compress.prune import block_influence
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    loaded = load_model(resolve_model("smollm2-135m"), progress=False)
    model = loaded.model.eval()
    text = WIKITEXT.read_text(encoding="utf-8")
    eval_ids = torch.tensor(loaded.tokenizer(text[:60_000])["input_ids"][:EVAL_TOKENS])
    pool = torch.tensor(loaded.tokenizer(text[CALIBRATION_CHARS:CALIBRATION_CHARS + 40_000])["input_ids"])
    batches = [pool[i * 512:(i + 1) * 512].reshape(2, 256) for i in range(4)]
    count = len(model.model.layers)
    with torch.no_grad():
        dense = heldout_perplexity(model, eval_ids)

    greedy, one_shot_costs = _greedy_order(model, batches, max(REMOVED))
    one_shot = sorted(range(count), key=one_shot_costs.__getitem__)
    with torch.no_grad():
        bi = block_influence(model, batches)
    by_influence = sorted(range(count), key=bi.__getitem__)
    layer_params = sum(p.numel() for p in model.model.layers[0].parameters())
    ffn_params = sum(p.numel() for p in model.model.layers[0].mlp.parameters())

    print(f"\nSmolLM2-135M, {count} layers; dense perplexity {dense:.3f} on {eval_ids.numel()} tokens")
    print(f"greedy KL removes {greedy}; one-shot KL ranks {one_shot[:max(REMOVED)]}; "
          f"BI ranks {by_influence[:max(REMOVED)]}")
    print(f"one-shot KL per layer: {[round(c, 3) for c in one_shot_costs]}")
    header = ["layers removed", "greedy KL", "one-shot KL", "Block Influence", "last layers", "FFN width, same params"]
    print(" | ".join(header))
    rows = {}
    for k in REMOVED:
        last = list(range(count - 1 - k, count - 1))
        ratio = k * layer_params / (count * ffn_params)
        values = [_perplexity_without(model, greedy[:k], eval_ids), _perplexity_without(model, one_shot[:k], eval_ids),
                  _perplexity_without(model, by_influence[:k], eval_ids), _perplexity_without(model, last, eval_ids),
                  _width_pruned_perplexity(model, ratio, batches, eval_ids)]
        rows[k] = values
        print(f"{k} | " + " | ".join(f"{v:.2f} ({v / dense - 1:+.1%})" for v in values) + f"  (FFN ratio {ratio:.3f})")
    # both KL criteria remove what they measure: far better than removing the last layers
    assert all(max(values[0], values[1]) < values[3] for values in rows.values())


SPEED_RECIPE = """name: {name}
stages: {stages}
export: {{form: ort-fused, weights: int4, block_size: 64, embedding_bits: 4}}
"""
SPEED_STAGES = {  # post-training INT4 (the default recipe's graph), no training: the graph's speed is what is measured
    "unpruned": "[]",
    "3 layers removed": "[{stage: prune, config: {layers_removed: 3, ffn_ratio: 0.0, layer_calibration_batches: 2}}]",
    "FFN -13.3 % (the same parameters)": "[{stage: prune, config: {ffn_ratio: 0.133, calibration_batches: 8}}]",
}


def test_decode_speed_of_depth_against_width_pruning_at_equal_parameters(tmp_path):
    """Removing a layer removes its ~40 graph nodes as well as its bytes; narrowing FFNs removes bytes only.
    On a host where a decode step is mostly per-node cost (tests/benchmarks/test_decode_profile.py), that is
    the case for depth pruning. Greedy decode of 128 tokens after 128, 2 threads, alternated, median of 3."""
    if not WIKITEXT.is_file():
        pytest.skip("WikiText-2 validation text not found beside the checkout")
    import statistics
    import time

    import numpy as np

    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.session import open_runtime

    data = DataConfig(files=(str(WIKITEXT),), skip_chars=CALIBRATION_CHARS, generated_sequences=0)
    runtimes, layers = {}, {}
    for index, (name, stages) in enumerate(SPEED_STAGES.items()):
        recipe = tmp_path / f"r{index}.yaml"
        recipe.write_text(SPEED_RECIPE.format(name=f"speed-{index}", stages=stages))
        bundle = build(BuildConfig(target="rpi5", out=tmp_path / f"b{index}", recipe=str(recipe), data=data,
                                   progress=False))
        runtimes[name] = open_runtime(bundle.path, threads=2)
        layers[name] = (bundle.manifest["graph"]["num_layers"], bundle.manifest["model"]["after"]["parameters"])
    prompt = np.random.default_rng(0).integers(100, 49152, 128).tolist()

    def decode(runtime) -> float:
        _, stats = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=128), stop_ids=set())
        return stats.decode_tok_s

    for runtime in runtimes.values():
        decode(runtime)  # untimed
    runs = {name: [] for name in runtimes}
    for _ in range(3):
        for name, runtime in runtimes.items():
            time.sleep(1)
            runs[name].append(decode(runtime))
    base = statistics.median(runs["unpruned"])
    print(f"\n{'graph':<36}{'layers':>8}{'parameters':>14}{'decode tok/s':>14}{'x unpruned':>12}")
    for name, values in runs.items():
        print(f"{name:<36}{layers[name][0]:>8}{layers[name][1]:>14,}{statistics.median(values):>14.1f}"
              f"{statistics.median(values) / base:>12.3f}")
