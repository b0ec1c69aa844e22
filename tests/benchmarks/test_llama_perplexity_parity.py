"""``edgesdk eval --method llama-perplexity`` against llama.cpp on the real model: SmolLM2-135M's float32 bundle, and
the same bundle exported to an F32 GGUF run by llama.cpp (llama-cpp-python) under llama-perplexity's rule
(tools/perplexity/perplexity.cpp: the text tokenized once, whole chunks of n_ctx, the first token replaced by BOS
only where the vocabulary adds one, the second half of each chunk scored), with an F32 KV cache so that both sides
compute in float32. The first 60,000 characters of WikiText-2 valid, context 512.

    EDGESDK_BENCH_FP32_BUNDLE=DIR python -m pytest tests/benchmarks/test_llama_perplexity_parity.py -m benchmark -s
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.benchmark

CONTEXT, CHARACTERS = 512, 60_000
WIKITEXT = Path(__file__).resolve().parents[3] / "shared" / "data" / "wikitext-2-raw" / "wiki.valid.raw"
GGML_TYPE_F32 = 0


def test_the_figure_is_the_one_llama_cpp_gives_for_the_exported_model(smollm2_fp32_bundle, tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is the reference")
    from edgesdk.evaluate import LLAMA_PERPLEXITY, PerplexityConfig, bundle_perplexity
    from edgesdk.export.gguf_export import export_gguf
    from edgesdk.runtime.session import open_runtime

    if not WIKITEXT.is_file():
        pytest.skip(f"WikiText-2 is not at {WIKITEXT}")
    data = WIKITEXT.read_bytes().decode("utf-8")[:CHARACTERS].encode("utf-8").removesuffix(b"\n")
    runtime = open_runtime(smollm2_fp32_bundle.path, threads=2)
    ours = bundle_perplexity(runtime, data.decode("utf-8"), PerplexityConfig(
        context=CONTEXT, stride=CONTEXT, max_chars=None, method=LLAMA_PERPLEXITY))
    del runtime

    gguf = export_gguf(smollm2_fp32_bundle.path, tmp_path / "model.gguf").path
    model = llama_cpp.Llama(str(gguf), n_ctx=CONTEXT, n_batch=CONTEXT, n_threads=2, logits_all=True, verbose=False,
                            type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)
    tokens = model.tokenize(data, add_bos=True)
    adds_bos = tokens[0] == model.token_bos()
    nll, scored, chunks = 0.0, 0, len(tokens) // CONTEXT
    for start in range(0, chunks * CONTEXT, CONTEXT):
        chunk = tokens[start:start + CONTEXT]
        if adds_bos:
            chunk[0] = model.token_bos()
        model.reset()
        model.eval(chunk)
        logits = np.asarray(model.scores[:CONTEXT], np.float64)
        for position in range(CONTEXT // 2, CONTEXT - 1):  # logits at a position predict the next token
            row = logits[position]
            peak = row.max()
            nll += peak + math.log(np.exp(row - peak).sum()) - row[chunk[position + 1]]
            scored += 1
    theirs = math.exp(nll / scored)
    print(f"\nedgesdk {ours.perplexity:.6f} over {ours.tokens_scored} tokens in {ours.windows} chunks; "
          f"llama.cpp {theirs:.6f} over {scored} tokens in {chunks} chunks; "
          f"relative difference {ours.perplexity / theirs - 1:+.2e}")
    assert (ours.tokens_scored, ours.windows) == (scored, chunks)
    assert ours.perplexity == pytest.approx(theirs, rel=1e-4)
