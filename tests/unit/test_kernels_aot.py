"""AOT compilation of the decode kernels for Orin (sm_87) and Xavier (sm_72) on a host without a GPU, checked with
the ``cuobjdump`` that ships with Triton."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

triton = pytest.importorskip("triton", reason="AOT compilation needs triton (pip install edgesdk[kernels])")

from edgesdk.kernels.aot import compile_for_target, default_variants  # noqa: E402
from edgesdk.kernels.tuning import tuning_for  # noqa: E402

CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


@pytest.fixture(scope="module", params=[87, 72])
def compiled(request, tmp_path_factory):
    """Compiled into an empty Triton cache, so the front end runs every time (a warm cache skips it)."""
    sm = request.param
    out = tmp_path_factory.mktemp(f"kernels_{sm}")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_CACHE_DIR", str(tmp_path_factory.mktemp(f"triton_cache_{sm}")))
        return sm, out, compile_for_target(sm, out, tuning_for(sm))


def test_every_variant_compiles_with_launch_metadata(compiled):
    sm, out, results = compiled
    expected = {v.name for v in default_variants(tuning_for(sm))}
    assert {r.name for r in results} == expected
    failed = {r.name: r.error for r in results if not r.ok}
    assert not failed, f"sm_{sm} refused: {failed}"
    index = json.loads((out / f"sm_{sm}" / "index.json").read_text())
    assert index["sm"] == sm
    assert len(index["kernels"]) == len(expected)
    for r in results:
        assert r.cubin_path.parent == out / f"sm_{sm}"
        assert r.cubin_path.stat().st_size > 0
        ptx = r.ptx_path.read_text()
        assert f".target sm_{sm}" in ptx
        assert f".entry {r.kernel_name}" in ptx
        meta = json.loads(r.meta_path.read_text())
        assert meta["kernel_name"] == r.kernel_name
        assert meta["sm"] == sm
        assert meta["num_warps"] == r.num_warps
        assert meta["num_stages"] == r.num_stages
        assert meta["shared_memory_bytes"] == r.shared_memory_bytes
        assert meta["fits_shared_memory"]
        assert meta["grid"]["dims"]
        assert meta["grid"]["rule"]
        signature = dict(meta["signature"])
        assert all(signature[name] == "constexpr" for name in meta["constexprs"])
        assert meta["params"] == [[n, t] for n, t in meta["signature"] if t != "constexpr"]


@pytest.mark.skipif(not CUOBJDUMP.is_file(), reason="triton ships no cuobjdump here")
def test_cuobjdump_lists_the_sm_code_and_the_kernel(compiled):
    sm, _, results = compiled
    for r in results:
        elf = subprocess.run([str(CUOBJDUMP), "--list-elf", str(r.cubin_path)], capture_output=True, text=True)
        assert elf.returncode == 0, elf.stderr
        assert f".sm_{sm}." in elf.stdout, elf.stdout  # "ELF file 1: <name>.sm_87.cubin"
        symbols = subprocess.run([str(CUOBJDUMP), "--dump-elf-symbols", str(r.cubin_path)], capture_output=True,
                                 text=True)
        assert symbols.returncode == 0, symbols.stderr
        entries = [line.split()[-1] for line in symbols.stdout.splitlines() if "STO_ENTRY" in line]
        assert entries == [r.kernel_name], symbols.stdout
        print(f"\n[cuobjdump] {r.cubin_path.name}: {elf.stdout.strip()} | entry {entries[0]}")


def test_tuning_must_match_the_target(tmp_path):
    with pytest.raises(ValueError, match="sm_72"):
        compile_for_target(87, tmp_path, tuning_for(72))


class RecordingDriver:
    """Stands in for the CUDA driver: decodes the kernel-parameter array the loader builds."""

    name = "recording"

    def __init__(self):
        self.launches = []

    def launch(self, handle, grid, threads, shared, stream, params_address):
        import ctypes

        count = len(self.meta["params"]) + 2
        slots = (ctypes.c_void_p * count).from_address(params_address)
        types = {"i32": ctypes.c_int32, "fp32": ctypes.c_float}
        values = []
        for slot, (_, ty) in zip(slots, self.meta["params"] + [["g", "*i8"], ["p", "*i8"]], strict=True):
            ctype = ctypes.c_void_p if ty.startswith("*") else types[ty]
            values.append(ctype.from_address(slot).value)
        self.launches.append((handle, grid, threads, shared, stream, values))


def test_loader_packs_parameters_in_signature_order(compiled):
    """The loader's launch path without a GPU: grid rule, block size, shared bytes and the parameter array."""
    torch = pytest.importorskip("torch")
    from edgesdk.kernels.block_sparse import BlockSparseWeight
    from edgesdk.kernels.loader import CompiledKernels, LoadedKernel

    sm, out, results = compiled
    driver = RecordingDriver()
    loaded = {}
    for r in results:
        meta = json.loads(r.meta_path.read_text())
        loaded[r.name] = LoadedKernel(meta, driver, ("module", r.name), "cubin")
    kernels = CompiledKernels(sm, loaded, {}, driver.name)
    w = BlockSparseWeight.from_dense(torch.ones(100, 70, dtype=torch.int8), torch.ones(100), layout="transposed")
    x = torch.randn(3, 70, dtype=torch.float16)
    driver.meta = loaded["bsr_gemv_transposed_32x32_fp16"].meta
    y = kernels.block_sparse_matmul(x, w)
    handle, grid, threads, shared, stream, values = driver.launches[-1]
    assert handle == ("module", "bsr_gemv_transposed_32x32_fp16")
    assert grid == (4, 3, 1)  # (cdiv(100, 32), cdiv(3, BLOCK_M=1), SPLIT): 3 blocks a row are too few to split
    assert threads == 32 * tuning_for(sm).gemv_num_warps
    assert shared == driver.meta["shared_memory_bytes"]
    assert driver.meta["constexprs"]["ATOMIC"]
    assert dict(driver.meta["params"])["out_ptr"] == "*fp32"  # split-K adds into float32, returned as fp16
    assert y.dtype == torch.float16
    pointers = [x.data_ptr(), w.values.data_ptr(), w.col_index.data_ptr(), w.row_offsets.data_ptr(),
                w.scales.data_ptr()]
    assert values[:5] == pointers
    assert values[6:] == [3, 100, 70, 70, 1, 100, 1, None, None]  # None: null scratch pointers
    wide = BlockSparseWeight.from_dense(torch.ones(64, 2048, dtype=torch.int8), torch.ones(64))  # 64 blocks a row
    kernels.block_sparse_matmul(torch.randn(1, 2048, dtype=torch.float16), wide)
    # 2 block rows want 24-32 programs per row for 8 per SM; each share keeps >= 2 steps of 4 blocks: 64 // 8 = 8
    assert driver.launches[-1][1] == (2, 1, 8)
    q, cache = torch.randn(2, 9, 64), torch.randn(2, 3, 10, 64)
    driver.meta = loaded["gqa_decode_d64_g4_fp16"].meta
    kernels.gqa_decode_attention(q, cache, cache, torch.tensor([10, 4]), 0.125)
    _, grid, *_, values = driver.launches[-1]
    assert grid == (2, 3, 1)
    assert values[5:8] == [pytest.approx(0.125), 3, 64]  # scale, GROUP, D


def _profile(block: int = 32):
    from types import SimpleNamespace

    return SimpleNamespace(name="custom-orin", gpu=SimpleNamespace(sm=87), sparsity_block=block)


def _record(block: int = 32, head_dim: int = 64, layers=((9, 3),), layout: str = "plain") -> dict:
    return {"block": block, "layout": layout, "head_dim": head_dim,
            "layers": [{"heads": h, "kv_heads": kv, "ffn": 64} for h, kv in layers]}


def test_build_compiles_the_variants_the_model_needs(tmp_path):
    """The build compiled 32x32 blocks, head_dim 64 and groups 1/4/8 whatever the profile and model were; a model
    with 64x64 blocks, head_dim 128 or 12 query heads per KV head then failed at its first token on the board.
    (Small values here, to keep the compile short: head_dim 24 -> BLOCK_D 32, groups 3 and 2 -> BLOCK_G 4, 2.)"""
    from edgesdk.build.sparse_step import compile_kernels
    from edgesdk.kernels.loader import CompiledKernels, LoadedKernel

    record = _record(block=64, head_dim=24, layers=((9, 3), (4, 2)), layout="transposed")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton_cache"))
        result = compile_kernels(_profile(64), tmp_path / "kernels", record)
    assert result["failed"] == {}
    assert sorted(result["kernels"]) == ["bsr_gemm_transposed_64x64_fp16", "bsr_gemv_transposed_64x64_fp16",
                                         "gqa_decode_d32_g2_fp16", "gqa_decode_d32_g4_fp16"]
    loaded = {}
    for name in result["kernels"]:
        meta = json.loads((tmp_path / "kernels" / "sm_87" / f"{name}.json").read_text())
        loaded[name] = LoadedKernel(meta, RecordingDriver(), ("module", name), "cubin")
    kernels = CompiledKernels(87, loaded, {}, "recording")
    assert kernels.missing((64, 64), "transposed", 24, [3, 2]) == []  # what the loader checks at open


def test_blocks_under_16_compile_their_gemm_without_tl_dot(tmp_path):
    """A profile may set sparsity_block 8 (a power of two); the GEMM variant used tl.dot, which refuses tiles under
    16, so the build stopped at 'did not compile' after the whole export. It now runs as a broadcast multiply;
    the loader still finds it for >= 16 rows (told by BLOCK_M), and the emulated kernel matches its twin."""
    torch = pytest.importorskip("torch")
    from edgesdk.build.sparse_step import compile_kernels
    from edgesdk.kernels.block_sparse import BlockSparseWeight
    from edgesdk.kernels.loader import CompiledKernels, LoadedKernel
    from edgesdk.kernels.reference import block_sparse_matmul_reference
    from edgesdk.kernels.triton_kernels import block_sparse_matmul_triton, bsr_launch_params

    record = _record(block=8, head_dim=16, layers=((2, 2),))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton_cache"))
        result = compile_kernels(_profile(8), tmp_path / "kernels", record)
    assert result["failed"] == {}
    driver = RecordingDriver()
    loaded = {}
    for name in result["kernels"]:
        meta = json.loads((tmp_path / "kernels" / "sm_87" / f"{name}.json").read_text())
        loaded[name] = LoadedKernel(meta, driver, ("module", name), "cubin")
    kernels = CompiledKernels(87, loaded, {}, driver.name)
    assert kernels.missing((8, 8), "plain", 16, [1]) == []
    gen = torch.Generator().manual_seed(0)
    w = BlockSparseWeight.from_dense(torch.randint(-127, 128, (20, 12), generator=gen, dtype=torch.int8),
                                     torch.rand(20, generator=gen), block=(8, 8))
    x = torch.randn(20, 12, generator=gen)
    driver.meta = loaded["bsr_gemm_plain_8x8_fp16"].meta
    kernels.block_sparse_matmul(x, w)
    assert driver.launches[-1][0] == ("module", "bsr_gemm_plain_8x8_fp16")
    tuning = tuning_for(87)
    assert bsr_launch_params(20, tuning, (8, 8))[1] is False
    assert bsr_launch_params(20, tuning, (32, 32))[1]
    out = block_sparse_matmul_triton(x, w, emulated=True, tuning=tuning)
    torch.testing.assert_close(out, block_sparse_matmul_reference(x, w), rtol=1e-4, atol=1e-4)


def test_build_stops_when_a_needed_kernel_does_not_compile(tmp_path, monkeypatch):
    from edgesdk.build import sparse_step
    from edgesdk.errors import BuildError
    from edgesdk.kernels import aot

    def refuse(variant, sm):
        raise RuntimeError(f"ptxas refused {variant.name}")

    monkeypatch.setattr(aot, "compile_variant", refuse)
    with pytest.raises(BuildError, match=r"3 of the 3 GPU kernels .* did not compile for sm_87.*ptxas refused"):
        sparse_step.compile_kernels(_profile(), tmp_path, _record())
