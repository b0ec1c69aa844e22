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


# ---------------------------------------------------------------------------------------------- triton backend
@pytest.fixture(scope="module")
def tiny_sparse(tmp_path_factory):
    """(model, tensors, record): a tiny Llama exported block-sparse (vocabulary 320, max_context 64)."""
    from tests._utils.tiny import export_tiny_sparse

    return export_tiny_sparse(tmp_path_factory.mktemp("sparse"), max_context=64)


def twin_backend(tiny_sparse):
    from edgesdk.runtime.sparse_decoder import SparseDecoder
    from edgesdk.runtime.triton_backend import TritonBackend

    _, tensors, record = tiny_sparse
    return TritonBackend(SparseDecoder(tensors, record, mode="reference"), "reference")


def test_the_triton_backend_tells_its_vocabulary_so_an_id_past_it_is_refused_before_the_prefill(tiny_sparse):
    """The backend had no ``vocab_size``: a prompt id past the embedding rows reached ``embed[ids]`` as an
    IndexError (on a GPU a device-side assert that ends the CUDA context), and ``edgesdk run --draft`` on this
    backend, which can rewind, stopped with an AttributeError reading it."""
    import numpy as np

    from edgesdk.errors import EdgeSDKError
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.speculative import DraftModel

    backend = twin_backend(tiny_sparse)
    assert backend.vocab_size == 320 == tiny_sparse[2]["vocab_size"]
    with pytest.raises(EdgeSDKError, match="token id 320 at position 1; the bundle's model reads ids 0 to 319"):
        generate(backend, [5, 320, 7], SamplingConfig(max_new_tokens=2), stop_ids=set())
    assert backend.position == 0
    assert DraftModel(twin_backend(tiny_sparse), vocab_size=backend.vocab_size).rows == 320
    assert backend.decode(5).shape == (backend.vocab_size,)
    assert np.isfinite(backend.prefill(np.array([7, 319]))).all()


# ---------------------------------------------------------------------------------------------- BSR format
@pytest.mark.parametrize("block", [(0, 32), (32, 0), (-32, 32), (32,), (32, 32, 1)])
def test_from_dense_refuses_a_block_that_is_not_two_positive_sizes(block):
    """A zero block edge was a ZeroDivisionError, a negative one torch's 'invalid shape dimension' RuntimeError,
    before the constructor's own check could name the block."""
    with pytest.raises(ValueError, match=r"block must be two positive integers \(block_n, block_k\), got "
                                         + str(tuple(block)).replace("(", r"\(").replace(")", r"\)")):
        BlockSparseWeight.from_dense(torch.ones(64, 64, dtype=torch.int8), torch.ones(64), block=block)
    w = BlockSparseWeight.from_dense(torch.ones(64, 48, dtype=torch.int8), torch.ones(64), block=(32, 16))
    assert (w.block_rows, w.block_cols, w.nnz_blocks) == (2, 3, 6)


# ---------------------------------------------------------------------------------------------- AOT build step
def test_a_board_of_an_sm_without_kernel_tuning_stops_the_build_with_a_build_error(tmp_path):
    """A user's own board profile (targets/README.md, 'Adding your own board') with a GPU of an SM the kernels have
    no tuning for (Jetson TX2's 62, Thor's 101) and a block-sparse recipe ended the build with tuning_for's
    ValueError, whose fix ('pass sm_count and shared_memory_kb') no profile field can follow."""
    from types import SimpleNamespace

    from edgesdk.build.sparse_step import compile_kernels
    from edgesdk.errors import BuildError

    profile = SimpleNamespace(name="my-tx2", gpu=SimpleNamespace(sm=62), sparsity_block=32)
    record = {"block": 32, "layout": "plain", "head_dim": 64, "layers": [{"heads": 9, "kv_heads": 3, "ffn": 64}]}
    with pytest.raises(BuildError, match=r"my-tx2's GPU is sm_62, and the block-sparse kernels have launch "
                                         r"settings only for sm_53, sm_72, sm_75, sm_80, sm_86, sm_87, sm_89, "
                                         r"sm_90") as caught:
        compile_kernels(profile, tmp_path / "kernels", record)
    assert "export.sparse=false" in caught.value.fix
    assert not (tmp_path / "kernels").exists()


# ---------------------------------------------------------------------------------------------- TensorRT
def test_the_gpu_query_gives_the_cuda_runtimes_own_reason():
    """Every failure of cudaGetDeviceCount read 'the CUDA runtime sees no CUDA device', also 'CUDA driver version
    is insufficient for CUDA runtime version' (a runtime newer than the board's driver), which needs another fix
    than a device to make visible. Runs against this machine's libcudart when it has one and no GPU answers."""
    import ctypes

    from edgesdk.errors import RuntimeBackendError
    from edgesdk.runtime import tensorrt_engine as te

    lib = te._cudart()
    if lib is None:
        pytest.skip("no libcudart here")
    count = ctypes.c_int(0)
    error = lib.cudaGetDeviceCount(ctypes.byref(count))
    if error == 0:
        pytest.skip("the CUDA runtime reaches a driver here")
    lib.cudaGetErrorString.restype = ctypes.c_char_p
    text = lib.cudaGetErrorString(error).decode()
    sm, how = te.cuda_device_sm()
    assert sm is None
    assert how.startswith("the CUDA runtime libcudart")
    assert how.endswith(f"reports: {text} (error {error})")
    with pytest.raises(RuntimeBackendError, match="no CUDA device is usable here") as caught:
        te.require_sm()
    assert text in caught.value.problem
