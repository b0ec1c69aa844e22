"""Speculative decoding on SmolLM2-135M: the uncompressed bundle drafted for by the default INT4 bundle.

The pair a board would run is a large target and a small draft of one family; only SmolLM2-135M can be
fetched here, so the target is its float32 bundle (``fp32-fused``, 540 MB: the slow, exact model) and the
draft its default build (INT4, 68 MB), as llama.cpp users pair an F16 model with its Q4 quantization.
Greedy answers to chat prompts, 128 new tokens, 2 threads, the target alone and with drafts alternating,
median of 3 after one untimed run each; the answers must be equal (the target's own tokens).

    EDGESDK_BENCH_BUNDLE=DIR EDGESDK_BENCH_FP32_BUNDLE=DIR \
        python -m pytest tests/benchmarks/test_speculative.py -m benchmark -s
"""

from __future__ import annotations

import statistics
import time

import pytest

pytestmark = pytest.mark.benchmark

THREADS, NEW, REPEATS = 2, 128, 3
QUESTIONS = ["Explain how a bicycle stays upright while it moves.",
             "Write a short story about a lighthouse keeper who finds a message in a bottle.",
             "List the steps to make a cup of tea, and say why each one matters."]


def test_drafts_from_the_int4_bundle_speed_up_the_float32_bundle(smollm2_rpi5_bundle, smollm2_fp32_bundle):
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.session import open_runtime
    from edgesdk.runtime.speculative import DraftConfig, DraftModel

    # as edgesdk run opens them: the target's pool spinning, the draft's not (two spinning pools taking turns on the
    # same cores starve each other)
    target = open_runtime(smollm2_fp32_bundle.path, threads=THREADS)
    draft = open_runtime(smollm2_rpi5_bundle.path, threads=THREADS, spinning=False)
    sampling = SamplingConfig(max_new_tokens=NEW)
    prompts = [target.tokenizer.prompt_ids(question, raw=False) for question in QUESTIONS]
    settings = {"target alone": None, "draft 2, p_min 0 (default)": DraftConfig(max_draft=2, p_min=0.0),
                "draft 4, p_min 0.2": DraftConfig(max_draft=4, p_min=0.2),
                "draft 8, p_min 0.75": DraftConfig(max_draft=8, p_min=0.75)}
    models = {name: None if config is None else DraftModel(draft.backend, config, target.backend.vocab_size)
              for name, config in settings.items()}

    def run(model) -> tuple[float, list[list[int]], int, int]:
        tokens, seconds, drafted, accepted = [], 0.0, 0, 0
        for ids in prompts:
            start = time.perf_counter()
            answer, stats = generate(target.backend, ids, sampling, stop_ids=set(), lookup=model)
            seconds += time.perf_counter() - start
            tokens.append(answer)
            drafted, accepted = drafted + stats.draft_tokens, accepted + stats.draft_accepted
        return sum(map(len, tokens)) / seconds, tokens, drafted, accepted

    for model in models.values():
        run(model)
    results = {name: [] for name in models}
    for _ in range(REPEATS):
        for name, model in models.items():
            time.sleep(1)
            results[name].append(run(model))
    reference = results["target alone"][0][1]
    base = statistics.median(r[0] for r in results["target alone"])
    print(f"\n{'setting':<32}{'tok/s (whole answer)':>22}{'x target alone':>16}{'draft tokens taken':>20}")
    for name, runs in results.items():
        for _, answers, _, _ in runs:
            assert answers == reference, f"{name}: the answers differ from the target's own"
        rate = statistics.median(r[0] for r in runs)
        drafted, accepted = runs[-1][2], runs[-1][3]
        taken = f"{accepted}/{drafted} ({accepted / drafted:.0%})" if drafted else "-"
        print(f"{name:<32}{rate:>22.1f}{rate / base:>16.2f}{taken:>20}")
