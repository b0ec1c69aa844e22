"""Review 48 of the compress stages (prune, sparsify, distill, data): each test fails on the code before the fix."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress import sparsify  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


# ------------------------------------------------------------------------------------------------ sparsify reorder
@pytest.mark.parametrize("model_type", ["gemma3_text", "llama"])
def test_reordering_the_channels_of_a_gemma3_model_leaves_its_logits_unchanged(model_type):
    """TETRIS reordering permutes the residual stream: every norm over it must be permuted with it. Gemma 3's layers
    have four (transformers' Gemma3DecoderLayer: input, post-attention, pre-FFN and post-FFN norms); the pre- and
    post-FFN ones were left in the old channel order and the tiny Gemma 3's logits moved by 2.0."""
    model = tiny_llama(seed=3, model_type=model_type, layers=2, hidden=64, heads=4, kv_heads=2)
    draws = torch.Generator().manual_seed(2)  # the same norm weights whichever tests ran before in this worker
    with torch.no_grad():  # every norm weight away from its neutral value, so a missed one shows
        for name, parameter in model.named_parameters():
            if "norm" in name:
                low, high = (-0.5, 0.5) if model_type == "gemma3_text" else (0.5, 1.5)
                parameter.copy_(torch.rand(parameter.shape, generator=draws) * (high - low) + low)
    batches = [torch.randint(3, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))]
    with torch.no_grad():
        before = model(batches[0]).logits
    sparsify.reorder_channels(model, batches)
    with torch.no_grad():
        after = model(batches[0]).logits
    hidden, _ = sparsify.channel_keys(model, batches)
    assert torch.all(hidden[1:] >= hidden[:-1] - 1e-4)  # the permutation was applied (not a no-op)
    assert torch.allclose(before, after, atol=1e-4), float((before - after).abs().max())


def test_reordering_a_pruned_models_ffn_channels_moves_its_record_of_teacher_channels_with_them():
    """A pruned model records, per layer, the teacher's FFN channel at each position (structure.py
    ``edgesdk_layers``). Reordering permuted the channels and left the record in the old order, so position p no
    longer held the channel the record named: the FFN's gate rows, read back through the record, no longer matched
    the teacher's."""
    from edgesdk.compress import prune
    from edgesdk.compress.structure import layer_records

    teacher = tiny_llama(seed=5, layers=2, hidden=64, heads=4, kv_heads=2, intermediate=96)
    model = tiny_llama(seed=5, layers=2, hidden=64, heads=4, kv_heads=2, intermediate=96)
    kept = [list(range(0, 96, 2)), list(range(1, 96, 3))]
    prune.apply_plans(model, kept, [[0, 1], [0, 1]])
    batches = [torch.randint(3, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))]
    sparsify.reorder_channels(model, batches)
    for index, record in enumerate(layer_records(model)):
        assert sorted(record["ffn"]) == kept[index]  # still the channels pruning kept
        rows = model.model.layers[index].mlp.up_proj.weight  # (F, D): rows are FFN channels, columns permuted
        teacher_rows = teacher.model.layers[index].mlp.up_proj.weight[record["ffn"]]
        # the hidden permutation reorders columns only: compare each row's sorted values
        assert torch.allclose(rows.sort(dim=1).values, teacher_rows.sort(dim=1).values), index
