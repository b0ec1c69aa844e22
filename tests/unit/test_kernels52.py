"""Kernels: the AOT loader's driver search when cuda-python cannot reach a GPU, launcher device errors that name
the tensor, and a damaged block-sparse weight in a state dict named by its keys."""

from __future__ import annotations

import json
import re

import pytest
import torch

from edgesdk.kernels import loader
from edgesdk.kernels.block_sparse import BlockSparseWeight
from edgesdk.kernels.loader import (
    CompiledKernels,
    KernelLoadError,
    LoadedKernel,
    load_compiled,
    select_driver,
)


class DynamicLibNotFoundError(RuntimeError):
    """What cuda-pathfinder raises from the first driver call of cuda-python when libcuda.so.1 is absent."""


class _DriverlessCudaPython:
    """cuda.bindings.driver as it behaves on a host (or a container started without the NVIDIA runtime) where
    cuda-python is installed but there is no NVIDIA driver library: importable, every call raises."""

    def __getattr__(self, name):
        def call(*args):
            raise DynamicLibNotFoundError('"cuda" is an NVIDIA driver library and can only be found via system '
                                          'search. Ensure the NVIDIA display driver is installed.')
        return call


@pytest.fixture
def driverless_cuda_python(monkeypatch):
    monkeypatch.setattr(loader, "_import_cuda_python", lambda: _DriverlessCudaPython())


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host where torch sees no GPU")
def test_a_cuda_python_without_a_driver_is_a_kernel_load_error_naming_both_backends(driverless_cuda_python,
                                                                                     tmp_path):
    """cuda-python's DynamicLibNotFoundError escaped select_driver and load_compiled as it was, so the triton
    backend, which turns a KernelLoadError into 'the bundle's kernels do not load here', reported it as weights
    that did not fit in GPU memory; and the torch backend was never tried."""
    kernel_dir = tmp_path / "sm_87"
    kernel_dir.mkdir()
    (kernel_dir / "index.json").write_text(json.dumps({"sm": 87, "kernels": []}))
    with pytest.raises(KernelLoadError) as info:
        load_compiled(kernel_dir)
    message = str(info.value)
    assert "cuda-python is installed but did not reach a GPU (DynamicLibNotFoundError" in message
    assert "torch.cuda is not available" in message
    assert "--runtime nvidia" in message
    with pytest.raises(KernelLoadError, match=r"cuda-python is installed but did not reach a GPU"):
        select_driver("cuda-python")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host where torch sees no GPU")
def test_the_torch_backend_alone_does_not_claim_cuda_python_is_missing(driverless_cuda_python):
    """backend='torch' never tries cuda-python, yet its error said 'cuda-python is not importable'."""
    with pytest.raises(KernelLoadError) as info:
        select_driver("torch")
    assert "cuda-python" not in str(info.value).split("GPU; ", 1)[1]
    assert "torch.cuda is not available" in str(info.value)


def _weight() -> BlockSparseWeight:
    codes = torch.randint(-127, 128, (40, 24), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    return BlockSparseWeight.from_dense(codes, torch.rand(40) + 0.01, block=(16, 8))


def test_triton_mode_names_the_host_tensor_and_the_move():
    """'triton mode takes CUDA tensors, got one on cpu' said neither which argument nor how to fix it."""
    from edgesdk.kernels.triton_kernels import block_sparse_matmul_triton, gqa_decode_attention_triton

    with pytest.raises(ValueError, match=r"triton mode takes CUDA tensors, but x is on cpu: move it with "
                                         r"x\.to\('cuda'\)"):
        block_sparse_matmul_triton(torch.randn(2, 24), _weight(), emulated=False)
    q, cache = torch.randn(1, 2, 8), torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match=r"but k_cache is on meta: move it with k_cache\.to\('cpu'\)"):
        gqa_decode_attention_triton(q, cache.to("meta"), cache, torch.tensor([3]), 0.5, emulated=True)


def test_emulated_mode_names_a_weight_array_elsewhere_and_moves_the_whole_weight():
    from edgesdk.kernels.triton_kernels import block_sparse_matmul_triton

    weight = _weight()
    object.__setattr__(weight, "scales", weight.scales.to("meta"))  # one array left on another device
    with pytest.raises(ValueError, match=r"emulated mode takes CPU tensors, but weight\.scales is on meta: move it "
                                         r"with weight\.to\('cpu'\)"):
        block_sparse_matmul_triton(torch.randn(2, 24), weight, emulated=True)


@pytest.mark.parametrize(("damage", "message"), [
    ({"scales": torch.ones(39)}, r"scales must have N=40 entries, got 39"),
    ({"col_index": torch.tensor([0, 1, 2, 3, 5, 6, 7, 8, 9], dtype=torch.int32)}, r"col_index"),
])
def test_a_damaged_weight_in_a_state_dict_names_its_keys(damage, message):
    """A bundle holds four weights a layer; the check said 'scales must have N=576 entries, got 575' and not
    which of them was damaged."""
    state = {**_weight().state_dict("layers.7.qkv"), **_weight().state_dict("layers.8.qkv")}
    for name, tensor in damage.items():
        state[f"layers.7.qkv.{name}"] = tensor
    BlockSparseWeight.from_state_dict(state, "layers.8.qkv")  # the undamaged one still loads
    with pytest.raises(ValueError, match=rf"block-sparse weight layers\.7\.qkv\.\* \(40x24 in 16x8 plain blocks, "
                                         rf"from layers\.7\.qkv\.meta\) is not valid: .*{message}"):
        BlockSparseWeight.from_state_dict(state, "layers.7.qkv")


def test_a_missing_key_is_named_with_the_keys_a_weight_needs():
    """A missing array was a bare KeyError; a prefix given without its layer number the same."""
    state = _weight().state_dict("layers.7.qkv")
    del state["layers.7.qkv.row_offsets"]
    with pytest.raises(ValueError, match=r"block-sparse weight layers\.7\.qkv\.\* lacks layers\.7\.qkv\.row_offsets: "
                                         r"state_dict\(\) writes layers\.7\.qkv\.values, .*layers\.7\.qkv\.meta"):
        BlockSparseWeight.from_state_dict(state, "layers.7.qkv")
    with pytest.raises(ValueError, match=r"lacks qkv\.values, qkv\.col_index, .*another prefix"):
        BlockSparseWeight.from_state_dict(state, "qkv")


def _bsr_variant(name: str, block_m: int) -> LoadedKernel:
    meta = {"name": name, "kernel": "bsr_matmul", "act_dtype": "fp16",
            "constexprs": {"BLOCK_M": block_m, "BLOCK_N": 32, "BLOCK_K": 32, "TRANSPOSED": False}}
    return LoadedKernel(meta, driver=None, handle=None, source="cubin")


@pytest.mark.parametrize(("rows", "needed"), [(1, "GEMV (decode, < 16 rows) of x (1, 24)"),
                                              (20, "GEMM (prefill, >= 16 rows) of x (20, 24)")])
def test_a_call_no_compiled_variant_fits_says_what_it_needed(rows, needed):
    """'no compiled bsr_matmul variant fits this call (have: [...])' named what was there, not what the call
    needed (which block, layout, GEMV or GEMM), nor the fix."""
    variants = [_bsr_variant("bsr_gemv_plain_32x32_fp16", 1), _bsr_variant("bsr_gemm_plain_32x32_fp16", 16)]
    compiled = CompiledKernels(87, {v.name: v for v in variants}, {}, "cuda-python")
    with pytest.raises(KernelLoadError, match=rf"no compiled bsr_matmul variant for a {re.escape(needed)} by 16x8 "
                                              r"plain blocks \(have: .*\): .*rebuild the bundle"):
        compiled.block_sparse_matmul(torch.randn(rows, 24), _weight())


def test_cuda_python_asked_for_and_not_installed_is_not_sent_to_the_driver():
    """--backend cuda-python without the package: the fix is to install it, not to check the NVIDIA driver."""
    from edgesdk.kernels import loader

    if loader._import_cuda_python() is not None:
        pytest.skip("cuda-python is installed here")
    with pytest.raises(loader.KernelLoadError) as refused:
        loader.select_driver("cuda-python")
    assert "cuda-python is not importable" in str(refused.value)
    assert "NVIDIA driver" not in str(refused.value)
