"""Block sparsity review 46: the global plan keeps the asked share of blocks when scores tie, the per-weight
plan never goes below ``min_density``, and a BSR weight refuses a block column stored twice in a block row
(which the kernels would add twice while ``to_dense`` keeps it once)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress import sparsify  # noqa: E402
from edgesdk.kernels.block_sparse import BlockSparseWeight  # noqa: E402
from edgesdk.kernels.reference import block_sparse_matmul_reference  # noqa: E402


def _kept(masks: dict[str, torch.Tensor]) -> int:
    return sum(int(m.sum()) for m in masks.values())


def _halves() -> torch.Tensor:
    return torch.tensor([2.0, 1.0]).repeat_interleave(8).reshape(4, 4)  # 8 blocks score 2, 8 score 1


@pytest.mark.parametrize("scores", [
    {"a": _halves(), "b": _halves()},  # the cut falls inside the 16 blocks scoring 1
    {"a": torch.zeros(4, 4), "b": torch.ones(4, 4)},  # a weight of zeros: its blocks all score 0
])
def test_global_plan_keeps_the_asked_blocks_when_scores_tie(scores):
    """A threshold (``s >= score of the last kept block``) kept every block tied with it: density 1.0 for 0.75
    asked. Picked by rank, as the prune stage breaks equal saliencies, the count is exact (each weight's 25 %
    floor is met by the ranking here, so it adds nothing)."""
    config = sparsify.SparsifyConfig(density=0.75, min_density=0.25, allocation="global")
    masks = sparsify.plan_masks(scores, config)
    assert _kept(masks) == 24
    assert sparsify.density_summary(masks)["density"] == 0.75
    assert all(int(m.sum()) >= 4 for m in masks.values())
    for name, mask in masks.items():  # whatever the tie-break, a kept block never scores below a dropped one
        others = [s[~m] for m, s in zip(masks.values(), scores.values(), strict=True)]
        assert scores[name][mask].min() >= max(float(o.max()) for o in others if o.numel()), name


def test_global_plan_still_gives_the_best_blocks_and_each_floor():
    scores = {"strong": torch.arange(16.0).reshape(4, 4) + 100, "weak": torch.zeros(4, 4)}
    masks = sparsify.plan_masks(scores, sparsify.SparsifyConfig(density=0.5, min_density=0.25))
    assert _kept(masks) == 16  # the density asked: the floors (4 each) come out of the budget
    assert masks["strong"].view(-1)[4:].all()
    assert int(masks["strong"].sum()) == 12
    assert int(masks["weak"].sum()) == 4  # ... and "weak" gets its floor


def test_density_plan_never_goes_below_min_density():
    """allocate_densities clips a weight at min_density, 0.25 of 10 blocks = 2.5; round() (to even) gave 2
    blocks, 20 %, under the floor every weight keeps."""
    config = sparsify.SparsifyConfig(density=0.5, min_density=0.25)
    densities = sparsify.allocate_densities({"cheap": 1.0, "costly": 1e6}, {"cheap": 10, "costly": 10}, config)
    assert densities["cheap"] == pytest.approx(0.25)
    scores = {"cheap": torch.rand(2, 5, generator=torch.Generator().manual_seed(0)),
              "costly": torch.rand(2, 5, generator=torch.Generator().manual_seed(1))}
    masks = sparsify.plan_masks_by_density(scores, densities, config.min_density)
    assert int(masks["cheap"].sum()) == 3  # ceil(0.25 x 10)
    assert masks["cheap"].view(-1)[scores["cheap"].flatten().topk(3).indices].all()  # its best blocks


def test_plan_passes_min_density_to_the_per_weight_masks():
    """``plan`` (sensitivity allocation) on a tiny model: no weight ends under min_density."""
    from tests._utils.tiny import tiny_llama

    model = tiny_llama(seed=4, hidden=64, heads=4, kv_heads=2)
    batches = [torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(i))
               for i in range(2)]
    config = sparsify.SparsifyConfig(density=0.3, min_density=0.3, block_size=16, probe_batches=1)
    scores = sparsify.block_importance(model, batches, config, 16)
    masks = sparsify.plan(model, scores, batches, 16, config)
    for name, mask in masks.items():
        assert int(mask.sum()) >= math.ceil(round(0.3 * mask.numel(), 9)), name


def test_min_density_floor_ignores_float_error():
    assert 0.55 * 100 > 55  # 55.00000000000001: a plain ceil gives 56
    scores = {"a": torch.rand(10, 10, generator=torch.Generator().manual_seed(2)), "b": torch.full((10, 10), 9.0)}
    masks = sparsify.plan_masks(scores, sparsify.SparsifyConfig(density=0.6, min_density=0.55))
    assert int(masks["a"].sum()) == 55  # the floor, not one block more
    assert sparsify.floor_blocks(0.55, 100) == 55
    assert sparsify.floor_blocks(0.25, 10) == 3
    assert sparsify.floor_blocks(1.0, 7) == 7


def _bsr(col_index: list[int], row_offsets: list[int], n: int = 4) -> BlockSparseWeight:
    nnz = len(col_index)
    values = torch.arange(1, nnz * 4 + 1, dtype=torch.int8).reshape(nnz, 2, 2)
    return BlockSparseWeight(values=values, col_index=torch.tensor(col_index, dtype=torch.int32),
                             row_offsets=torch.tensor(row_offsets, dtype=torch.int32), scales=torch.ones(n),
                             shape=(n, 6), block=(2, 2))


@pytest.mark.parametrize(("cols", "offsets", "message"), [
    ([1, 1], [0, 2, 2], "got block column 1 after 1 in block row 0"),  # stored twice
    ([0, 2, 1], [0, 1, 3], "got block column 1 after 2 in block row 1"),  # out of order
])
def test_bsr_refuses_a_block_column_stored_twice_or_out_of_order(cols, offsets, message):
    with pytest.raises(ValueError, match="col_index must increase strictly within a block row") as info:
        _bsr(cols, offsets)
    assert message in str(info.value)


def test_bsr_state_dict_with_a_repeated_block_is_refused():
    """A tampered / hand-written safetensors file: before, the reference (and the kernels) added the repeated
    tile twice while to_dense / dequantized kept it once, so the two disagreed silently."""
    weight = BlockSparseWeight.from_dense(torch.ones(4, 6, dtype=torch.int8), torch.ones(4), block=(2, 2))
    state = weight.state_dict("w")
    state["w.col_index"] = torch.tensor([0, 1, 1, 0, 1, 2], dtype=torch.int32)  # block row 0 holds column 1 twice
    with pytest.raises(ValueError, match="col_index must increase strictly"):
        BlockSparseWeight.from_state_dict(state, "w")


def test_bsr_accepts_columns_restarting_in_the_next_block_row():
    weight = _bsr([2, 0, 1], [0, 1, 3])
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(0))
    dense = weight.dequantized()
    torch.testing.assert_close(block_sparse_matmul_reference(x, weight), x @ dense.T)


@pytest.mark.parametrize("layout", ["plain", "transposed"])
@pytest.mark.parametrize(("n", "k", "block"), [(37, 53, (8, 16)), (5, 3, (4, 4)), (33, 1, (32, 32))])
def test_round_trip_and_reference_match_the_masked_dense_weight(n, k, block, layout):
    """dense -> BSR -> dense is the masked matrix, and the twin is x @ (masked, dequantised W).T (blocks that do
    not divide the matrix included)."""
    gen = torch.Generator().manual_seed(n + k)
    q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    scales = torch.rand(n, generator=gen) * 0.02 + 0.001
    mask = torch.rand(-(-n // block[0]), -(-k // block[1]), generator=gen) > 0.5
    weight = BlockSparseWeight.from_dense(q, scales, block, mask, layout)
    masked = torch.where(sparsify.expand_mask(mask, (n, k), block[0]) if block[0] == block[1] else
                         mask.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:n, :k], q, 0)
    assert torch.equal(weight.to_dense(), masked.to(torch.int8))
    assert torch.equal(BlockSparseWeight.from_state_dict(weight.state_dict("w"), "w").to_dense(), weight.to_dense())
    x = torch.randn(3, k, generator=gen)
    expected = x.double() @ (masked.double() * scales.double()[:, None]).T
    torch.testing.assert_close(block_sparse_matmul_reference(x, weight).double(), expected, rtol=1e-5, atol=1e-5)
