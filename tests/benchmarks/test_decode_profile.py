"""Where a decode step's time goes, per op type, in a bundle's graph (ONNX Runtime profiler).

Prints ops per step, kernel time by op type, the GEMM share (MatMulNBits / MatMul / Gemm), the
framework overhead inside ``run`` (step time minus kernel time) and the Python-side overhead
(wall time minus ``run``). Bundle: ``$EDGESDK_BENCH_BUNDLE`` or the benchmark fixture's build.

    python -m pytest tests/benchmarks/test_decode_profile.py -m benchmark -s
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.benchmark

THREADS, PROMPT, STEPS = 2, 128, 64
GEMM_OPS = {"MatMulNBits", "MatMul", "Gemm", "FusedMatMul", "MatMulInteger", "DynamicQuantizeMatMul"}


def profile_decode(bundle_dir: Path, workdir: Path) -> dict:
    from edgesdk.bundle import verify_bundle
    from edgesdk.runtime.ort_backend import make_session_options
    from edgesdk.runtime.session import open_runtime
    from edgesdk.weights_file import open_session

    bundle = verify_bundle(bundle_dir)
    runtime = open_runtime(bundle.path, threads=THREADS)
    backend = runtime.backend
    options = make_session_options(THREADS)
    options.enable_profiling = True
    options.profile_file_prefix = str(workdir / "decode")
    graph = bundle.manifest["graph"]
    backend.session = open_session(bundle.path / graph["file"], options, ["CPUExecutionProvider"],
                                   graph.get("weights"))
    prompt = np.random.default_rng(0).integers(100, bundle.manifest["graph"]["vocab_size"], PROMPT)
    backend.reset()
    token = int(backend.prefill(prompt)[-1].argmax())
    walls = []
    for _ in range(STEPS):
        start = time.perf_counter()
        token = int(backend.decode(token).argmax())
        walls.append(time.perf_counter() - start)
    trace = json.loads(Path(backend.session.end_profiling()).read_text())
    runs = [e["dur"] for e in trace if e.get("cat") == "Session" and e.get("name") == "model_run"]
    decode_runs = runs[-STEPS:]
    # Node events of the decode steps: those after the prefill's model_run ended.
    run_events = [e for e in trace if e.get("cat") == "Session" and e.get("name") == "model_run"]
    first_decode = run_events[-STEPS]["ts"]
    by_op: dict[str, list[float]] = defaultdict(list)
    for event in trace:
        if event.get("cat") == "Node" and event["ts"] >= first_decode and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]].append(event["dur"])
    kernel_us = sum(sum(v) for v in by_op.values()) / STEPS
    run_us = float(np.mean(decode_runs))
    wall_us = float(np.median(walls)) * 1e6
    gemm_us = sum(sum(v) for op, v in by_op.items() if op in GEMM_OPS) / STEPS
    return {
        "ops_per_step": sum(len(v) for v in by_op.values()) / STEPS,
        "wall_us": wall_us, "run_us": run_us, "kernel_us": kernel_us, "gemm_us": gemm_us,
        "framework_overhead_us": run_us - kernel_us, "python_overhead_us": wall_us - run_us,
        "by_op": {op: (len(v) / STEPS, sum(v) / STEPS) for op, v in sorted(by_op.items(), key=lambda kv: -sum(kv[1]))},
    }


def test_decode_step_profile(smollm2_rpi5_bundle, tmp_path):
    result = profile_decode(smollm2_rpi5_bundle.path, tmp_path)
    print(f"\ndecode step ({THREADS} threads): {result['wall_us']:.0f} us wall, {result['run_us']:.0f} us in run, "
          f"{result['ops_per_step']:.0f} ops")
    print(f"  kernels {result['kernel_us']:.0f} us, of which GEMM {result['gemm_us']:.0f} us "
          f"({result['gemm_us'] / result['run_us']:.0%} of run); framework overhead "
          f"{result['framework_overhead_us']:.0f} us ({result['framework_overhead_us'] / result['ops_per_step']:.1f} "
          f"us/op); Python {result['python_overhead_us']:.0f} us")
    print(f"  {'op':<34}{'per step':>9}{'us/step':>10}{'share':>8}")
    for op, (count, us) in result["by_op"].items():
        print(f"  {op:<34}{count:>9.1f}{us:>10.0f}{us / result['run_us']:>8.0%}")
    assert result["ops_per_step"] > 0
    assert result["kernel_us"] > 0
