"""Decode steps on one reused IO binding against a fresh binding per step (fused ONNX Runtime form).

Two runtimes of the same bundle in one process, stepped in alternating 32-token chunks (the
order rotated each round, a pause between so the idle thread pool parks): this host's speed
drifts by ±15 % over minutes, which chunk-level alternation cancels. Bundle:
``$EDGESDK_BENCH_BUNDLE`` or the benchmark fixture's build.

    python -m pytest tests/benchmarks/test_decode_binding.py -m benchmark -s
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest

pytestmark = pytest.mark.benchmark

THREADS, PROMPT, CHUNK, ROUNDS = 2, 128, 32, 40


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
            start = time.perf_counter()
            for _ in range(CHUNK):
                if name in fresh:
                    backend._decode_step = None
                token = int(backend.decode(token).argmax())
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
