"""Review of ahead-of-time compilation and tuning: a variant the target's shared memory cannot hold is refused at
build time, not shipped as compiled."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from edgesdk.kernels.tuning import max_shared_per_block, tuning_for


@pytest.mark.parametrize(("sm", "kb"), [(87, 163), (80, 163), (86, 99), (89, 99), (90, 227), (72, 96), (75, 64),
                                        (53, 48)])
def test_shared_memory_per_block_follows_the_cuda_tables(sm, kb):
    """CUDA C++ Programming Guide, maximum shared memory per thread block (opt-in) for the default parts."""
    assert max_shared_per_block(tuning_for(sm)) == kb * 1024


def test_a_variant_over_the_targets_shared_memory_is_refused_not_shipped(tmp_path, monkeypatch):
    """compile_for_target recorded ``fits_shared_memory: false`` and still returned ok=True with its cubin, so the
    build shipped a kernel the board's driver refuses at load; now it is a refused variant saying why."""
    pytest.importorskip("triton")
    from edgesdk.kernels import aot

    tuning = tuning_for(87)
    limit = max_shared_per_block(tuning)
    variants = aot.default_variants(tuning, group_blocks=(1,), layouts=("plain",))

    def fake_compile(variant, sm):
        shared = limit + 1024 if variant.name.startswith("bsr_gemm") else limit
        md = SimpleNamespace(name=f"_{variant.kernel}_kernel", shared=shared, num_warps=variant.num_warps,
                             num_stages=variant.num_stages, ptx_version=None, global_scratch_size=0,
                             global_scratch_align=1, profile_scratch_size=0, profile_scratch_align=1)
        return SimpleNamespace(metadata=md, asm={"cubin": b"\x7fELF", "ptx": f".entry {md.name}("})

    monkeypatch.setattr(aot, "compile_variant", fake_compile)
    results = {r.name: r for r in aot.compile_for_target(87, tmp_path, tuning, variants=variants)}
    gemm = results["bsr_gemm_plain_32x32_fp16"]
    assert not gemm.ok
    assert f"needs {limit + 1024} bytes of shared memory per block" in gemm.error
    assert f"allows {limit}" in gemm.error
    assert not (tmp_path / "sm_87" / "bsr_gemm_plain_32x32_fp16.cubin").exists()
    assert results["bsr_gemv_plain_32x32_fp16"].ok  # exactly at the limit: fits
    index = json.loads((tmp_path / "sm_87" / "index.json").read_text())
    refused = {e["name"]: e["error"] for e in index["kernels"] if not e["ok"]}
    assert list(refused) == ["bsr_gemm_plain_32x32_fp16"]


def test_a_real_compile_for_too_little_shared_memory_is_refused(tmp_path, monkeypatch):
    """The same through Triton's compiler: a 32x32 GEMM (3 KB of shared memory on sm_87) for a part with 2 KB."""
    pytest.importorskip("triton")
    from edgesdk.kernels import aot

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    tuning = tuning_for(87, 8, 2)
    gemm = [v for v in aot.default_variants(tuning, group_blocks=(1,), layouts=("plain",)) if "gemm" in v.name]
    (result,) = aot.compile_for_target(87, tmp_path, tuning, variants=gemm)
    assert not result.ok, result
    assert "bytes of shared memory per block" in result.error
    assert "allows 1024" in result.error
