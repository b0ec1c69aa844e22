"""Gemma 3 text models through the stages and the export: what a Llama-shaped assumption would get wrong.

Tiny Gemma 3 models (tests/_utils/tiny.py) have a sliding window of 4 on even layers and full attention on odd
ones; transformers reads each layer's kind from ``config.layer_types`` by the layer's position.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from tests._utils.tiny import tiny_llama  # noqa: E402

GEMMA3 = {"model_type": "gemma3_text", "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 32,
          "intermediate": 128}


def _batches(count: int = 1):
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, 320, (2, 24), generator=generator) for _ in range(count)]


def _kl_without(model, positions: list[int], batches, reference) -> float:
    """Mean per-token KL(reference || a copy of ``model`` that keeps only the layers at ``positions``)."""
    import torch.nn.functional as F

    from edgesdk.compress.structure import keep_layers

    pruned = copy.deepcopy(model)
    keep_layers(pruned, positions)
    total = 0.0
    with torch.no_grad():
        for batch, ref in zip(batches, reference, strict=True):
            logp = F.log_softmax(pruned(batch, use_cache=False).logits.float(), dim=-1)
            total += float((ref.exp() * (ref - logp)).sum(-1).mean())
    return total / len(batches)


def test_depth_pruning_scores_each_layer_by_the_model_actually_left_without_it():
    """Scoring a layer's removal runs the model without it; its later layers move up a position, and a Gemma
    layer's mask and rotary table follow its own kind (sliding or full), not the kind of the position it lands
    on: the score is the KL of the model that keep_layers leaves."""
    import torch.nn.functional as F

    from edgesdk.compress.prune import layer_removal_costs

    model = tiny_llama(layers=3, **GEMMA3)
    kinds = list(model.config.layer_types)
    batches = _batches()
    with torch.no_grad():
        reference = [F.log_softmax(model(batch, use_cache=False).logits.float(), dim=-1) for batch in batches]
        costs = layer_removal_costs(model, batches, reference)
    expected = [_kl_without(model, [i for i in range(3) if i != skipped], batches, reference) for skipped in range(3)]
    assert costs == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert model.config.layer_types == kinds  # put back
    assert len(model.model.layers) == 3


def test_greedy_depth_pruning_rescores_on_the_layers_left():
    """depth_rescore: the second round scores the layers left after the first removal as that model has them."""
    import torch.nn.functional as F

    from edgesdk.compress.prune import plan_depth

    model = tiny_llama(layers=4, **GEMMA3)
    batches = _batches()
    kept, rounds = plan_depth(model, batches, remove=2, rescore=True)
    assert len(kept) == 2
    assert len(rounds) == 2
    first = min(range(4), key=rounds[0].__getitem__)
    left = [i for i in range(4) if i != first]
    with torch.no_grad():
        reference = [F.log_softmax(model(batch, use_cache=False).logits.float(), dim=-1) for batch in batches]
    expected = [_kl_without(model, [i for i in left if i != skipped], batches, reference) for skipped in left]
    assert rounds[1] == pytest.approx(expected, rel=1e-3, abs=1e-5)
