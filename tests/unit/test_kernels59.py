"""Kernels on odd inputs (shapes off the block, density 0 and 1, one block, int8 -128, zero scales) in the twins and
the interpreted Triton kernels; the AOT compile under TRITON_INTERPRET=1; the board loader's metadata checks."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import struct
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from edgesdk.kernels import loader  # noqa: E402
from edgesdk.kernels.aot import default_variants  # noqa: E402
from edgesdk.kernels.block_sparse import BlockSparseWeight  # noqa: E402
from edgesdk.kernels.loader import KernelLoadError, load_compiled  # noqa: E402
from edgesdk.kernels.reference import block_sparse_matmul_reference, gqa_decode_attention_reference  # noqa: E402
from edgesdk.kernels.triton_kernels import block_sparse_matmul_triton, gqa_decode_attention_triton  # noqa: E402
from edgesdk.kernels.tuning import tuning_for  # noqa: E402


# ---------------------------------------------------------------------------------------------- twins and kernels
@pytest.mark.parametrize(("n", "k", "block", "m", "density", "layout"), [
    (33, 47, (16, 16), 1, 0.5, "plain"),        # rows and cols off the block, GEMV
    (33, 47, (16, 16), 17, 0.5, "transposed"),  # GEMM (tl.dot)
    (16, 16, (16, 16), 1, 1.0, "plain"),        # a single block
    (40, 40, (8, 8), 20, 0.0, "plain"),         # nothing stored
    (70, 130, (32, 32), 9, 1.0, "transposed"),  # every block, 9 rows (two GEMV row tiles)
    (3, 5, (2, 4), 33, 1.0, "plain"),           # blocks smaller than the weight's tail
])
def test_twin_and_interpreted_kernel_agree_on_odd_shapes(n, k, block, m, density, layout):
    gen = torch.Generator().manual_seed(n * k + m)
    wq = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    wq[0, 0] = wq[-1, -1] = -128  # int8's extreme, which has no positive twin
    scales = torch.rand(n, generator=gen) + 0.5
    scales[1] = 0.0  # a pruned output channel
    mask = torch.rand(-(-n // block[0]), -(-k // block[1]), generator=gen) < density
    w = BlockSparseWeight.from_dense(wq, scales, block, mask=mask if density < 1 else None, layout=layout)
    x = torch.randn(m, k, generator=gen)
    twin = block_sparse_matmul_reference(x, w)
    assert torch.allclose(twin, x @ w.dequantized().T, rtol=1e-4, atol=1e-3)
    assert torch.equal(twin[:, 1], torch.zeros(m))
    if density == 0:
        assert w.nnz_blocks == 0
        assert torch.equal(twin, torch.zeros(m, n))
    for dtype, tol in ((torch.float32, 1e-3), (torch.float16, 2e-2)):
        got = block_sparse_matmul_triton(x.to(dtype), w, emulated=True)
        assert got.dtype == dtype
        assert got.shape == (m, n)
        assert torch.allclose(got.float(), block_sparse_matmul_reference(x.to(dtype), w), rtol=tol,
                              atol=tol * max(1.0, float(twin.abs().max()) if twin.numel() else 1.0))


@pytest.mark.parametrize(("b", "hq", "hkv", "t_max", "d", "lengths", "window"), [
    (1, 1, 1, 1, 1, [1], None),          # one position, head dim 1
    (2, 6, 2, 7, 5, [0, 7], None),       # a row of length 0; group 3 and D 5 padded to powers of two
    (3, 4, 4, 33, 24, [33, 1, 17], 3),   # T_max off the tile, a window
    (2, 3, 1, 9, 3, [9, 4], 100),        # a window wider than the cache
])
@pytest.mark.parametrize("scale", [0.3, 0.0])
def test_attention_twin_and_interpreted_kernel_agree_on_odd_shapes(b, hq, hkv, t_max, d, lengths, window, scale):
    gen = torch.Generator().manual_seed(b * 100 + t_max)
    q, k, v = (torch.randn(shape, generator=gen) for shape in ((b, hq, d), (b, hkv, t_max, d), (b, hkv, t_max, d)))
    lens = torch.tensor(lengths)
    twin = gqa_decode_attention_reference(q, k, v, lens, scale, window)
    got = gqa_decode_attention_triton(q, k, v, lens, scale, emulated=True, window=window)
    assert torch.allclose(got, twin, atol=1e-5, rtol=1e-4)
    if scale == 0.0:  # every score 0: the mean of the values the row reads
        row = max(range(b), key=lambda i: lengths[i])
        first = max(0, lengths[row] - (window or lengths[row]))
        mean = v[row, :, first:lengths[row]].mean(dim=1)  # (Hkv, D)
        assert torch.allclose(twin[row], mean.repeat_interleave(hq // hkv, dim=0), atol=1e-5)


# ---------------------------------------------------------------------------------------------- AOT under TRITON_INTERPRET
_COMPILE_UNDER_INTERPRET = """
import sys, torch
from pathlib import Path
from edgesdk.kernels.aot import compile_for_target, default_variants
from edgesdk.kernels.tuning import tuning_for
from edgesdk.kernels.triton_kernels import gqa_decode_attention_triton
q, c = torch.randn(1, 2, 16), torch.randn(1, 1, 4, 16)
gqa_decode_attention_triton(q, c, c, torch.tensor([4]), 0.25, emulated=True)  # an interpreted run first
tuning = tuning_for(87)
variants = [v for v in default_variants(tuning, head_dims=(16,), group_blocks=(2,), layouts=("plain",))
            if v.kernel == "gqa_decode"]
for result in compile_for_target(87, Path(sys.argv[1]), tuning, variants=variants):
    print(result.name, result.ok, result.error)
gqa_decode_attention_triton(q, c, c, torch.tensor([4]), 0.25, emulated=True)  # and the interpreter still runs
"""


def test_the_aot_compile_works_under_triton_interpret(tmp_path):
    """With TRITON_INTERPRET=1 in the environment (how Triton users run kernels on a CPU) triton.language's helpers
    are InterpretedFunctions, and every AOT compile failed with "'value' object has no attribute 'dtype'" (the
    build then stopped at 'did not compile'); a warm Triton cache hid it."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", _COMPILE_UNDER_INTERPRET, str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["gqa_decode_d16_g2_fp16", "True", "None"], done.stdout[-2000:]
    assert (tmp_path / "out" / "sm_87" / "gqa_decode_d16_g2_fp16.cubin").stat().st_size > 0


# ---------------------------------------------------------------------------------------------- loader metadata
class RecordingDriver:
    """Stands in for the CUDA driver of a ``capability`` GPU: loads nothing, records each launch's pointers."""

    name = "recording"

    def __init__(self, capability: int = 87):
        self._capability, self.launches = capability, []

    def capability(self) -> int:
        return self._capability

    def load(self, image, kernel_name, shared):
        return ("module", kernel_name)

    def alloc(self, nbytes):
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        return buffer.data_ptr(), buffer

    def launch(self, handle, grid, threads, shared, stream, params_address):
        first = (ctypes.c_void_p * 1).from_address(params_address)[0]
        self.launches.append(ctypes.c_void_p.from_address(first).value)  # the first parameter: x_ptr / q_ptr


def _cubin(kernel_name: str, sm: int) -> bytes:
    """A 64-bit CUDA ELF header with ``sm`` in e_flags (ABI 7, low byte) and the kernel symbol."""
    header = bytearray(64)
    header[:4], header[4], header[5], header[8] = b"\x7fELF", 2, 1, 7
    struct.pack_into("<HH", header, 16, 2, 190)  # ET_EXEC, EM_CUDA
    struct.pack_into("<I", header, 48, (sm << 16) | 0x500 | sm)
    return bytes(header) + b"\0" + kernel_name.encode() + b"\0"


def _ptx(kernel_name: str, sm: int, params: int) -> bytes:
    listed = ",\n".join(f"  .param .u64 {kernel_name}_param_{i}" for i in range(params))
    return f".version 8.7\n.target sm_{sm}\n.visible .entry {kernel_name}(\n{listed}\n)\n{{\n}}\n".encode()


def _kernel_dir(root, sm: int = 87):
    """kernels/sm_XX as aot.compile_for_target lays it out (GEMV, GEMM, one attention variant), made-up images."""
    out = root / f"sm_{sm}"
    out.mkdir(parents=True)
    entries = []
    for variant in default_variants(tuning_for(sm), layouts=("plain",), group_blocks=(4,)):
        cubin, ptx = _cubin(variant.name, sm), _ptx(variant.name, sm, len(variant.params()) + 2)
        (out / f"{variant.name}.cubin").write_bytes(cubin)
        (out / f"{variant.name}.ptx").write_bytes(ptx)
        meta = {"name": variant.name, "kernel_name": variant.name, "kernel": variant.kernel, "sm": sm,
                "triton_version": "3.9.0", "params": [list(p) for p in variant.params()],
                "constexprs": dict(variant.constexprs), "act_dtype": variant.act_dtype, "grid": variant.grid,
                "num_warps": variant.num_warps, "threads_per_block": 32 * variant.num_warps,
                "shared_memory_bytes": 0, "pointer_alignment": 16, "global_scratch_size": 0,
                "profile_scratch_size": 0, "files": {"cubin": f"{variant.name}.cubin", "ptx": f"{variant.name}.ptx"},
                "cubin_sha256": hashlib.sha256(cubin).hexdigest(), "ptx_sha256": hashlib.sha256(ptx).hexdigest(),
                "tuning": tuning_for(sm).to_dict()}
        (out / f"{variant.name}.json").write_text(json.dumps(meta))
        entries.append({"name": variant.name, "ok": True, "meta_path": f"{variant.name}.json"})
    (out / "index.json").write_text(json.dumps({"sm": sm, "kernels": entries}))
    return out


def _edit(path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.fixture
def gpu(monkeypatch):
    """The loader's driver: a recording one; ``gpu.capability`` picks the GPU it stands for (default sm_87)."""
    class Chooser:
        capability = 87
        driver = None

    def select(backend=None, device=0):
        Chooser.driver = RecordingDriver(Chooser.capability)
        return Chooser.driver

    monkeypatch.setattr(loader, "select_driver", select)
    return Chooser


GQA = "gqa_decode_d64_g4_fp16.json"
GEMV = "bsr_gemv_plain_32x32_fp16.json"
MALFORMED = {  # field change -> what the error says; each loaded before and failed at a call, or not at all
    "string BLOCK_D": (GQA, lambda m: m["constexprs"].update(BLOCK_D="64"), r"constexprs BLOCK_D is '64'"),
    "null WINDOW": (GQA, lambda m: m["constexprs"].update(WINDOW=None), r"constexprs WINDOW is None"),
    "BLOCK_G not a power of two": (GQA, lambda m: m["constexprs"].update(BLOCK_G=3), r"constexprs BLOCK_G is 3"),
    "zero BLOCK_M": (GEMV, lambda m: m["constexprs"].update(BLOCK_M=0), r"constexprs BLOCK_M is 0"),
    "string ATOMIC": (GEMV, lambda m: m["constexprs"].update(ATOMIC="yes"), r"constexprs ATOMIC is 'yes'"),
    "zero pointer_alignment": (GEMV, lambda m: m.update(pointer_alignment=0), r"pointer_alignment is 0"),
    "list act_dtype": (GEMV, lambda m: m.update(act_dtype=["fp16"]), r"act_dtype \['fp16'\] is not one of"),
    "list kernel": (GEMV, lambda m: m.update(kernel=["bsr_matmul"]), r"kernel \['bsr_matmul'\] is none this"),
    "object num_warps": (GEMV, lambda m: m.update(num_warps={}), r"num_warps is \{\}"),
    "negative scratch": (GEMV, lambda m: m.update(global_scratch_size=-4), r"global_scratch_size is -4"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_metadata_is_refused_at_load_naming_the_file_and_field(case, tmp_path, gpu):
    """A string BLOCK_D or a null WINDOW loaded and raised TypeError at open (CompiledKernels.missing) or at the
    first token, a pointer_alignment of 0 ZeroDivisionError at the first launch, a list act_dtype TypeError
    (unhashable) out of load_compiled, which the triton backend does not catch; a string ATOMIC loaded."""
    kernel_dir = _kernel_dir(tmp_path)
    assert len(load_compiled(kernel_dir)) == 3  # intact
    name, change, message = MALFORMED[case]
    _edit(kernel_dir / name, change)
    with pytest.raises(KernelLoadError, match=message) as refused:
        load_compiled(kernel_dir)
    assert str(kernel_dir / name) in str(refused.value)
    assert "rebuild the bundle" in str(refused.value)


def test_metadata_without_pointer_alignment_gets_the_alignment_every_compile_declares(tmp_path, gpu):
    """Every AOT kernel is compiled for 16-byte aligned pointers (aot.POINTER_ALIGNMENT); metadata without the field
    defaulted to 1, so an offset view (a fused projection's part) was launched unaligned into a kernel that
    assumes alignment (a misaligned-address fault on a GPU) instead of being copied."""
    kernel_dir = _kernel_dir(tmp_path)
    for name in (GEMV, GQA):
        _edit(kernel_dir / name, lambda m: m.pop("pointer_alignment"))
    kernels = load_compiled(kernel_dir)
    w = BlockSparseWeight.from_dense(torch.ones(64, 64, dtype=torch.int8), torch.ones(64))
    view = torch.randn(65, dtype=torch.float16)[1:].reshape(1, 64)  # 2 bytes off its buffer's start
    assert view.data_ptr() % 16
    kernels.block_sparse_matmul(view, w)
    q = torch.randn(1 + 4 * 64, dtype=torch.float16)[1:].reshape(1, 4, 64)
    cache = torch.randn(1, 1, 8, 64, dtype=torch.float16)
    kernels.gqa_decode_attention(q, cache, cache, torch.tensor([8]), 0.125)
    assert len(gpu.driver.launches) == 2
    assert all(pointer % 16 == 0 for pointer in gpu.driver.launches), [hex(p) for p in gpu.driver.launches]


def test_a_nul_in_a_metadata_path_is_refused_by_name(tmp_path, gpu):
    """An index entry naming its metadata with a NUL raised ValueError ('embedded null byte') out of the loader."""
    kernel_dir = _kernel_dir(tmp_path)
    _edit(kernel_dir / "index.json", lambda index: index["kernels"][0].update(meta_path="a\0b.json"))
    with pytest.raises(KernelLoadError, match=r"index.json names kernel metadata 'a\\x00b.json', which is not a "
                                              r"file inside .*copy the whole bundle again or rebuild it"):
        load_compiled(kernel_dir)


def test_a_cubin_for_another_sm_is_refused_naming_it_and_the_fix(tmp_path, gpu):
    kernel_dir = _kernel_dir(tmp_path)
    cubin = _cubin("bsr_gemv_plain_32x32_fp16", 72)
    (kernel_dir / "bsr_gemv_plain_32x32_fp16.cubin").write_bytes(cubin)
    _edit(kernel_dir / GEMV, lambda m: m.update(cubin_sha256=hashlib.sha256(cubin).hexdigest()))
    with pytest.raises(KernelLoadError, match=r"cubin .*bsr_gemv_plain_32x32_fp16.cubin holds sm_72 code, but "
                                              r".*say sm_87: .*rebuild the bundle for this board"):
        load_compiled(kernel_dir)


def test_a_missing_ptx_is_refused_on_a_newer_gpu_naming_it(tmp_path, gpu):
    """A newer GPU loads the PTX (the driver JIT-compiles it); the cubin is not read there."""
    kernel_dir = _kernel_dir(tmp_path)
    gpu.capability = 89
    assert {k.source for k in load_compiled(kernel_dir).values()} == {"ptx"}
    (kernel_dir / "gqa_decode_d64_g4_fp16.ptx").unlink()
    with pytest.raises(KernelLoadError, match=r"ptx .*gqa_decode_d64_g4_fp16.ptx of kernel gqa_decode_d64_g4_fp16 is "
                                              r"not readable .*copy the whole bundle again"):
        load_compiled(kernel_dir)


def test_ptx_of_another_tritons_launcher_abi_is_refused_naming_the_version(tmp_path, gpu):
    """Triton 3.4 compiled one scratch pointer, not two: the kernel takes one parameter less than the loader packs."""
    kernel_dir = _kernel_dir(tmp_path)
    gpu.capability = 89
    ptx = _ptx("bsr_gemv_plain_32x32_fp16", 87, 14)
    (kernel_dir / "bsr_gemv_plain_32x32_fp16.ptx").write_bytes(ptx)
    _edit(kernel_dir / GEMV, lambda m: m.update(ptx_sha256=hashlib.sha256(ptx).hexdigest(), triton_version="3.4.0"))
    with pytest.raises(KernelLoadError, match=r"ptx .*bsr_gemv_plain_32x32_fp16.ptx of kernel .* declares 14 kernel "
                                              r"parameters .*passes 15 .*\(triton 3.4.0\); rebuild the bundle with "
                                              r"this edgesdk and triton==3.9.0"):
        load_compiled(kernel_dir)
