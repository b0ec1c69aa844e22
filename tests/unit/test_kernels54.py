"""Block-sparse weights, the kernels' window argument and the sparse decoder's step: arguments that are refused by
name instead of failing later in torch's (or Triton's) words, and integers of numpy taken as the integers they are."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgesdk.errors import RuntimeBackendError  # noqa: E402
from edgesdk.kernels.block_sparse import BlockSparseWeight  # noqa: E402
from edgesdk.kernels.ops import block_sparse_matmul, gqa_decode_attention, triton_available  # noqa: E402

MODES = ["reference", pytest.param("emulated", marks=pytest.mark.skipif(not triton_available(),
                                                                        reason="needs triton"))]


def _weight() -> BlockSparseWeight:
    generator = torch.Generator().manual_seed(54)
    q = torch.randint(-127, 128, (48, 40), dtype=torch.int8, generator=generator)
    return BlockSparseWeight.from_dense(q, torch.rand(48, generator=generator) + 0.1, (16, 16))


def _rebuilt(weight: BlockSparseWeight, **changed) -> BlockSparseWeight:
    fields = {"values": weight.values, "col_index": weight.col_index, "row_offsets": weight.row_offsets,
              "scales": weight.scales, "shape": weight.shape, "block": weight.block, **changed}
    return BlockSparseWeight(**fields)


@pytest.mark.parametrize(("field", "value"), [
    ("block", (16.0, 16)),  # accepted before, then torch.zeros failed on a float size in the twin
    ("block", (True, 16)),  # refused as a values shape of (nnz, True, 16)
    ("block", (0, 16)),  # refused as "bad shape ... or block ...", with nothing expected and no fix
    ("shape", (48.0, 40)),
    ("shape", (48, 40, 1)),
])
def test_a_shape_or_block_that_is_not_two_whole_numbers_is_refused_by_name(field, value):
    with pytest.raises(ValueError, match=rf"{field} must be \(.*whole numbers >= [01], got") as caught:
        _rebuilt(_weight(), **{field: value})
    assert repr(value) in str(caught.value)
    assert "from_dense" in str(caught.value)


def test_numpy_integers_for_shape_and_block_are_kept_as_python_ints():
    weight = _weight()
    rebuilt = _rebuilt(weight, shape=tuple(np.int64(v) for v in weight.shape),
                       block=tuple(np.int32(v) for v in weight.block))
    assert rebuilt.shape == (48, 40)
    assert rebuilt.block == (16, 16)
    assert all(type(v) is int for v in (*rebuilt.shape, *rebuilt.block))
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(block_sparse_matmul(x, rebuilt, "reference"), block_sparse_matmul(x, weight, "reference"))


@pytest.mark.parametrize("mode", MODES)
def test_a_numpy_integer_window_is_the_window_it_holds(mode):
    """``np.int64(4)`` (a config's sliding_window read through numpy) was refused as "an integer in [1, ...]; got
    np.int64(4)"; it is the window 4."""
    generator = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 8, generator=generator)
    k, v = torch.randn(2, 2, 12, 8, generator=generator), torch.randn(2, 2, 12, 8, generator=generator)
    lengths = torch.tensor([12, 7])
    want = gqa_decode_attention(q, k, v, lengths, 0.3, "reference", window=4)
    got = gqa_decode_attention(q, k, v, lengths, 0.3, mode, window=np.int64(4))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(want, gqa_decode_attention(q, k, v, lengths, 0.3, "reference"))  # the window applied


# ---------------------------------------------------------------------------------------------- the decoder's step
@pytest.fixture(scope="module")
def tiny_sparse(tmp_path_factory):
    """(tensors, record) of a tiny Llama exported block-sparse with a context of 16 tokens."""
    from tests._utils.tiny import export_tiny_sparse

    _, tensors, record = export_tiny_sparse(tmp_path_factory.mktemp("sparse54"), max_context=16)
    return tensors, record


@pytest.mark.parametrize("keep", [0, 4, -1, 1.0, True])
def test_a_step_keeping_no_row_or_more_rows_than_tokens_is_refused(tiny_sparse, keep):
    """keep=0 returned every row (``hidden[-0:]``), not none; keep=4 of 3 tokens returned 3 rows, not 4."""
    from edgesdk.runtime.sparse_decoder import SparseDecoder

    decoder = SparseDecoder(*tiny_sparse, mode="reference")
    with pytest.raises(RuntimeBackendError, match=rf"keep={keep!r}: expected a whole number of logit rows from 1 "
                                                  r"to the step's 3 tokens"):
        decoder.step(torch.tensor([5, 17, 200]), keep)
    assert decoder.position == 0
    assert decoder.step(torch.tensor([5, 17, 200]), np.int64(3)).shape == (3, 320)


@pytest.mark.parametrize(("before", "count"), [(0, 20), (16, 1), (10, 7)])
def test_a_step_past_max_context_is_refused_and_leaves_the_cache(tiny_sparse, before, count):
    """A prefill past max_context failed in torch's words ("The expanded size of the tensor (16) must match ...");
    a decode step past it in the attention kernel's ("lengths must lie in [0, T_max=16]"), and on a CUDA graph it
    would have written past the cache on the device."""
    from edgesdk.runtime.sparse_decoder import SparseDecoder

    decoder = SparseDecoder(*tiny_sparse, mode="reference")
    ids = torch.arange(1, 17)
    if before:
        decoder.step(ids[:before], 1)
    with pytest.raises(RuntimeBackendError, match=rf"a step of {count} tokens after {before} cached ones makes "
                                                  rf"{before + count}, past the bundle's max_context 16") as caught:
        decoder.step(torch.arange(count) + 3, 1)
    assert "--max-context" in caught.value.fix
    assert decoder.position == before
    if before < 16:  # the cache still takes what fits, with the logits of an uninterrupted run
        got = decoder.step(ids[before:16], 1)
        fresh = SparseDecoder(*tiny_sparse, mode="reference")
        torch.testing.assert_close(got, fresh.step(ids, 1))
