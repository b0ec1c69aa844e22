"""Review 52 of the kernels' reference twin: the block-sparse product goes through the rows of x in chunks, so its
gathered activations and per-block products stay under a byte budget instead of growing with the prompt."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.kernels.block_sparse import BlockSparseWeight  # noqa: E402
from edgesdk.kernels.reference import (  # noqa: E402
    TEMPORARY_BUDGET_BYTES,
    block_sparse_matmul_reference,
    reference_chunk_rows,
)

SMOLLM2_HIDDEN, SMOLLM2_INTERMEDIATE = 576, 1536  # SmolLM2-135M: gate/up project (576,) -> (1536,)


def _weight(n: int, k: int, block: tuple[int, int], density: float, seed: int) -> BlockSparseWeight:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    mask = torch.rand(-(-n // block[0]), -(-k // block[1]), generator=gen) < density  # (nbr, nbc) kept tiles
    return BlockSparseWeight.from_dense(q, torch.rand(n, generator=gen) * 0.01 + 1e-3, block, mask=mask)


@pytest.mark.parametrize("layout", ["plain", "transposed"])
def test_chunked_rows_give_the_unchunked_product_for_odd_shapes(layout):
    """M = 37 rows in chunks of 5 (the last one 2 rows), N = 70 and K = 45 not multiples of the (16, 8) block: the
    same result as one chunk holding every row, and as the dense product."""
    w = _weight(70, 45, (16, 8), 0.6, seed=52)
    if layout == "transposed":
        w = BlockSparseWeight(w.values.transpose(1, 2), w.col_index, w.row_offsets, w.scales, w.shape, w.block,
                              layout="transposed")
    x = torch.randn(37, 45, generator=torch.Generator().manual_seed(7))
    row_bytes = 4 * w.nnz_blocks * (16 + 8)  # xg (rows, nnz, 8) and partial (rows, nnz, 16), float32
    tiny = 5 * row_bytes + row_bytes // 2
    assert reference_chunk_rows(w, tiny) == 5  # chunks of 5, 5, ..., 5, 2
    assert reference_chunk_rows(w, 37 * row_bytes) == 37
    whole = block_sparse_matmul_reference(x, w, budget_bytes=37 * row_bytes)  # one chunk
    chunked = block_sparse_matmul_reference(x, w, budget_bytes=tiny)
    assert chunked.shape == (37, 70)
    assert chunked.dtype == torch.float32
    torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(chunked, x @ w.dequantized().T, rtol=1e-5, atol=1e-5)


def test_a_budget_under_one_row_still_runs_row_by_row():
    w = _weight(33, 20, (8, 8), 1.0, seed=3)
    x = torch.randn(6, 20, generator=torch.Generator().manual_seed(1))
    assert reference_chunk_rows(w, 1) == 1
    torch.testing.assert_close(block_sparse_matmul_reference(x, w, budget_bytes=1), block_sparse_matmul_reference(x, w),
                               rtol=1e-6, atol=1e-6)


def test_empty_inputs_with_a_tiny_budget():
    """No rows, or no stored tile: zeros of the right shape."""
    w = _weight(10, 12, (4, 4), 0.5, seed=5)
    assert block_sparse_matmul_reference(torch.zeros(0, 12), w, budget_bytes=1).shape == (0, 10)
    none = _weight(10, 12, (4, 4), 0.0, seed=5)
    assert none.nnz_blocks == 0
    assert torch.equal(block_sparse_matmul_reference(torch.ones(3, 12), none, budget_bytes=1), torch.zeros(3, 10))


def test_smollm2_gate_up_prefill_keeps_the_temporaries_under_the_budget():
    """A 2048-token prompt through SmolLM2-135M's gate/up projection at full density (the most tiles a weight
    can store) held 2048 * 864 * (32 + 32) * 4 bytes = 432 MiB of temporaries in one piece; in chunks every chunk
    stays under the default budget, and the chunk is as large as the budget allows."""
    w = _weight(SMOLLM2_INTERMEDIATE, SMOLLM2_HIDDEN, (32, 32), 1.0, seed=0)
    assert w.nnz_blocks == (SMOLLM2_INTERMEDIATE // 32) * (SMOLLM2_HIDDEN // 32)
    rows = reference_chunk_rows(w)
    m = 2048
    assert 1 <= rows < m

    def temporaries(r: int) -> int:  # float32 xg (r, nnz, block_k) and partial (r, nnz, block_n)
        return 4 * r * w.nnz_blocks * 32 + 4 * r * w.nnz_blocks * 32

    assert temporaries(min(rows, m)) <= TEMPORARY_BUDGET_BYTES < temporaries(rows + 1)


@pytest.mark.parametrize("budget", [0, -1, True, 1.5, "64MiB"])
def test_a_budget_that_is_not_a_positive_integer_is_refused_by_name(budget):
    w = _weight(8, 8, (4, 4), 1.0, seed=1)
    with pytest.raises(ValueError, match=r"budget_bytes must be a positive integer.*got"):
        block_sparse_matmul_reference(torch.ones(2, 8), w, budget_bytes=budget)
