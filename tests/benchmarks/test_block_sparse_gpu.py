"""Block-sparse INT8 GEMV at batch 1 on a GPU: block densities 1.0 (the dense INT8 GEMV) to 0.25 in the same
kernel, both intra-block layouts, a sweep of launch settings, and torch fp16 (cuBLAS) as the vendor baseline.

    python -m pytest tests/benchmarks/test_block_sparse_gpu.py -m benchmark -s

Shapes: SmolLM2-135M's four fused decode linears (Q|K|V, O, gate|up, down) and four larger ones (Llama-3.2-1B
and 8B-sized) where one launch moves enough bytes to be bandwidth-bound on a large GPU. Launch settings swept:
warps, blocks per loop step (``gemv_unroll``) and split-K (``gemv_programs_per_sm``, 0 = none); the table
shows each density's best, its splits, and the best time of the one-block-a-step kernel without split-K.

Timing (see the method notes in the docstring of :func:`graph_time_us`): each measured call reads a different
copy of the weight, with enough copies that they do not fit in L2 (a decode step reads every layer's weights
once), and the calls are replayed from one CUDA graph so that Python's launch cost is not what is measured.
Bytes: the stored weight (values + col_index + row_offsets + scales; the fp16 matrix for torch) plus the
activation and output vectors; GB/s = bytes / time, beside the device-to-device copy rate measured in the
same run. The speedup asked of block sparsity is the 50 %-dense kernel against the 100 %-dense one, each at
its best launch setting, same shape, same layout.

``EDGESDK_BENCH_OUT=DIR`` also writes every measurement to ``DIR/gemv.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from edgesdk.kernels.layouts import LAYOUTS  # noqa: E402
from tests._utils.gpu import gpu_benchmark_marks  # noqa: E402

pytestmark = gpu_benchmark_marks(torch)

SMOLLM2 = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # (N out, K in): fused qkv, o, gate|up, down
LARGE = ((2048, 8192), (4096, 4096), (14336, 4096), (8192, 8192))
DENSITIES = (1.0, 0.5, 0.25)
# (gemv_num_warps, gemv_unroll, gemv_programs_per_sm): unroll 1 / per_sm 0 is one block a step and no split-K
SWEEP = tuple((warps, unroll, per_sm) for warps in (4, 8) for unroll in (1, 2, 4, 8) for per_sm in (0, 4, 16))
MIN_CALLS = 64  # launches per graph replay
REPLAYS = 7
COLD_BYTES_FACTOR = 3  # the copies of a weight together hold >= 3x the L2 size


def graph_time_us(launch, copies: int) -> float:
    """Median microseconds per call of ``launch(i)`` (i = copy index), replayed from one CUDA graph.

    Warm-up on a side stream first (compiles the kernel, fills the allocator's pool), then one graph of
    ``max(copies, MIN_CALLS)`` calls cycling through the copies is captured and replayed ``REPLAYS`` times
    between CUDA events; the median replay over the calls is reported.
    """
    calls = max(copies, MIN_CALLS)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(min(copies, 3)):
            launch(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            launch(i % copies)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy of 1 GiB: bytes read + written per second (the achievable ceiling)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = graph_time_us(lambda _i: dst.copy_(src), 1)
    return 2 * src.numel() / us / 1e3


def l2_bytes() -> int:
    return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20))


def copies_for(nbytes: int) -> int:
    return max(1, min(512, -(-COLD_BYTES_FACTOR * l2_bytes() // max(nbytes, 1))))


def clone_weight(weight):
    return dataclasses.replace(weight, values=weight.values.clone(), col_index=weight.col_index.clone(),
                               row_offsets=weight.row_offsets.clone(), scales=weight.scales.clone())


def measure_shape(n: int, k: int, tuning, gen, densities=DENSITIES, layouts=LAYOUTS, sweep=SWEEP,
                  act_dtype=torch.float16) -> list[dict]:
    """Every density x layout x launch setting for one shape, plus torch fp16; correctness checked first.
    ``act_dtype``: the activation (and output) dtype of the BSR kernel; the decoder runs float32."""
    from edgesdk.kernels.block_sparse import BlockSparseWeight
    from edgesdk.kernels.reference import block_sparse_matmul_reference
    from edgesdk.kernels.triton_kernels import block_sparse_matmul_triton
    from edgesdk.kernels.tuning import gemv_splits

    codes = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    scales = torch.rand(n, generator=gen) * 0.02 + 1e-3
    vectors = (k + n) * 2  # fp16 x and out
    act_bytes = (k + n) * torch.finfo(act_dtype).bits // 8
    rows = []
    w16 = (codes.float() * scales[:, None]).half().cuda()
    copies16 = [w16] + [w16.clone() for _ in range(copies_for(w16.numel() * 2) - 1)]
    x = torch.randn(1, k, generator=gen).half().cuda()
    us = graph_time_us(lambda i: torch.nn.functional.linear(x, copies16[i]), len(copies16))
    rows.append({"n": n, "k": k, "kernel": "torch fp16", "layout": "-", "density": 1.0, "us": us,
                 "bytes": n * k * 2 + vectors})
    nbr, nbc = -(-n // 32), -(-k // 32)
    for density in densities:
        mask = torch.rand(nbr, nbc, generator=gen) < density if density < 1.0 else torch.ones(nbr, nbc, dtype=bool)
        for layout in layouts:
            weight = BlockSparseWeight.from_dense(codes, scales, mask=mask, layout=layout).to("cuda")
            xs = torch.randn(1, k, generator=gen).to(act_dtype).cuda()
            reference = block_sparse_matmul_reference(xs.float(), weight)
            weights = [weight] + [clone_weight(weight) for _ in range(copies_for(weight.nbytes) - 1)]
            for warps, unroll, per_sm in sweep:
                setting = dataclasses.replace(tuning, gemv_num_warps=warps, gemv_unroll=unroll,
                                              gemv_programs_per_sm=per_sm)
                row = {"n": n, "k": k, "kernel": "bsr int8", "layout": layout, "density": round(weight.density, 4),
                       "warps": warps, "unroll": unroll, "per_sm": per_sm,
                       "splits": gemv_splits(weight.block_rows, weight.nnz_blocks, setting),
                       "act": str(act_dtype).removeprefix("torch."), "bytes": weight.nbytes + act_bytes}
                try:
                    out = block_sparse_matmul_triton(xs, weight, tuning=setting)
                    error = (out.float() - reference).abs().max().item()
                    row["max_abs_diff"] = error
                    if not error <= 2e-3 * max(1.0, reference.abs().max().item()):
                        raise AssertionError(f"wrong result: max abs diff {error}")
                    row["us"] = graph_time_us(
                        lambda i, s=setting, x=xs, ws=weights: block_sparse_matmul_triton(x, ws[i], tuning=s),
                        len(weights))
                except Exception as exc:  # noqa: BLE001 - one setting failing must not hide the others
                    row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                rows.append(row)
    torch.cuda.empty_cache()
    return rows


def best(rows, **match) -> dict | None:
    found = [r for r in rows if "us" in r and all(r[key] == value for key, value in match.items())]
    return min(found, key=lambda r: r["us"]) if found else None


def summarise(rows: list[dict], copy_gbs: float) -> list[str]:
    lines = [f"{'N x K':>13} {'layout':>10} {'density':>7} {'w/U/split':>10} {'us':>8} {'GB/s':>7} {'%copy':>6} "
             f"{'vs dense':>8} {'vs fp16':>8} {'1-block us':>10}"]
    for n, k in sorted({(r["n"], r["k"]) for r in rows}, key=lambda s: s[0] * s[1]):
        fp16 = best(rows, n=n, k=k, kernel="torch fp16")
        lines.append(f"{n:>6} x{k:>6} {'torch fp16':>10} {1.0:>7.2f} {'-':>10} {fp16['us']:>8.2f} "
                     f"{fp16['bytes'] / fp16['us'] / 1e3:>7.0f} {fp16['bytes'] / fp16['us'] / 1e3 / copy_gbs:>6.0%}")
        for layout in LAYOUTS:
            dense = best(rows, n=n, k=k, kernel="bsr int8", layout=layout, density=1.0)
            for density in sorted({r["density"] for r in rows if r["n"] == n and r["k"] == k
                                   and r["layout"] == layout}, reverse=True):
                r = best(rows, n=n, k=k, kernel="bsr int8", layout=layout, density=density)
                if r is None:
                    lines.append(f"{n:>6} x{k:>6} {layout:>10} {density:>7.2f} all settings failed")
                    continue
                gbs = r["bytes"] / r["us"] / 1e3
                simple = best(rows, n=n, k=k, kernel="bsr int8", layout=layout, density=density, unroll=1, per_sm=0)
                setting = f"{r['warps']}/{r['unroll']}/{r['splits']}"
                lines.append(f"{n:>6} x{k:>6} {layout:>10} {density:>7.2f} {setting:>10} "
                             f"{r['us']:>8.2f} {gbs:>7.0f} {gbs / copy_gbs:>6.0%} "
                             f"{dense['us'] / r['us'] if dense else float('nan'):>7.2f}x {fp16['us'] / r['us']:>7.2f}x "
                             f"{simple['us'] if simple else float('nan'):>10.2f}")
    return lines


def test_block_sparse_gemv_vs_dense_int8_vs_fp16():
    from edgesdk.kernels.ops import _device_tuning

    tuning = _device_tuning(torch.cuda.current_device())
    gen = torch.Generator().manual_seed(0)
    copy_gbs = copy_bandwidth_gbs()
    name = torch.cuda.get_device_name()
    out = os.environ.get("EDGESDK_BENCH_OUT")
    rows = []
    for n, k in SMOLLM2 + LARGE:
        rows += measure_shape(n, k, tuning, gen)
        if out:  # after every shape, so a run cut short keeps what it measured
            Path(out).mkdir(parents=True, exist_ok=True)
            Path(out, "gemv.json").write_text(json.dumps({"device": name, "copy_gbs": copy_gbs,
                                                          "tuning": tuning.to_dict(), "rows": rows}, indent=1))
    failures = [r for r in rows if "error" in r]
    header = (f"{name}, {torch.cuda.get_device_properties(0).multi_processor_count} SMs, L2 {l2_bytes() >> 20} MiB; "
              f"copy {copy_gbs:.0f} GB/s; default tuning {tuning}")
    print("\n" + header + "\n" + "\n".join(summarise(rows, copy_gbs)))
    print(f"{len(failures)} of {len(rows)} settings failed" + (f"; first: {failures[0]}" if failures else ""))
    assert best(rows, kernel="bsr int8") is not None, failures[:3]


# Split-K on a large GPU: more shares per block row than the main sweep tries, float32 activations as the decoder
# runs them (no cast after the atomic float32 output) beside float16.
SPLIT_SHAPES = ((576, 1536), (3072, 576)) + LARGE
SPLIT_SWEEP = tuple((warps, unroll, per_sm) for warps in (4, 8) for unroll in (2, 4) for per_sm in (8, 16, 32, 64, 128))


def test_gemv_split_k_sweep():
    from edgesdk.kernels.ops import _device_tuning

    tuning = _device_tuning(torch.cuda.current_device())
    gen = torch.Generator().manual_seed(1)
    rows = []
    for n, k in SPLIT_SHAPES:
        for act_dtype in (torch.float32, torch.float16):
            rows += measure_shape(n, k, tuning, gen, densities=(1.0, 0.5), layouts=("plain",), sweep=SPLIT_SWEEP,
                                  act_dtype=act_dtype)
    out = os.environ.get("EDGESDK_BENCH_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "gemv-split.json").write_text(json.dumps({"rows": rows}, indent=1))
    print(f"\n{'N x K':>13} {'act':>8} {'density':>7} {'w/U/per_sm':>10} {'splits':>6} {'us':>8} {'vs dense':>8}")
    for n, k in SPLIT_SHAPES:
        for act in ("float32", "float16"):
            dense = best(rows, n=n, k=k, kernel="bsr int8", act=act, density=1.0)
            for r in (dense, *[best(rows, n=n, k=k, kernel="bsr int8", act=act, density=d)
                               for d in sorted({r["density"] for r in rows if (r["n"], r["k"]) == (n, k)
                                                and r["density"] < 1.0})]):
                if r is None:
                    continue
                print(f"{n:>6} x{k:>6} {act:>8} {r['density']:>7.2f} {r['warps']:>3}/{r['unroll']}/{r['per_sm']:<4} "
                      f"{r['splits']:>6} {r['us']:>8.2f} {dense['us'] / r['us']:>7.2f}x")
    assert best(rows, kernel="bsr int8") is not None
