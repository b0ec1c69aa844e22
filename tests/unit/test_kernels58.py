"""Kernel review 58: the AOT variant table's layouts and sliding windows (a misspelt layout compiled the plain
kernel under its name, a negative window compiled full attention), and ``from_dense`` given a bare block edge."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.kernels.aot import default_variants  # noqa: E402
from edgesdk.kernels.block_sparse import BlockSparseWeight  # noqa: E402
from edgesdk.kernels.tuning import tuning_for  # noqa: E402


def _decode_windows(windows):
    """(name, WINDOW) of the gqa_decode variants compiled for ``windows`` (one head dim, one group bound)."""
    return [(v.name, v.constexprs["WINDOW"]) for v in default_variants(
        tuning_for(87), head_dims=(64,), group_blocks=(1,), layouts=("plain",), windows=windows)
        if v.kernel == "gqa_decode"]


def test_default_variants_refuse_a_layout_the_kernel_does_not_have():
    """``"transpose"`` compiled the plain kernel (TRANSPOSED False) as ``bsr_gemv_transpose_...``."""
    with pytest.raises(ValueError, match=r"layouts entry 'transpose' is not a block-sparse layout: pass one of "
                                         r"\('plain', 'transposed'\)"):
        default_variants(tuning_for(87), layouts=("transpose",))
    transposed = [v for v in default_variants(tuning_for(87), layouts=("transposed",)) if v.kernel == "bsr_matmul"]
    assert transposed
    assert all(v.constexprs["TRANSPOSED"] for v in transposed)


@pytest.mark.parametrize("window", [-4, 2.5, True, "512", float("inf"), 2**31])
def test_default_variants_refuse_a_window_that_is_not_one(window):
    """-4 compiled ``gqa_decode_d64_g1_w-4_fp16`` with WINDOW -4, which the kernel runs as full attention."""
    with pytest.raises(ValueError, match=r"windows entry .* is not a sliding window: pass None \(or 0\) for full "
                                         r"attention"):
        _decode_windows((None, window))


def test_default_variants_compile_each_window_once_as_an_integer():
    """None and 0 (the runtime's full attention) were two variants of one name; 512.0 was named ``_w512.0``."""
    assert _decode_windows((None, 0, 512.0, 512)) == [("gqa_decode_d64_g1_fp16", 0),
                                                      ("gqa_decode_d64_g1_w512_fp16", 512)]
    assert isinstance(_decode_windows((512.0,))[0][1], int)


@pytest.mark.parametrize("block", [32, 32.0, "32"])
def test_from_dense_names_a_bare_block_edge(block):
    """``block=32`` was ``TypeError: object of type 'int' has no len()``, naming neither the block nor the fix."""
    with pytest.raises(ValueError, match=r"block must be two positive integers \(block_n, block_k\), got .*32.*; "
                                         r"for square tiles pass the edge twice, e.g. \(32, 32\)"):
        BlockSparseWeight.from_dense(torch.ones(64, 64, dtype=torch.int8), torch.ones(64), block=block)
    weight = BlockSparseWeight.from_dense(torch.ones(64, 64, dtype=torch.int8), torch.ones(64), block=[32, 16])
    assert weight.block == (32, 16)
    assert weight.to_dense().eq(1).all()


def test_from_dense_takes_a_numpy_pair_and_refuses_a_bad_block_in_the_constructor_s_words():
    """from_dense's own block check refused ``np.array([32, 32])``, which it took before; it now checks the block as
    the constructor does (numpy integers are integers), keeping the hint for a bare edge."""
    import numpy as np

    weight = BlockSparseWeight.from_dense(torch.ones(64, 48, dtype=torch.int8), torch.ones(64),
                                          block=np.array([32, 16]))
    assert weight.block == (32, 16)
    assert all(type(edge) is int for edge in weight.block)
    assert weight.to_dense().eq(1).all()
    rebuilt = BlockSparseWeight(values=weight.values, col_index=weight.col_index, row_offsets=weight.row_offsets,
                                scales=weight.scales, shape=np.array([64, 48]), block=np.array([32, 16]))
    assert (rebuilt.shape, rebuilt.block) == ((64, 48), (32, 16))
    for block in (np.array([32.0, 32.0]), np.array([[32, 32]]), (np.int64(0), 32)):
        with pytest.raises(ValueError, match=r"block must be two positive integers \(block_n, block_k\), got "):
            BlockSparseWeight.from_dense(torch.ones(64, 64, dtype=torch.int8), torch.ones(64), block=block)
    with pytest.raises(ValueError, match=r"block must be \(block_n, block_k\): the tile edges, whole numbers >= 1, "
                                         r"got 32; for square tiles pass the edge twice, e\.g\. \(32, 32\); build "):
        BlockSparseWeight(values=weight.values, col_index=weight.col_index, row_offsets=weight.row_offsets,
                          scales=weight.scales, shape=(64, 48), block=32)


def test_from_dense_and_the_constructor_take_a_torch_pair_as_a_numpy_one():
    """A 1-D tensor ``torch.tensor([32, 16])`` was split into 0-d tensors, which are no ``numbers.Integral``, and
    refused as not two integers; it is a pair as a 1-D numpy array is, and a float or bool one is still refused."""
    weight = BlockSparseWeight.from_dense(torch.ones(64, 48, dtype=torch.int8), torch.ones(64),
                                          block=torch.tensor([32, 16]))
    assert weight.block == (32, 16)
    assert all(type(edge) is int for edge in weight.block)
    assert weight.to_dense().eq(1).all()
    rebuilt = BlockSparseWeight(values=weight.values, col_index=weight.col_index, row_offsets=weight.row_offsets,
                                scales=weight.scales, shape=torch.tensor([64, 48]), block=torch.tensor([32, 16]))
    assert (rebuilt.shape, rebuilt.block) == ((64, 48), (32, 16))
    assert all(type(size) is int for size in (*rebuilt.shape, *rebuilt.block))
    for block in (torch.tensor([32.0, 32.0]), torch.tensor([True, True]), torch.tensor([0, 32]),
                  torch.tensor([[32, 32]])):
        with pytest.raises(ValueError, match=r"block must be two positive integers \(block_n, block_k\), got "):
            BlockSparseWeight.from_dense(torch.ones(64, 64, dtype=torch.int8), torch.ones(64), block=block)
