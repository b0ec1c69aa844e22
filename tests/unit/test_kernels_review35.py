"""Review of the block-sparse kernels, their AOT loader, and the runtimes over them: the loader's argument checks
(the recording driver of test_kernel_loader stands in for the CUDA driver, as there)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.kernels.block_sparse import BlockSparseWeight  # noqa: E402


# ---------------------------------------------------------------------------------------------- AOT loader
@pytest.mark.parametrize(("x_shape", "shown"), [((1, 48), r"\(1, 48\)"), ((16, 80), r"\(16, 80\)"),
                                                ((64,), r"\(64,\)")])
def test_compiled_matmul_refuses_an_activation_of_another_width(x_shape, shown):
    """x of another K than the weight's was launched: the kernel read past x on the GPU (or a wider x's wrong
    columns) where the twin and the Triton launcher refuse it; a 1-D x was an IndexError."""
    from tests.unit.test_kernel_loader import fake_kernels

    kernels, driver = fake_kernels()
    w = BlockSparseWeight.from_dense(torch.ones(64, 64, dtype=torch.int8), torch.ones(64))
    with pytest.raises(ValueError, match=rf"x must be \(M, K=64\), got {shown}"):
        kernels.block_sparse_matmul(torch.randn(x_shape), w)
    assert not driver.launches
    kernels.block_sparse_matmul(torch.randn(1, 64), w)
    assert len(driver.launches) == 1
