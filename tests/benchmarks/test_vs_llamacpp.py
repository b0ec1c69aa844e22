"""Bundles against llama.cpp on the same model: decode/prefill speed and a size/quality table.

Speed (DESIGN.md measure): batch 1, 2 threads, 128-token prompt, 128 greedy new tokens, median of
3 after one untimed run of each engine; each bundle and llama.cpp Q8_0 alternate, never running at
once, with a pause between.
Quality: perplexity on WikiText-2 valid (first 200k characters, context 512, stride 512), the
same token ids scored by every engine.

    pip install llama-cpp-python   # benchmarks only, never a runtime dependency
    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python -m pytest tests/benchmarks/test_vs_llamacpp.py -m benchmark -s

With the tunable both engines' weights sit on huge pages, as under ``edgesdk run`` (which sets it
itself, edgesdk/runtime/huge_pages.py); without it neither's do.

Bundles: ``EDGESDK_BENCH_BUNDLES="default=DIR,int4=DIR,..."`` reuses prebuilt ones (a trained
recipe takes 10-40 minutes on 2 cores); otherwise each recipe is built here, trained on
WikiText-2 valid beyond its first 200,000 characters (the evaluation slice) and Tiny Shakespeare.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import numpy as np
import pytest

from tests.benchmarks.llamacpp import LlamaCppEngine, amx_faults, quantized_gguf

pytestmark = pytest.mark.benchmark
llama_cpp = pytest.importorskip("llama_cpp")

RECIPES = ("default", "int8-head", "int4-small", "int8-only", "int8-prune-light", "int8-prune-heavy", "int4-prune", "aggressive")
SPEED_RECIPES = ("default", "int8-head", "int4", "int4-small", "int4-prune")
THREADS, PROMPT, NEW, REPEATS = 2, 128, 128, 3
DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
WIKITEXT = DATA / "wikitext-2-raw" / "wiki.valid.raw"
EVAL_CHARS = 200_000


@pytest.fixture(scope="module")
def source_gguf() -> Path:
    from edgesdk.models.sources import fetch_alias

    return fetch_alias("smollm2-135m", quiet=True)


def prebuilt_bundles() -> dict[str, Path]:
    listed = os.environ.get("EDGESDK_BENCH_BUNDLES", "")
    pairs = [item.split("=", 1) for item in listed.split(",") if "=" in item]
    return {name.strip(): Path(path.strip()) for name, path in pairs}


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, source_gguf):
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.bundle import verify_bundle
    from edgesdk.compress.data import DataConfig

    prebuilt = prebuilt_bundles()
    files = tuple(str(p) for p in (WIKITEXT, DATA / "tinyshakespeare" / "input.txt") if p.is_file())
    data = DataConfig(files=files, skip_chars=EVAL_CHARS, generated_sequences=8)
    root = tmp_path_factory.mktemp("recipes")
    return {recipe: verify_bundle(prebuilt[recipe]) if recipe in prebuilt else
            build(BuildConfig(target="rpi5", recipe=recipe, out=root / recipe, data=data, progress=False))
            for recipe in (tuple(prebuilt) or RECIPES)}


def _bundle_speed(runtime, prompt):
    from edgesdk.runtime.generate import SamplingConfig, generate

    tokens, stats = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=NEW), stop_ids=set())
    assert len(tokens) == NEW
    return stats.prefill_tok_s, stats.decode_tok_s


def test_decode_and_prefill_against_llamacpp_q8(bundles, source_gguf):
    from edgesdk.runtime.huge_pages import huge_pages_in_use
    from edgesdk.runtime.session import open_runtime

    q8_file = quantized_gguf(source_gguf, "Q8_0", source_gguf.parent)
    # llama.cpp maps the file by default; read into memory (use_mmap=False) it gets huge pages as
    # the bundles do when this process runs with glibc's tunable. Its faster setting is the baseline.
    engines = {"llama.cpp Q8_0 mmap": LlamaCppEngine(q8_file, THREADS),
               "llama.cpp Q8_0 no-mmap": LlamaCppEngine(q8_file, THREADS, use_mmap=False)}
    runtimes = {name: open_runtime(bundle.path, threads=THREADS) for name, bundle in bundles.items()
                if name in SPEED_RECIPES}
    prompt = np.random.default_rng(0).integers(100, 49152, PROMPT).tolist()
    runs = {**{name: [] for name in engines}, **{name: [] for name in runtimes}}
    for engine in engines.values():  # warm-up, untimed: first-run allocations on every side alike
        engine.time_generation(prompt, NEW)
    for runtime in runtimes.values():
        _bundle_speed(runtime, prompt)
    time.sleep(1)
    for _ in range(REPEATS):
        for name, runtime in runtimes.items():
            for engine_name, engine in engines.items():
                runs[engine_name].append(engine.time_generation(prompt, NEW))
                time.sleep(1)
            runs[name].append(_bundle_speed(runtime, prompt))
            time.sleep(1)
    baseline = max(engines, key=lambda name: statistics.median(r[1] for r in runs[name]))
    base_prefill = statistics.median(r[0] for r in runs[baseline])
    base_decode = statistics.median(r[1] for r in runs[baseline])
    huge = huge_pages_in_use()
    print(f"\nhuge pages in this process: {0 if huge is None else huge >> 20} MiB "
          f"(GLIBC_TUNABLES=glibc.malloc.hugetlb=1 turns them on, as 'edgesdk run' does); baseline: {baseline}"
          + ("; llama.cpp's weights in plain CPU buffers (an AMX CPU: its AMX kernel faults in this build)"
             if amx_faults() else ""))
    print(f"{'engine':<24}{'prefill tok/s':>14}{'decode tok/s':>14}{'prefill x':>11}{'decode x':>10}")
    for name, values in runs.items():
        prefill, decode = statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)
        print(f"{name:<24}{prefill:>14.1f}{decode:>14.1f}{prefill / base_prefill:>11.2f}{decode / base_decode:>10.2f}")


def test_size_quality_table(bundles, source_gguf):
    if not WIKITEXT.is_file():
        pytest.skip("WikiText-2 validation text not found beside the checkout")
    from edgesdk.evaluate import PerplexityConfig, bundle_perplexity, perplexity
    from edgesdk.runtime.session import open_runtime

    text = WIKITEXT.read_text(encoding="utf-8")
    config = PerplexityConfig()
    rows = []
    for name, bundle in bundles.items():
        runtime = open_runtime(bundle.path, threads=THREADS)
        size = sum(f["size"] for f in bundle.manifest["files"].values())
        rows.append((f"edgesdk {name}", size, bundle_perplexity(runtime, text, config).perplexity))
    ids = runtime.tokenizer.encode(text[: config.max_chars], add_special_tokens=False)
    for kind in ("Q8_0", "Q4_K_M", "Q4_0"):
        gguf = quantized_gguf(source_gguf, kind, source_gguf.parent)
        engine = LlamaCppEngine(gguf, THREADS, config.context, logits_all=True)
        rows.append((f"llama.cpp {kind}", gguf.stat().st_size, perplexity(engine.score_window, ids, config).perplexity))
    fp16 = next(iter(bundles.values())).manifest["model"]["before"]["parameters"] * 2
    print(f"\n{'model':<22}{'MB':>8}{'vs FP16':>9}{'perplexity':>12}")
    for name, size, ppl in rows:
        print(f"{name:<22}{size / 1e6:>8.1f}{fp16 / size:>8.2f}x{ppl:>12.3f}")


DIVERGENCE_WINDOWS = 16  # 8,176 scored tokens; the float model's logits for them are held in memory (1.6 GB)


def test_divergence_from_the_float_model(bundles, source_gguf):
    """KL(P_float || P_engine) per token and top-token agreement against the uncompressed model, for each
    bundle and each llama.cpp quantization, on the first windows of the evaluation text (llama.cpp's
    ``llama-perplexity --kl-divergence`` measure)."""
    if not WIKITEXT.is_file():
        pytest.skip("WikiText-2 validation text not found beside the checkout")
    import torch

    from edgesdk.evaluate import PerplexityConfig, bundle_scorer, divergence, reference_scorer
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model
    from edgesdk.runtime.session import open_runtime

    torch.set_num_threads(THREADS)
    config = PerplexityConfig()
    first_runtime = open_runtime(next(iter(bundles.values())).path, threads=THREADS)
    text = WIKITEXT.read_text(encoding="utf-8")[: config.max_chars]
    ids = first_runtime.tokenizer.encode(text, add_special_tokens=False)[: config.context * DIVERGENCE_WINDOWS]
    float_scorer = reference_scorer(load_model(resolve_model("smollm2-135m"), progress=False).model.eval())
    held: dict[bytes, np.ndarray] = {}

    def reference(window: np.ndarray) -> np.ndarray:
        key = window.tobytes()
        if key not in held:
            held[key] = float_scorer(window).astype(np.float32)
        return held[key]

    rows = []
    for name, bundle in bundles.items():
        runtime = open_runtime(bundle.path, threads=THREADS)
        rows.append((f"edgesdk {name}", divergence(bundle_scorer(runtime), reference, ids, config)))
    for kind in ("Q8_0", "Q4_K_M", "Q4_0"):
        engine = LlamaCppEngine(quantized_gguf(source_gguf, kind, source_gguf.parent), THREADS, config.context,
                                logits_all=True)
        rows.append((f"llama.cpp {kind}", divergence(engine.score_window, reference, ids, config)))
    print(f"\nagainst the float model, {rows[0][1].tokens_scored} tokens of WikiText-2 valid")
    print(f"{'model':<26}{'mean KLD':>10}{'median':>9}{'p99':>9}{'max':>9}{'same top':>10}")
    for name, result in rows:
        print(f"{name:<26}{result.mean_kld:>10.4f}{result.median_kld:>9.4f}{result.p99_kld:>9.3f}"
              f"{result.max_kld:>9.3f}{result.same_top_token:>9.1%}")


def test_last_word_accuracy(bundles, source_gguf):
    """An accuracy task beside perplexity: the last word of WikiText-2 paragraphs in the evaluation slice."""
    if not WIKITEXT.is_file():
        pytest.skip("WikiText-2 validation text not found beside the checkout")
    import torch

    from edgesdk.evaluate import bundle_scorer, last_word_accuracy, last_word_documents, reference_scorer
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model
    from edgesdk.runtime.session import open_runtime

    torch.set_num_threads(THREADS)
    docs = last_word_documents(WIKITEXT.read_text(encoding="utf-8")[:EVAL_CHARS])
    first_runtime = open_runtime(next(iter(bundles.values())).path, threads=THREADS)

    def encode(text: str) -> list[int]:
        return first_runtime.tokenizer.encode(text, add_special_tokens=False)

    rows = [("PyTorch float", last_word_accuracy(
        reference_scorer(load_model(resolve_model("smollm2-135m"), progress=False).model.eval()), encode, docs))]
    for name, bundle in bundles.items():
        rows.append((f"edgesdk {name}", last_word_accuracy(
            bundle_scorer(open_runtime(bundle.path, threads=THREADS)), encode, docs)))
    for kind in ("Q8_0", "Q4_K_M", "Q4_0"):
        engine = LlamaCppEngine(quantized_gguf(source_gguf, kind, source_gguf.parent), THREADS, 1024, logits_all=True)
        rows.append((f"llama.cpp {kind}", last_word_accuracy(engine.score_window, encode, docs)))
    stderr = np.sqrt(0.25 / len(docs))
    print(f"\nlast word of {len(docs)} WikiText-2 paragraphs (accuracy stderr up to {stderr:.1%})")
    print(f"{'model':<26}{'accuracy':>10}{'word ppl':>10}")
    for name, result in rows:
        print(f"{name:<26}{result.accuracy:>10.1%}{result.word_perplexity:>10.2f}")
