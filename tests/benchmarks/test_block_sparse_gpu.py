"""Block-sparse INT8 GEMV at batch 1 on the GPU: 50 % density vs the same kernel at 100 % (dense INT8) vs torch
fp16 matmul, both intra-block layouts, SmolLM2 layer shapes. Prints time, bytes read, achieved GB/s and speedups.

    python -m pytest tests/benchmarks/test_block_sparse_gpu.py -m benchmark -s

Timing: CUDA events around ITERS back-to-back launches after WARMUP (mean per call, launch overhead included,
as in decode). Bytes read: the stored weight (values + col_index + row_offsets + scales; fp16 weight for torch)
plus activations and output; GB/s = bytes / time.
"""

from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.benchmark,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: torch.cuda.is_available() is False"),
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (pip install edgesdk[kernels])"),
]

SHAPES = ((576, 576), (1536, 576), (576, 1536))  # (N out, K in): SmolLM2-135M o/q, gate|up halves, down
WARMUP, ITERS = 20, 500


def time_ms(fn) -> float:
    for _ in range(WARMUP):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(ITERS):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / ITERS


def test_block_sparse_gemv_vs_dense_int8_vs_fp16():
    from edgesdk.kernels.block_sparse import BlockSparseWeight
    from edgesdk.kernels.ops import block_sparse_matmul
    from edgesdk.kernels.reference import block_sparse_matmul_reference

    gen = torch.Generator().manual_seed(0)
    rows = []
    for n, k in SHAPES:
        codes = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
        scales = torch.rand(n, generator=gen) * 0.02
        mask = torch.rand(-(-n // 32), -(-k // 32), generator=gen) < 0.5
        x = torch.randn(1, k, generator=gen).half().cuda()
        act_bytes = (k + n) * 2
        w16 = (codes.float() * scales[:, None]).half().cuda()
        t16 = time_ms(lambda w16=w16, x=x: x @ w16.T)
        rows.append((n, k, "torch fp16", "-", t16, n * k * 2 + act_bytes))
        for layout in ("plain", "transposed"):
            for label, block_mask in (("bsr 50%", mask), ("int8 100%", torch.ones_like(mask))):
                w = BlockSparseWeight.from_dense(codes, scales, mask=block_mask, layout=layout).to("cuda")
                out = block_sparse_matmul(x, w, mode="triton")
                ref = block_sparse_matmul_reference(x.float(), w)
                assert (out.float() - ref).abs().max().item() <= 2e-3 * max(1.0, ref.abs().max().item())
                t = time_ms(lambda w=w, x=x: block_sparse_matmul(x, w, mode="triton"))
                rows.append((n, k, label, layout, t, w.nbytes + act_bytes))
    print(f"\n{torch.cuda.get_device_name()} (batch 1, fp16 activations)")
    print(f"{'N x K':>11} {'kernel':>11} {'layout':>10} {'us':>8} {'bytes':>9} {'GB/s':>7} "
          f"{'vs int8':>8} {'vs fp16':>8}")
    for n, k, label, layout, t, nbytes in rows:
        dense = next(r[4] for r in rows if r[:3] == (n, k, "int8 100%") and r[3] == layout) if layout != "-" else t
        fp16 = next(r[4] for r in rows if r[:3] == (n, k, "torch fp16"))
        print(f"{n:>5} x{k:>5} {label:>11} {layout:>10} {t * 1e3:>8.2f} {nbytes:>9} {nbytes / t / 1e6:>7.1f} "
              f"{dense / t:>7.2f}x {fp16 / t:>7.2f}x")
