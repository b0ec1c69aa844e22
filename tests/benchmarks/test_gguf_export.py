"""The default bundle exported as GGUF and run by llama.cpp, against llama.cpp's own quantizations.

The export re-encodes the QAT-trained INT4 blocks as Q4_0 (export/gguf_tensors.py), so llama.cpp runs
the bundle's weights with its own kernels. Measured here, every engine on the same token ids:

- quality: perplexity on WikiText-2 valid (first 200k characters, context 512, stride 512) of the
  exported file, of the bundle through edgesdk, and of llama.cpp's Q4_0, Q4_K_M and Q8_0 made by
  ``llama_model_quantize`` from the same source GGUF;
- speed: greedy decode of 128 tokens after a 128-token prompt, 2 threads, the exported file
  against llama.cpp's Q4_0 (the same format, so the same kernels) and the bundle, alternating,
  median of 3 after one untimed run each.

    pip install llama-cpp-python   # benchmarks only, never a runtime dependency
    EDGESDK_BENCH_BUNDLE=DIR python -m pytest tests/benchmarks/test_gguf_export.py -m benchmark -s
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np
import pytest

from tests.benchmarks.llamacpp import LlamaCppEngine, quantized_gguf

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
    for run in runners.values():  # warm-up, untimed
        run()
    runs = {name: [] for name in runners}
    for _ in range(REPEATS):
        for name, run in runners.items():
            time.sleep(1)
            runs[name].append(run())
    base = statistics.median(r[1] for r in runs["llama.cpp Q4_0"])
    print(f"\n{'engine':<32}{'prefill tok/s':>14}{'decode tok/s':>14}{'decode x Q4_0':>15}")
    for name, values in runs.items():
        decode = statistics.median(v[1] for v in values)
        print(f"{name:<32}{statistics.median(v[0] for v in values):>14.1f}{decode:>14.1f}{decode / base:>15.2f}")
