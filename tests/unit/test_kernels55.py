"""Kernel review: warp counts past CUDA's 1024 threads a block, the PTX ISA version the metadata records, a None
pointer at a compiled launch, and what a driver refusal of a too-new image tells the board's user. No GPU: a
recording driver stands in for CUDA, and the one real compile runs Triton's compiler for sm_87 on the host."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

torch = pytest.importorskip("torch")

from edgesdk.kernels import aot  # noqa: E402
from edgesdk.kernels.aot import compile_for_target, default_variants  # noqa: E402
from edgesdk.kernels.loader import KernelLoadError, load_compiled  # noqa: E402
from edgesdk.kernels.tuning import parse_tuning_overrides, tuning_for  # noqa: E402
from tests.unit.test_kernel_loader import RecordingDriver, fake_kernels, write_kernel_dir  # noqa: E402

GEMV = "bsr_gemv_plain_32x32_fp16"


@pytest.fixture
def driver(monkeypatch):
    from edgesdk.kernels import loader

    recording = RecordingDriver(87)
    monkeypatch.setattr(loader, "select_driver", lambda backend=None, device=0: recording)
    return recording


def _edit(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


# ---------------------------------------------------------------------------------------------- warps per block
@pytest.mark.parametrize("field", ["gemv_num_warps", "gemm_num_warps", "attn_num_warps"])
def test_a_warp_count_past_cudas_block_limit_is_refused_by_name(field):
    """64 warps is a power of two and was taken: 2048 threads a block, which Triton compiles and every GPU's
    cuLaunchKernel refuses (CUDA_ERROR_INVALID_VALUE at the first token)."""
    with pytest.raises(ValueError, match=rf"EDGESDK_KERNEL_TUNING: {field}=64 is 2048 threads .* at most 32"):
        parse_tuning_overrides(f"{field}=64")
    assert parse_tuning_overrides(f"{field}=32") == {field: 32}


def test_the_compiler_refuses_a_variant_of_more_than_1024_threads(tmp_path):
    """compile_for_target shipped a 64-warp GEMV (ok, with a cubin) that no board can launch."""
    tuning = tuning_for(87)  # KernelTuning itself refuses 64 warps: the variant is what the compiler is given
    gemv = [dataclasses.replace(v, num_warps=64) for v in default_variants(tuning) if v.name == GEMV]
    (result,) = compile_for_target(87, tmp_path, tuning, variants=gemv)
    assert not result.ok
    assert result.cubin_path is None
    assert re.search(r"runs 2048 threads a block \(num_warps 64\).*num_warps <= 32", result.error)
    index = json.loads((tmp_path / "sm_87" / "index.json").read_text())
    assert index["kernels"][0]["ok"] is False
    assert not (tmp_path / "sm_87" / f"{GEMV}.cubin").exists()


def test_the_loader_refuses_metadata_of_more_than_1024_threads(tmp_path, driver):
    """A bundle whose kernel was compiled with 64 warps loaded, and its launch failed in the driver's words."""
    kernel_dir = write_kernel_dir(tmp_path)
    _edit(kernel_dir / f"{GEMV}.json", lambda meta: meta.update(num_warps=64, threads_per_block=2048))
    with pytest.raises(KernelLoadError, match=r"threads_per_block 2048 \(num_warps 64\) is more than the 1024 "
                                              r"threads .* rebuild the bundle with num_warps <= 32"):
        load_compiled(kernel_dir)


# ---------------------------------------------------------------------------------------------- PTX ISA version
def test_ptx_isa_version_reads_the_version_directive():
    assert aot.ptx_isa_version("//\n// Generated\n//\n\n.version 8.8\n.target sm_87\n") == "8.8"
    assert aot.ptx_isa_version(".target sm_87\n") is None


def test_the_metadata_records_the_ptx_isa_version_of_its_ptx(tmp_path):
    """The metadata's ptx_version came from Triton's options, None unless a caller forces one: every bundle
    recorded None while its PTX declared an ISA the board's driver must know."""
    pytest.importorskip("triton")
    tuning = tuning_for(87)
    gemv = [v for v in default_variants(tuning) if v.name == GEMV]
    (result,) = compile_for_target(87, tmp_path, tuning, variants=gemv)
    assert result.ok, result.error
    declared = re.search(r"^\.version (\d+\.\d+)$", result.ptx_path.read_text(), re.MULTILINE).group(1)
    assert json.loads(result.meta_path.read_text())["ptx_version"] == declared


# ---------------------------------------------------------------------------------------------- launches
def test_a_none_pointer_is_refused_before_a_launch():
    """None for a pointer parameter was packed as address 0, and the kernel would fault on the GPU."""
    kernels, driver = fake_kernels()
    kernel = kernels[GEMV]
    x = torch.zeros(1, 64, dtype=torch.float16)
    arrays = (torch.zeros(2, dtype=torch.int32), torch.zeros(3, dtype=torch.int32), torch.zeros(64),
              torch.zeros(1, 64))
    with pytest.raises(ValueError, match=r"values_ptr is \*i8 \(compiled so\), got None: .*pass a GPU tensor"):
        kernel.launch((2, 1, 1), x, None, *arrays, 1, 64, 64, 64, 1, 64, 1)
    assert not driver.launches


# ---------------------------------------------------------------------------------------------- driver refusals
@pytest.mark.parametrize(("code", "hinted"), [("CUDA_ERROR_UNSUPPORTED_PTX_VERSION", True),
                                              ("CUDA_ERROR_NO_BINARY_FOR_GPU", True),
                                              ("CUDA_ERROR_OUT_OF_MEMORY", False)])
def test_a_driver_refusing_a_too_new_image_names_the_toolkit_and_the_fix(code, hinted, tmp_path, driver):
    """A board driver older than the build's ptxas refused the image, and the error said only the CUresult: no word
    of the toolkit that made it or of the fix. Other refusals (out of memory) are not blamed on the driver."""
    def refuse(image, kernel_name, shared):
        raise KernelLoadError(f"cuModuleLoadData failed: {code}")

    kernel_dir = write_kernel_dir(tmp_path)
    for path in kernel_dir.glob("*_fp16.json"):
        _edit(path, lambda meta: meta.update(ptxas_release="12.9, V12.9.86", ptx_version="8.8",
                                             triton_version="3.9.0"))
    driver.load = refuse
    with pytest.raises(KernelLoadError, match=rf"did not load on this sm_87 GPU: cuModuleLoadData failed: {code}") \
            as caught:
        load_compiled(kernel_dir)
    said = str(caught.value)
    assert ("ptxas 12.9, V12.9.86, PTX ISA 8.8, triton 3.9.0" in said) is hinted
    assert ("update the board's NVIDIA driver" in said) is hinted
