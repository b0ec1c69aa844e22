"""Where a decode step's time goes, per op type, in a bundle's graph (ONNX Runtime profiler).

Prints ops per step, kernel time by op type, the GEMM share (MatMulNBits / MatMul / Gemm), the
framework overhead inside ``run`` (step time minus kernel time) and the Python-side overhead
(wall time minus ``run``). Bundle: ``$EDGESDK_BENCH_BUNDLE`` or the benchmark fixture's build.

The profiler itself adds several microseconds to every node it times, so two measurements without
it bound the step from below: ONNX Runtime's cost per node (a chain of trivial nodes, timed
plainly) and the time to stream the bundle's weights once at this host's memory read rate.

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


def timed_decode_steps(backend, vocab_size: int) -> list[float]:
    """Seconds of each of STEPS greedy decode steps after a random PROMPT-token prompt."""
    prompt = np.random.default_rng(0).integers(100, vocab_size, PROMPT)
    backend.reset()
    token = int(backend.prefill(prompt)[-1].argmax())
    seconds = []
    for _ in range(STEPS):
        start = time.perf_counter()
        token = int(backend.decode(token).argmax())
        seconds.append(time.perf_counter() - start)
    return seconds


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
    walls = timed_decode_steps(backend, bundle.manifest["graph"]["vocab_size"])
    trace = json.loads(Path(backend.session.end_profiling()).read_text())
    runs = [e["dur"] for e in trace if e.get("cat") == "Session" and e.get("name") == "model_run"]
    decode_runs = runs[-STEPS:]
    # Node events of the decode steps: those after the prefill's model_run ended.
    run_events = [e for e in trace if e.get("cat") == "Session" and e.get("name") == "model_run"]
    first_decode = run_events[-STEPS]["ts"]
    by_op: dict[str, list[float]] = defaultdict(list)
    for event in trace:
        if event.get("cat") == "Node" and event["ts"] >= first_decode and event["name"].endswith("_kernel_time"):
            op = event["args"]["op_name"]
            if op in GEMM_OPS:  # split by output width: the LM head apart from the layers
                widths = [shape[-1] for kind in event["args"].get("output_type_shape", []) for shape in kind.values()]
                op += f" (N={widths[0]})" if widths else ""
            by_op[op].append(event["dur"])
    kernel_us = sum(sum(v) for v in by_op.values()) / STEPS
    run_us = float(np.mean(decode_runs))
    wall_us = float(np.median(walls)) * 1e6
    gemm_us = sum(sum(v) for op, v in by_op.items() if op.split(" ")[0] in GEMM_OPS) / STEPS
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
          f"({result['gemm_us'] / result['run_us']:.0%} of run); framework overhead with the profiler on "
          f"{result['framework_overhead_us']:.0f} us ({result['framework_overhead_us'] / result['ops_per_step']:.1f} "
          f"us/op); Python {result['python_overhead_us']:.0f} us")
    print(f"  {'op':<34}{'per step':>9}{'us/step':>10}{'share':>8}")
    for op, (count, us) in result["by_op"].items():
        print(f"  {op:<34}{count:>9.1f}{us:>10.0f}{us / result['run_us']:>8.0%}")
    assert result["ops_per_step"] > 0
    assert result["kernel_us"] > 0


def _median_run_seconds(session, feeds: dict, repeats: int = 200) -> float:
    for _ in range(20):
        session.run(None, feeds)
    rounds = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(repeats):
            session.run(None, feeds)
        rounds.append((time.perf_counter() - start) / repeats)
    return float(np.median(rounds))


def test_framework_cost_per_node_without_the_profiler():
    """A chain of 301 elementwise Mul nodes on one hidden state (576 floats) against one node."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from edgesdk.runtime.ort_backend import make_session_options

    def chain(length: int):
        nodes = [helper.make_node("Mul", ["x" if i == 0 else f"y{i - 1}", "c"], [f"y{i}"]) for i in range(length)]
        graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 576])],
                                  [helper.make_tensor_value_info(f"y{length - 1}", TensorProto.FLOAT, [1, 1, 576])],
                                  [numpy_helper.from_array(np.ones((1, 1, 576), np.float32), "c")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        options = make_session_options(THREADS)
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every node
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    feeds = {"x": np.ones((1, 1, 576), np.float32)}
    one, many = _median_run_seconds(chain(1), feeds), _median_run_seconds(chain(301), feeds)
    per_node_us = (many - one) / 300 * 1e6
    print(f"\nONNX Runtime per node ({THREADS} threads, no profiler): {per_node_us:.2f} us; "
          f"a run of one node: {one * 1e6:.1f} us")
    assert per_node_us > 0


def test_weight_bytes_against_the_memory_read_floor(smollm2_rpi5_bundle):
    """A decode step against the time to read the bundle's weights once at this host's read rate
    (a float32 sum over 256 MB on the same number of threads)."""
    torch = pytest.importorskip("torch")
    from edgesdk.bundle import verify_bundle
    from edgesdk.runtime.session import open_runtime

    bundle = verify_bundle(smollm2_rpi5_bundle.path)
    weights = bundle.manifest["graph"].get("weights") or {}
    weight_bytes = int(weights.get("bytes") or (bundle.path / "model.onnx.data").stat().st_size)
    torch.set_num_threads(THREADS)
    table = torch.ones(64 * 1024 * 1024)  # 256 MB, far beyond the caches
    reads = []
    for _ in range(5):
        start = time.perf_counter()
        table.sum()
        reads.append(table.numel() * 4 / (time.perf_counter() - start))
    read_rate = float(np.median(reads))
    backend = open_runtime(bundle.path, threads=THREADS).backend
    step = float(np.median(timed_decode_steps(backend, bundle.manifest["graph"]["vocab_size"])))
    floor = weight_bytes / read_rate
    print(f"\nweights {weight_bytes / 1e6:.1f} MB at {read_rate / 1e9:.1f} GB/s = {floor * 1e3:.2f} ms; "
          f"decode step {step * 1e3:.2f} ms ({floor / step:.0%} of it is the byte floor)")
    assert step > 0
    assert floor > 0


# SmolLM2-135M's MatMulNBits shapes (K, N) per decode step: 30 layers' QKV, O, gate|up, down, then the head.
LAYER_SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate|up": (576, 3072), "down": (1536, 576)}
HEAD_SHAPE = (576, 49152)
STREAMED_BYTES = 96 * 1024 * 1024  # weights per timed run: three times the host's 32 MB L3


def _matmul_nbits_session(k: int, n: int, bits: int, block: int, copies: int):
    """``copies`` MatMulNBits nodes of one shape on one input, each with its own random weights,
    accuracy level 4 as in the fused graph."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from edgesdk.runtime.ort_backend import make_session_options

    rng = np.random.default_rng(0)
    blocks = -(-k // block)
    nodes, weights = [], []
    for c in range(copies):
        nodes.append(helper.make_node("MatMulNBits", ["x", f"w{c}", f"s{c}"], [f"y{c}"], domain="com.microsoft", K=k,
                                      N=n, bits=bits, block_size=block, accuracy_level=4))
        weights += [numpy_helper.from_array(rng.integers(0, 256, (n, blocks, block * bits // 8), dtype=np.uint8),
                                            f"w{c}"),
                    numpy_helper.from_array((rng.random(n * blocks, dtype=np.float32) + 0.5) * 0.01, f"s{c}")]
    graph = helper.make_graph(nodes, "matmuls", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, k])],
                              [helper.make_tensor_value_info(f"y{c}", TensorProto.FLOAT, [1, 1, n])
                               for c in range(copies)], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    return ort.InferenceSession(model.SerializeToString(), make_session_options(THREADS),
                                providers=["CPUExecutionProvider"])


def test_matmul_nbits_time_by_block_size():
    """MatMulNBits at batch 1 on SmolLM2's shapes, blocks of 32 against 64, each shape repeated
    over more weights than the 32 MB L3 holds (so they stream from memory, as in a decode step).
    On x86 the int4 kernel (int8 activations per block) is compute-bound: fewer, longer blocks run
    faster (the default recipe's block 64). Median of 7 rounds."""
    x = {k: {"x": np.random.default_rng(1).standard_normal((1, 1, k)).astype(np.float32)} for k in (576, 1536)}
    print(f"\nMatMulNBits, {THREADS} threads, us per call, weights streamed from memory")
    print(f"  {'shape':<10}{'bits':>5}{'copies':>7}{'block 32':>10}{'block 64':>10}{'32 / 64':>9}{'GB/s at 64':>12}")
    ratios = []
    for name, (k, n), bits in [*((name, shape, 4) for name, shape in LAYER_SHAPES.items()), ("head", HEAD_SHAPE, 8)]:
        copies = -(-STREAMED_BYTES // (k * n * bits // 8))
        times = {block: _median_run_seconds(_matmul_nbits_session(k, n, bits, block, copies), x[k], repeats=10)
                 / copies for block in (32, 64)}
        ratios.append(times[32] / times[64])
        rate = k * n * bits / 8 / times[64] / 1e9
        print(f"  {name:<10}{bits:>5}{copies:>7}{times[32] * 1e6:>10.1f}{times[64] * 1e6:>10.1f}{ratios[-1]:>9.2f}"
              f"{rate:>12.1f}")
    assert all(r > 0 for r in ratios)
