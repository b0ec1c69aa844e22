"""Review of the GPU kernel plumbing: the emulated bfloat16 GEMM, blocks the Triton tiles cannot hold, and the PTX
the board's loader hands a newer GPU's driver (arch-specific code, another Triton's launcher ABI)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from edgesdk.kernels.aot import default_variants  # noqa: E402
from edgesdk.kernels.block_sparse import BlockSparseWeight  # noqa: E402
from edgesdk.kernels.loader import KernelLoadError, load_compiled  # noqa: E402
from edgesdk.kernels.reference import block_sparse_matmul_reference  # noqa: E402
from edgesdk.kernels.tuning import tuning_for  # noqa: E402
from tests.unit.test_kernel_loader import RecordingDriver, write_kernel_dir  # noqa: E402


def _weight(n: int, k: int, block: tuple[int, int], layout: str = "plain") -> BlockSparseWeight:
    gen = torch.Generator().manual_seed(n * 1000 + k)
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    scales = torch.rand(n, generator=gen) * 0.01 + 1e-3
    return BlockSparseWeight.from_dense(q, scales, block=block, layout=layout)


@pytest.mark.parametrize("layout", ["plain", "transposed"])
def test_the_emulated_bfloat16_gemm_matches_its_twin(layout):
    """A bfloat16 GEMM (M >= 16, tl.dot) in emulated mode returned numbers ~1e8 times off: Triton 3.9's interpreter
    keeps bfloat16 as uint16 bits, casts int8 to it with astype and multiplies the bits in np.matmul. Ragged N, K
    (50 x 70 in 16 x 16 blocks) and M (17, a tile and one row)."""
    pytest.importorskip("triton")
    from edgesdk.kernels.triton_kernels import block_sparse_matmul_triton

    w = _weight(50, 70, (16, 16), layout)
    x = torch.randn(17, 70, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    out = block_sparse_matmul_triton(x, w, emulated=True, tuning=tuning_for(87))
    ref = block_sparse_matmul_reference(x, w)
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max() <= 1e-2 * ref.abs().max()  # bfloat16 output rounding: 2^-8


@pytest.mark.parametrize("block", [(24, 24), (32, 48)])
def test_a_block_the_triton_tiles_cannot_hold_is_refused_by_name(block):
    """A block edge that is not a power of two reached tl.arange and failed inside Triton's interpreter (or its
    compiler on a GPU) with "arange's range must be a power of 2"; now a ValueError names the block and the fix."""
    pytest.importorskip("triton")
    from edgesdk.kernels.triton_kernels import block_sparse_matmul_triton

    w = _weight(50, 70, block)
    with pytest.raises(ValueError, match=rf"block \({block[0]}, {block[1]}\) of a 50x70 weight.*power-of-two block"):
        block_sparse_matmul_triton(torch.randn(3, 70), w, emulated=True)


# ---------------------------------------------------------------------------------------------- the PTX a newer GPU JITs
def _ptx(kernel_name: str, target: str, params: int) -> str:
    """A PTX module as Triton writes one: its ``.target`` and the entry with ``params`` parameters."""
    declared = ",\n".join(f"\t.param .u64 .ptr .global .align 1 {kernel_name}_param_{i}" for i in range(params))
    return (f"//\n.version 8.8\n.target {target}\n.address_size 64\n\n.visible .entry {kernel_name}(\n{declared}\n)\n"
            "{\n\tret;\n}\n")


def _kernel_dir(root, sm: int, target: str, extra_params: int = 0):
    """A kernels/sm_XX directory (test_kernel_loader's layout) whose PTX files declare ``target`` and the
    parameters the loader passes, plus ``extra_params``."""
    out = write_kernel_dir(root, sm)
    for variant in default_variants(tuning_for(sm)):
        count = len(variant.params()) + 2 + extra_params  # the runtime parameters, then two scratch pointers
        (out / f"{variant.name}.ptx").write_text(_ptx(variant.name, target, count))
    return out


@pytest.fixture
def driver_of(monkeypatch):
    from edgesdk.kernels import loader

    def make(capability: int) -> RecordingDriver:
        recording = RecordingDriver(capability)
        monkeypatch.setattr(loader, "select_driver", lambda backend=None, device=0: recording)
        return recording

    return make


def test_an_sm87_bundle_runs_as_ptx_on_a_newer_gpu(tmp_path, driver_of):
    """sm_87 PTX is forward-compatible: a newer GPU's driver JITs it (what the checks below must not refuse)."""
    driver = driver_of(90)
    kernels = load_compiled(_kernel_dir(tmp_path, 87, "sm_87"))
    assert len(kernels) == len(default_variants(tuning_for(87)))
    assert {k.source for k in kernels.values()} == {"ptx"}
    assert all(image.startswith(b"//\n.version") for image, _ in driver.loaded)


@pytest.mark.parametrize("capability", [100, 120])
def test_arch_specific_ptx_for_another_gpu_is_refused_with_the_fix(capability, tmp_path, driver_of):
    """Triton compiles sm_90 as sm_90a, arch-specific PTX that runs on compute capability 9.0 only (PTX ISA,
    "Target Directives"). The loader handed it to a newer GPU's driver, which refuses it with a bare
    CUDA_ERROR_INVALID_PTX; now the load names the file, the code's target, this GPU and the fix."""
    driver = driver_of(capability)
    kernel_dir = _kernel_dir(tmp_path, 90, "sm_90a")
    with pytest.raises(KernelLoadError) as caught:
        load_compiled(kernel_dir)
    message = str(caught.value)
    assert "is sm_90a code, arch-specific PTX that runs only on sm_90 GPUs" in message
    assert f"this GPU is sm_{capability}" in message
    assert "build the bundle for this GPU's target" in message
    assert not driver.loaded


def test_arch_specific_ptx_runs_on_its_own_gpu(tmp_path, driver_of):
    """The same sm_90a kernels on an sm_90 GPU load their cubins, untouched by the PTX checks."""
    driver_of(90)
    kernels = load_compiled(_kernel_dir(tmp_path, 90, "sm_90a"))
    assert {k.source for k in kernels.values()} == {"cubin"}


def test_ptx_for_another_sm_than_its_metadata_is_refused(tmp_path, driver_of):
    """The cubin's ELF header was checked against the metadata's SM, the PTX's ``.target`` was not: an sm_89 PTX
    in an sm_87 directory was JIT-compiled as if it were the Orin code."""
    driver_of(90)
    with pytest.raises(KernelLoadError, match=r"holds sm_89 code, but its metadata says sm_87: .*mixed"):
        load_compiled(_kernel_dir(tmp_path, 87, "sm_89"))


@pytest.mark.parametrize("extra", [-1, 1])
def test_ptx_of_another_launcher_abi_is_refused(extra, tmp_path, driver_of):
    """cuLaunchKernel reads as many parameters as the image declares. A kernel from a Triton with one hidden
    parameter fewer (no profile scratch) or more than the two scratch pointers the loader appends was launched
    anyway, reading its last parameter from past the array; now it is refused, naming both counts."""
    driver_of(90)
    kernel_dir = _kernel_dir(tmp_path, 87, "sm_87", extra_params=extra)
    meta = json.loads((kernel_dir / "bsr_gemv_plain_32x32_fp16.json").read_text())
    meta["triton_version"] = "3.4.0"
    (kernel_dir / "bsr_gemv_plain_32x32_fp16.json").write_text(json.dumps(meta))
    passed = len(meta["params"]) + 2
    with pytest.raises(KernelLoadError, match=rf"declares {passed + extra} kernel parameters for .*this loader passes "
                                              rf"{passed} .*another launcher ABI"):
        load_compiled(kernel_dir)


# ---------------------------------------------------------------------------------------------- the AOT compiler
def test_the_compiler_refuses_a_kernel_of_another_launcher_abi(tmp_path, monkeypatch):
    """compile_for_target wrote the two scratch pointers into every variant's metadata whatever the installed
    Triton compiled; a Triton with another hidden-parameter list shipped kernels the board launches wrongly. Now
    the variant is refused, naming the Triton version and the one to install, and no file is written for it."""
    pytest.importorskip("triton")
    from edgesdk.kernels import aot

    tuning = tuning_for(87)
    variants = aot.default_variants(tuning, group_blocks=(1,), layouts=("plain",))

    def fake_compile(variant, sm):
        name = f"_{variant.kernel}_kernel"
        hidden = 1 if variant.kernel == "gqa_decode" else 2  # attention from a Triton with one scratch pointer
        md = SimpleNamespace(name=name, shared=0, num_warps=variant.num_warps, num_stages=variant.num_stages,
                             ptx_version=None, global_scratch_size=0, global_scratch_align=1, profile_scratch_size=0,
                             profile_scratch_align=1)
        return SimpleNamespace(metadata=md, asm={"cubin": b"\x7fELF",
                                                 "ptx": _ptx(name, f"sm_{sm}", len(variant.params()) + hidden)})

    monkeypatch.setattr(aot, "compile_variant", fake_compile)
    results = {r.name: r for r in aot.compile_for_target(87, tmp_path, tuning, variants=variants)}
    attention = results["gqa_decode_d64_g1_fp16"]
    assert not attention.ok
    assert f"compiled _gqa_decode_kernel with {len(variants[-1].params()) + 1} kernel parameters" in attention.error
    assert "install 'triton==3.9.0'" in attention.error
    assert not (tmp_path / "sm_87" / "gqa_decode_d64_g1_fp16.cubin").exists()
    assert results["bsr_gemv_plain_32x32_fp16"].ok


def test_the_installed_triton_compiles_the_abi_the_loader_launches(tmp_path, monkeypatch):
    """The real compiler's kernel takes the runtime parameters and the two scratch pointers, as the loader packs."""
    pytest.importorskip("triton")
    from edgesdk.kernels import aot

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    variant = aot.default_variants(tuning_for(87), group_blocks=(1,), layouts=("plain",))[0]
    compiled = aot.compile_variant(variant, 87)
    assert aot.ptx_entry_params(compiled.asm["ptx"], compiled.metadata.name) == len(variant.params()) + 2


# ---------------------------------------------------------------------------------------------- host tensors
def test_a_host_tensor_is_refused_before_a_gpu_launch():
    """The loader handed a CPU tensor's address to cuLaunchKernel: the kernel faults on it and the CUDA context is
    left unusable for the rest of the process. Triton's launcher refuses it ("Pointer argument (at 0) cannot be
    accessed from Triton (cpu tensor?)", backends/nvidia/driver.c getPointer); the real drivers here now do."""
    from edgesdk.kernels.loader import _CudaPythonDriver, _LibcudaDriver
    from tests.unit.test_kernel_loader import fake_kernels

    assert _CudaPythonDriver.host_memory is False
    assert _LibcudaDriver.host_memory is False
    kernels, driver = fake_kernels(87)
    driver.host_memory = False  # the recording driver reads host memory; a CUDA driver does not
    w = _weight(64, 64, (32, 32))
    with pytest.raises(ValueError, match=r"bsr_gemv_plain_32x32_fp16: x_ptr is a cpu tensor, which the GPU cannot "
                                         r"read.*move it to the GPU"):
        kernels.block_sparse_matmul(torch.randn(1, 64), w)
    assert not driver.launches
