"""The Triton kernels on a real GPU: JIT (mode ``triton``) and the AOT cubins through the board loader, against the
PyTorch twins. Not in the default test paths; run with ``python -m pytest tests/gpu -m gpu``."""

from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: torch.cuda.is_available() is False"),
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (pip install edgesdk[kernels])"),
]

from edgesdk.kernels.block_sparse import BlockSparseWeight  # noqa: E402
from edgesdk.kernels.ops import block_sparse_matmul, gqa_decode_attention  # noqa: E402
from edgesdk.kernels.reference import (  # noqa: E402
    block_sparse_matmul_reference,
    gqa_decode_attention_reference,
)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def weight(n, k, density, layout, seed=0, device="cuda"):
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    scales = torch.rand(n, generator=gen) * 0.02 + 0.001
    nbr, nbc = cdiv(n, 32), cdiv(k, 32)
    mask = (torch.rand(nbr, nbc, generator=gen) < density)
    return BlockSparseWeight.from_dense(codes, scales, mask=mask, layout=layout).to(device)


def assert_close(actual, expected, rtol, label):
    diff = (actual.float() - expected.float()).abs().max().item()
    bound = rtol * max(1.0, expected.abs().max().item())
    print(f"\n[max abs diff] {label}: {diff:.3e} (bound {bound:.1e})")
    assert diff <= bound, f"{label}: {diff} > {bound}"


def device_sm() -> int:
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


def device_tuning(sm):
    from edgesdk.kernels.tuning import tuning_for

    props = torch.cuda.get_device_properties(0)
    smem = getattr(props, "shared_memory_per_multiprocessor", 100 * 1024) // 1024
    return tuning_for(sm, props.multi_processor_count, smem)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("layout", ["plain", "transposed"])
@pytest.mark.parametrize("m", [1, 3, 17])
def test_triton_block_sparse_matches_reference(m, layout, dtype):
    w = weight(576, 1536, 0.5, layout, seed=m)
    x = torch.randn(m, 1536, device="cuda").to(dtype)
    out = block_sparse_matmul(x, w, mode="triton")
    assert out.dtype == dtype
    assert_close(out, block_sparse_matmul_reference(x.float(), w), 1e-4 if dtype == torch.float32 else 2e-3,
                 f"triton bsr M={m} {layout} {dtype}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("hq", "hkv", "d"), [(9, 3, 64), (6, 2, 32), (4, 4, 64), (3, 1, 64)])
def test_triton_gqa_decode_matches_reference(hq, hkv, d, dtype):
    t_max = 301
    q = torch.randn(3, hq, d, device="cuda", dtype=dtype)
    k = torch.randn(3, hkv, t_max, d, device="cuda", dtype=dtype)
    v = torch.randn(3, hkv, t_max, d, device="cuda", dtype=dtype)
    lengths = torch.tensor([1, t_max, 150], device="cuda")
    out = gqa_decode_attention(q, k, v, lengths, d ** -0.5, mode="triton")
    ref = gqa_decode_attention_reference(q.float(), k.float(), v.float(), lengths, d ** -0.5)
    assert_close(out, ref, 1e-4 if dtype == torch.float32 else 2e-3, f"triton gqa {hq}/{hkv} D={d} {dtype}")


def _backends():
    from edgesdk.kernels.loader import _import_cuda_python

    return ["torch"] + (["cuda-python"] if _import_cuda_python() is not None else [])


@pytest.fixture(scope="module")
def compiled_dir(tmp_path_factory):
    from edgesdk.kernels.aot import compile_for_target

    sm = device_sm()
    out = tmp_path_factory.mktemp("aot")
    results = compile_for_target(sm, out, device_tuning(sm))
    assert all(r.ok for r in results), [(r.name, r.error) for r in results if not r.ok]
    return out / f"sm_{sm}"


@pytest.mark.parametrize("backend", _backends())
def test_aot_cubins_launch_through_the_loader(compiled_dir, backend):
    from edgesdk.kernels.loader import load_compiled

    kernels = load_compiled(compiled_dir, backend=backend)
    assert len(kernels) == 7
    assert not kernels.failed
    assert all(k.source == "cubin" for k in kernels.values())
    check_loaded_kernels(kernels, 1536, (130, 7), f"aot via {backend}")


def check_loaded_kernels(kernels, n: int, lengths: tuple[int, ...], label: str) -> None:
    """Loaded BSR kernels (both layouts, M = 1 and 20, N x 576 at half density) and the GQA kernel (9/3 heads of
    64, one cache row per entry of ``lengths``) against their twins at fp16 activations."""
    for layout in ("plain", "transposed"):
        w = weight(n, 576, 0.5, layout, seed=n % 7)
        for m in (1, 20):
            x = torch.randn(m, 576, device="cuda")
            out = kernels.block_sparse_matmul(x, w)
            torch.cuda.synchronize()
            assert_close(out, block_sparse_matmul_reference(x.half().float(), w), 2e-3, f"{label} bsr M={m} {layout}")
    t_max = max(lengths)
    q = torch.randn(len(lengths), 9, 64, device="cuda")
    k = torch.randn(len(lengths), 3, t_max, 64, device="cuda")
    v = torch.randn(len(lengths), 3, t_max, 64, device="cuda")
    lengths_t = torch.tensor(lengths, device="cuda")
    out = kernels.gqa_decode_attention(q, k, v, lengths_t, 0.125)
    torch.cuda.synchronize()
    ref = gqa_decode_attention_reference(q.half().float(), k.half().float(), v.half().float(), lengths_t, 0.125)
    assert_close(out, ref, 2e-3, f"{label} gqa")


def test_sm87_bundle_kernels_run_as_ptx_on_newer_gpus(tmp_path):
    """An Orin bundle's kernels on a newer development GPU: the loader falls back to the sm_87 PTX."""
    if device_sm() <= 87:
        pytest.skip(f"this GPU is sm_{device_sm()}; the PTX fallback needs a newer one")
    from edgesdk.kernels.aot import compile_for_target
    from edgesdk.kernels.loader import load_compiled

    compile_for_target(87, tmp_path)
    kernels = load_compiled(tmp_path / "sm_87")
    assert all(k.source == "ptx" for k in kernels.values())
    w = weight(576, 576, 0.5, "plain")
    x = torch.randn(1, 576, device="cuda")
    out = kernels.block_sparse_matmul(x, w)
    torch.cuda.synchronize()
    assert_close(out, block_sparse_matmul_reference(x.half().float(), w), 2e-3, "sm_87 PTX bsr")


def test_cubins_compiled_on_a_host_launch_here():
    """Cubins compiled on a host without a GPU (``compile_for_target`` for this GPU's SM, directory named by
    ``EDGESDK_HOST_AOT_DIR``) load through the loader as cubins, not PTX, and match the twins: the build-host
    to board path with no compiler on the board."""
    import os
    from pathlib import Path

    from edgesdk.kernels.loader import load_compiled

    host_dir = os.environ.get("EDGESDK_HOST_AOT_DIR")
    if not host_dir:
        pytest.skip("EDGESDK_HOST_AOT_DIR is not set (compile on a host: kernels.aot.compile_for_target)")
    compiled = Path(host_dir) / f"sm_{device_sm()}"
    if not compiled.is_dir():
        pytest.skip(f"{compiled} holds no kernels for this GPU's SM")
    kernels = load_compiled(compiled)
    assert all(k.source == "cubin" for k in kernels.values())
    check_loaded_kernels(kernels, 3072, (70,), "host cubin")
