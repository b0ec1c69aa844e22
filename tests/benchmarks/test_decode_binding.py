"""Decode steps on one reused IO binding against a fresh binding per step (fused ONNX Runtime form),
and the weights on huge pages against 4 KiB pages (edgesdk/runtime/huge_pages.py).

Two runtimes of the same bundle in one process, stepped in alternating 32-token chunks (the
order rotated each round, a pause between so the idle thread pool parks): this host's speed
drifts by ±15 % over minutes, which chunk-level alternation cancels. Bundle:
``$EDGESDK_BENCH_BUNDLE`` or the benchmark fixture's build.

    python -m pytest tests/benchmarks/test_decode_binding.py -m benchmark -s
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
import pytest

pytestmark = pytest.mark.benchmark

THREADS, PROMPT, CHUNK, ROUNDS = 2, 128, 32, 40


def fresh_binding_decode(backend, token: int) -> np.ndarray:
    """One decode step of a fused-graph backend on a binding made for this step alone: every input,
    output and cache buffer bound anew, as before the backend kept one binding. Through
    ``backend.decode`` a step without a kept binding would also build the reusable one."""
    total = backend.position + 1
    backend._check_length(total)
    if total > backend._capacity:
        backend._allocate(min(backend.max_context, max(2 * backend._capacity, total)))
    outputs = backend._run_fresh(np.array([[token]], np.int64), 1, total)
    backend._position = total
    return backend._consume(outputs)[0]


def alternate_decode(backends: dict, fresh: set[str]) -> dict[str, float]:
    """Median seconds per decode step of each backend; those in ``fresh`` bind anew each step."""
    prompt = np.random.default_rng(0).integers(100, 40000, PROMPT)
    tokens = {}
    for name, backend in backends.items():
        backend.reset()
        tokens[name] = int(backend.prefill(prompt)[-1].argmax())
    steps: dict[str, list[float]] = {name: [] for name in backends}
    names = list(backends)
    for round_index in range(ROUNDS):
        for name in names[round_index % len(names):] + names[:round_index % len(names)]:
            backend, token = backends[name], tokens[name]
            if backend.position + CHUNK > 4 * PROMPT:
                backend.reset()
                token = int(backend.prefill(prompt)[-1].argmax())
            time.sleep(0.05)
            step = (lambda t, b=backend: fresh_binding_decode(b, t)) if name in fresh else backend.decode
            start = time.perf_counter()
            for _ in range(CHUNK):
                token = int(step(token).argmax())
            steps[name].append((time.perf_counter() - start) / CHUNK)
            tokens[name] = token
    return {name: statistics.median(values) for name, values in steps.items()}


def test_reused_decode_binding_against_a_fresh_one(smollm2_rpi5_bundle):
    from edgesdk.runtime.session import open_runtime

    backends = {name: open_runtime(smollm2_rpi5_bundle.path, threads=THREADS).backend
                for name in ("fresh binding per step", "reused binding")}
    medians = alternate_decode(backends, fresh={"fresh binding per step"})
    base = medians["fresh binding per step"]
    print(f"\n{'decode step':<26}{'ms':>8}{'tok/s':>8}{'speed':>8}")
    for name, seconds in medians.items():
        print(f"{name:<26}{seconds * 1e3:>8.3f}{1 / seconds:>8.1f}{base / seconds:>7.3f}x")
    assert all(seconds > 0 for seconds in medians.values())


CHILD = """
import sys, time, statistics, numpy as np
from edgesdk.runtime.huge_pages import huge_pages_in_use
from edgesdk.runtime.session import open_runtime
backend = open_runtime(sys.argv[1], threads=2).backend
prompt = np.random.default_rng(0).integers(100, 40000, 128)
backend.reset()
start = time.perf_counter()
token = int(backend.prefill(prompt)[-1].argmax())
prefill = time.perf_counter() - start
rates = []
for _ in range(4):
    backend.reset()
    token = int(backend.prefill(prompt)[-1].argmax())
    start = time.perf_counter()
    for _ in range(128):
        token = int(backend.decode(token).argmax())
    rates.append(128 / (time.perf_counter() - start))
print(statistics.median(rates), 128 / prefill, (huge_pages_in_use() or 0) >> 20)
"""


def test_huge_pages_against_small_pages(smollm2_rpi5_bundle):
    """Fresh processes, alternately with and without glibc's huge-page tunable (read at start)."""
    from edgesdk.runtime.huge_pages import TUNABLE, huge_page_environment, thp_mode

    plain = {key: value for key, value in os.environ.items() if key != "GLIBC_TUNABLES"}
    if huge_page_environment(plain, thp_mode(), platform.libc_ver()) is None:
        pytest.skip(f"huge pages cannot be used here (THP {thp_mode()}, C library {platform.libc_ver()})")
    runs: dict[str, list[tuple[float, float, int]]] = {"4 KiB pages": [], "huge pages": []}
    for _ in range(4):
        for name, environment in (("4 KiB pages", plain), ("huge pages", {**plain, "GLIBC_TUNABLES": TUNABLE})):
            out = subprocess.run([sys.executable, "-c", CHILD, str(smollm2_rpi5_bundle.path)], env=environment,
                                 capture_output=True, text=True, check=True, timeout=600).stdout.split()
            runs[name].append((float(out[0]), float(out[1]), int(out[2])))
            time.sleep(2)
    print(f"\n{'weights on':<14}{'decode tok/s':>13}{'prefill tok/s':>14}{'huge MiB':>10}   decode per run")
    base = statistics.median(r[0] for r in runs["4 KiB pages"])
    for name, values in runs.items():
        decode = statistics.median(r[0] for r in values)
        print(f"{name:<14}{decode:>13.1f}{statistics.median(r[1] for r in values):>14.1f}{values[0][2]:>10}   "
              f"{' '.join(f'{r[0]:.0f}' for r in values)}  ({decode / base:.2f}x)")
    assert runs["huge pages"][0][2] > 0
