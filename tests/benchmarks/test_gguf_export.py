"""The default bundle exported as GGUF and run by llama.cpp, against llama.cpp's own quantizations.

The export re-encodes the QAT-trained INT4 blocks as Q4_0 (export/gguf_tensors.py), so llama.cpp runs
the bundle's weights with its own kernels. Measured here, every engine on the same token ids:

- quality: perplexity on WikiText-2 valid (first 200k characters, context 512, stride 512) of the
  exported file, of the bundle through edgesdk, and of llama.cpp's Q4_0, Q4_K_M and Q8_0 made by
  ``llama_model_quantize`` from the same source GGUF;
- speed: greedy decode of 128 tokens after a 128-token prompt, 2 threads, the exported file
  against llama.cpp's Q4_0 (the same format, so the same kernels) and the bundle, alternating,
  median of 3 after one untimed run each;
- a bundle pruned per layer (``int4-prune``: FFN widths from the Fisher ranking across layers),
  exported as llama.cpp's ``deci`` architecture: its perplexity in llama.cpp against the bundle's,
  and decode speed of both.

    pip install llama-cpp-python   # benchmarks only, never a runtime dependency
    EDGESDK_BENCH_BUNDLE=DIR EDGESDK_BENCH_PRUNED_BUNDLE=DIR \
        python -m pytest tests/benchmarks/test_gguf_export.py -m benchmark -s
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

import numpy as np
import pytest

from tests.benchmarks.llamacpp import LlamaCppEngine, alternated, quantized_gguf

pytestmark = pytest.mark.benchmark
llama_cpp = pytest.importorskip("llama_cpp")

THREADS, PROMPT, NEW, REPEATS = 2, 128, 128, 3
WIKITEXT = Path(__file__).resolve().parents[3] / "shared" / "data" / "wikitext-2-raw" / "wiki.valid.raw"


@pytest.fixture(scope="module")
def exported(smollm2_rpi5_bundle, tmp_path_factory):
    from edgesdk.export.gguf_export import export_gguf

    report = export_gguf(smollm2_rpi5_bundle.path, tmp_path_factory.mktemp("gguf") / "default.gguf")
    print(f"\nexported {report.path.name}: {report.size_bytes / 1e6:.1f} MB, {report.tensor_types}, "
          f"{report.seconds:.1f} s")
    return report.path


@pytest.fixture(scope="module")
def source_gguf() -> Path:
    from edgesdk.models.sources import fetch_alias

    return fetch_alias("smollm2-135m", quiet=True)


@pytest.fixture(scope="module")
def pruned_bundle(tmp_path_factory):
    """An ``int4-prune`` build for rpi5 ($EDGESDK_BENCH_PRUNED_BUNDLE reuses one; building takes about 20 min)."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.bundle import verify_bundle

    existing = os.environ.get("EDGESDK_BENCH_PRUNED_BUNDLE")
    if existing:
        return verify_bundle(Path(existing))
    return build(BuildConfig(target="rpi5", recipe="int4-prune", out=tmp_path_factory.mktemp("pruned") / "b",
                             progress=False))


def test_perplexity_of_the_export_against_llamacpp_quants(smollm2_rpi5_bundle, exported, source_gguf):
    if not WIKITEXT.is_file():
        pytest.skip(f"WikiText-2 validation text not found beside the checkout ({WIKITEXT})")
    from edgesdk.evaluate import PerplexityConfig, bundle_perplexity, perplexity
    from edgesdk.runtime.session import open_runtime

    config = PerplexityConfig()
    text = WIKITEXT.read_text(encoding="utf-8")
    runtime = open_runtime(smollm2_rpi5_bundle.path, threads=THREADS)
    ids = runtime.tokenizer.encode(text[: config.max_chars], add_special_tokens=False)
    bundle_size = sum(f["size"] for f in smollm2_rpi5_bundle.manifest["files"].values())
    rows = [("edgesdk bundle (ONNX Runtime)", bundle_size, bundle_perplexity(runtime, text, config).perplexity)]
    del runtime
    engines = {"exported GGUF (llama.cpp)": exported,
               **{f"llama.cpp {kind}": quantized_gguf(source_gguf, kind, source_gguf.parent)
                  for kind in ("Q4_0", "Q4_K_M", "Q8_0")}}
    for name, path in engines.items():
        engine = LlamaCppEngine(path, THREADS, config.context, logits_all=True)
        tokens = engine.llm.tokenize(text[: config.max_chars].encode(), add_bos=False, special=False)
        assert tokens == ids, f"{name}: llama.cpp tokenizes the text differently from the bundle"
        rows.append((name, path.stat().st_size, perplexity(engine.score_window, ids, config).perplexity))
        del engine
    print(f"\n{len(ids):,} tokens, identical token ids in every engine")
    print(f"{'model':<32}{'MB':>8}{'perplexity':>12}")
    for name, size, value in rows:
        print(f"{name:<32}{size / 1e6:>8.1f}{value:>12.3f}")
    exported_ppl, bundle_ppl = rows[1][2], rows[0][2]
    assert abs(exported_ppl / bundle_ppl - 1) < 0.01  # the same weights, two engines' rounding of activations


def test_decode_speed_of_the_export_against_llamacpp_q4_0(smollm2_rpi5_bundle, exported, source_gguf):
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.session import open_runtime

    engines = {"exported GGUF (llama.cpp)": LlamaCppEngine(exported, THREADS),
               "llama.cpp Q4_0": LlamaCppEngine(quantized_gguf(source_gguf, "Q4_0", source_gguf.parent), THREADS)}
    runtime = open_runtime(smollm2_rpi5_bundle.path, threads=THREADS)
    prompt = np.random.default_rng(0).integers(100, 49152, PROMPT).tolist()

    def bundle_run():
        tokens, stats = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=NEW), stop_ids=set())
        assert len(tokens) == NEW
        return stats.prefill_tok_s, stats.decode_tok_s

    runners = {**{name: (lambda e=engine: e.time_generation(prompt, NEW)) for name, engine in engines.items()},
               "edgesdk bundle (ONNX Runtime)": bundle_run}
    runs = alternated(runners, REPEATS)
    base = statistics.median(r[1] for r in runs["llama.cpp Q4_0"])
    print(f"\n{'engine':<32}{'prefill tok/s':>14}{'decode tok/s':>14}{'decode x Q4_0':>15}")
    for name, values in runs.items():
        decode = statistics.median(v[1] for v in values)
        print(f"{name:<32}{statistics.median(v[0] for v in values):>14.1f}{decode:>14.1f}{decode / base:>15.2f}")


def test_a_bundle_pruned_per_layer_runs_in_llamacpp_at_its_perplexity(pruned_bundle, tmp_path):
    if not WIKITEXT.is_file():
        pytest.skip(f"WikiText-2 validation text not found beside the checkout ({WIKITEXT})")
    from edgesdk.evaluate import PerplexityConfig, bundle_perplexity, perplexity
    from edgesdk.export.gguf_export import export_gguf
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.session import open_runtime

    report = export_gguf(pruned_bundle.path, tmp_path / "pruned.gguf")
    assert report.architecture == "deci", "the int4-prune build left every layer the same width"
    config = PerplexityConfig()
    text = WIKITEXT.read_text(encoding="utf-8")
    runtime = open_runtime(pruned_bundle.path, threads=THREADS)
    ids = runtime.tokenizer.encode(text[: config.max_chars], add_special_tokens=False)
    bundle_ppl = bundle_perplexity(runtime, text, config).perplexity
    engine = LlamaCppEngine(report.path, THREADS, config.context, logits_all=True)
    exported_ppl = perplexity(engine.score_window, ids, config).perplexity
    del engine

    prompt = np.random.default_rng(0).integers(100, 49152, PROMPT).tolist()
    engine = LlamaCppEngine(report.path, THREADS)

    def bundle_run():
        _, stats = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=NEW), stop_ids=set())
        return stats.decode_tok_s

    runners = {"exported deci GGUF (llama.cpp)": lambda: engine.time_generation(prompt, NEW)[1],
               "edgesdk bundle (ONNX Runtime)": bundle_run}
    decode = {name: statistics.median(values) for name, values in alternated(runners, REPEATS).items()}
    print(f"\n{report.path.name}: {report.size_bytes / 1e6:.1f} MB, {report.tensor_types}; {len(ids):,} tokens")
    print(f"{'engine':<34}{'perplexity':>12}{'decode tok/s':>14}")
    for (name, tok_s), value in zip(decode.items(), (exported_ppl, bundle_ppl), strict=True):
        print(f"{name:<34}{value:>12.3f}{tok_s:>14.1f}")
    assert abs(exported_ppl / bundle_ppl - 1) < 0.01  # the same weights, two engines' rounding of activations
