"""fp32 bundle (ONNX Runtime, IO-bound KV cache) vs transformers ``generate`` on the same model.

DESIGN.md's speed measure: batch 1, 2 threads, a 128-token prompt, 128 new tokens, median of 3.
Both engines run in this one process, one after the other with a pause between (two thread
pools on two cores wreck each other), so the ratio is the number to read. The bundle is the
uncompressed build (recipe fp32-fused, or ``$EDGESDK_BENCH_FP32_BUNDLE``): the same float32 weights
on both sides. Each engine generates once, untimed, before the timed runs.

    python -m pytest tests/benchmarks/test_decode_speed.py -m benchmark -s
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest

pytestmark = pytest.mark.benchmark

THREADS, PROMPT, NEW, REPEATS = 2, 128, 128, 3


def _prompt(vocab: int) -> list[int]:
    return np.random.default_rng(0).integers(100, vocab, PROMPT).tolist()


def _time_transformers(model, prompt: list[int]) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s) of greedy generate with the KV cache."""
    import torch

    ids = torch.tensor([prompt])
    with torch.no_grad():
        start = time.perf_counter()
        model(ids, use_cache=True)
        prefill_s = time.perf_counter() - start
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0)
        total_s = time.perf_counter() - start
    assert out.shape[1] == PROMPT + NEW
    return PROMPT / prefill_s, (NEW - 1) / (total_s - prefill_s)


def _time_bundle(runtime, prompt: list[int]) -> tuple[float, float]:
    from edgesdk.runtime.generate import SamplingConfig, generate

    tokens, stats = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=NEW), stop_ids=set())
    assert len(tokens) == NEW
    return stats.prefill_tok_s, stats.decode_tok_s


def test_fp32_bundle_decodes_at_least_2x_faster_than_transformers(smollm2_fp32_bundle):
    import torch
    from transformers import AutoModelForCausalLM  # noqa: F401  (loaded through edgesdk's loader)

    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model
    from edgesdk.runtime.session import open_runtime

    torch.set_num_threads(THREADS)
    model = load_model(resolve_model(smollm2_fp32_bundle.manifest["model"]["before"]["source"])).model
    runtime = open_runtime(smollm2_fp32_bundle.path, threads=THREADS)
    prompt = _prompt(runtime.backend.vocab_size)

    results = {"transformers": [], "bundle": []}
    _time_transformers(model, prompt)  # warm-up of each engine: first-call allocations, kernel set-up
    _time_bundle(runtime, prompt)
    for _ in range(REPEATS):
        results["transformers"].append(_time_transformers(model, prompt))
        time.sleep(2)
        results["bundle"].append(_time_bundle(runtime, prompt))
        time.sleep(2)
    medians = {name: (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
               for name, runs in results.items()}
    ratio = medians["bundle"][1] / medians["transformers"][1]
    print(f"\n{'engine':<14}{'prefill tok/s':>15}{'decode tok/s':>14}   (median of {REPEATS}, {THREADS} threads)")
    for name, (prefill, decode) in medians.items():
        print(f"{name:<14}{prefill:>15.1f}{decode:>14.1f}")
    print(f"decode ratio bundle / transformers: {ratio:.2f}x")
    assert ratio >= 2.0
