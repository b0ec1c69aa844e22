"""c_t: the KV-cache access cost of token t, measured once and stored per position bucket (seed 000 §3.1).

The seed times the KV-cache update of every token with CUDA events and warns (§5.2, pit one)
that inference must not lose c_t when the profiler is off: it stores the cost's statistics and
uses them instead. On a CPU there are no per-kernel events, so the profiler is a timer around
whole decode steps of the model's own fused ONNX Runtime graph (the graph the board runs): a
step at cache length P reads the P cached keys and values of every layer, so the step time minus
the step time at the shortest length is the KV-access cost at P. Timings per bucket (median and
spread of ``repeats`` steps) are kept as measured, and a least-squares line through them (the cost
is linear in the bytes read) gives the per-bucket table the graph and the trainer read; the line
also extends the table beyond the longest length measured.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class CostStats:
    """Per-bucket KV-access cost in milliseconds."""

    bucket_size: int  # positions per bucket
    table_ms: list[float]  # fitted cost per bucket, the whole context (what inference uses)
    measured: dict  # bucket -> {"median_ms", "std_ms", "steps"}: the raw timings
    slope_ms_per_token: float
    intercept_ms: float

    def cost(self, positions: np.ndarray) -> np.ndarray:
        table = np.asarray(self.table_ms, np.float32)
        return table[np.minimum(np.asarray(positions) // self.bucket_size, len(table) - 1)]

    def to_json(self) -> dict:
        return {"bucket_size": self.bucket_size, "table_ms": [round(v, 5) for v in self.table_ms],
                "measured": self.measured, "slope_ms_per_token": self.slope_ms_per_token,
                "intercept_ms": self.intercept_ms}

    @classmethod
    def from_json(cls, data: dict) -> CostStats:
        return cls(int(data["bucket_size"]), [float(v) for v in data["table_ms"]], dict(data["measured"]),
                   float(data["slope_ms_per_token"]), float(data["intercept_ms"]))


def fit_table(bucket_size: int, buckets: list[int], step_ms: list[float], n_buckets: int) -> tuple[list[float], float,
                                                                                                    float]:
    """Least-squares line through (bucket centre, step ms), minus the shortest step: cost >= 0 per bucket.

    Returns the table, the line's slope (ms per token) and its intercept (ms at cache length 0). Where the line is
    flat (one bucket, or a negative slope, which is timer noise: more cache never reads fewer bytes) the flat
    least-squares line is the mean step time, so that is its intercept.
    """
    centres = np.asarray(buckets, np.float64) * bucket_size + bucket_size / 2
    times = np.asarray(step_ms, np.float64)
    slope, intercept = np.polyfit(centres, times, 1) if len(buckets) > 1 else (0.0, times.mean())
    if slope < 0:
        slope, intercept = 0.0, times.mean()
    slope = float(slope)
    all_centres = np.arange(n_buckets) * bucket_size + bucket_size / 2
    table = slope * (all_centres - all_centres[0])
    return [float(v) for v in table], slope, float(intercept)


REPEATS = 6  # decode steps timed per cache length


def buckets_timeable(max_context: int, bucket_size: int, measure_up_to: int, repeats: int = REPEATS) -> int:
    """How many buckets the profiler can time a cache length in: those that lie wholly below ``measure_up_to``
    and whose middle, and ``repeats`` steps after it, lie below the model's context. The cost line needs two.

    The context is counted by the middle, where :func:`measure_kv_cost` times: a context of 128 holds buckets 0 and
    1 of 64 positions (steps at 32-38 and 96-102), not only bucket 0 as a count of whole buckets read it."""
    last = max_context - repeats - 1  # the last cache length a timed middle may start at
    middle = bucket_size // 2
    in_context = (last - middle) // bucket_size + 1 if last >= middle else 0
    return min(measure_up_to // bucket_size, in_context)


def measure_kv_cost(model, max_context: int, bucket_size: int = 64, measure_up_to: int = 1024, buckets: int = 8,
                    repeats: int = REPEATS, threads: int = 1) -> CostStats:
    """Time decode steps of ``model``'s fused float32 graph at ``buckets`` cache lengths up to ``measure_up_to``."""
    from edgesdk.export.onnx_export import ExportConfig, export_model
    from edgesdk.runtime.ort_fused_backend import OrtFusedBackend

    n_buckets = max(1, -(-max_context // bucket_size))
    top = max(1, buckets_timeable(max_context, bucket_size, measure_up_to, repeats))
    chosen = sorted({int(b) for b in np.linspace(0, top - 1, num=min(buckets, top))})
    rng = np.random.default_rng(0)
    measured: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        spec = export_model(model, Path(tmp), ExportConfig(form="ort-fused", weights="fp32",
                                                           max_context=min(max_context, measure_up_to + 64)))
        backend = OrtFusedBackend(Path(tmp) / "model.onnx", spec.to_json(), threads=threads, spinning=False)
        vocab = spec.vocab_size
        for bucket in chosen:
            length = max(1, bucket * bucket_size + bucket_size // 2)
            backend.reset()
            backend.prefill(rng.integers(0, vocab, length))
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                backend.decode(int(rng.integers(0, vocab)))
                times.append((time.perf_counter() - start) * 1e3)
            times = times[1:] if len(times) > 2 else times  # first step after a prefill warms caches
            measured[str(bucket)] = {"median_ms": round(float(np.median(times)), 4),
                                     "std_ms": round(float(np.std(times)), 4), "steps": len(times)}
        del backend
    keys = sorted(measured, key=int)
    table, slope, intercept = fit_table(bucket_size, [int(k) for k in keys],
                                        [measured[k]["median_ms"] for k in keys], n_buckets)
    return CostStats(bucket_size, table, measured, slope, intercept)
