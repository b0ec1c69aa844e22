"""fp32 bundle perplexity vs the PyTorch reference (WikiText-2 valid, first 200k chars, ctx 512/stride 512).

The bundle is the uncompressed build (recipe fp32-fused, or ``$EDGESDK_BENCH_FP32_BUNDLE``), so both
sides hold the same float32 weights and the figure is what the export and the runtime change.

    python -m pytest tests/benchmarks/test_quality.py -m benchmark -s
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.benchmark

WIKITEXT = Path(__file__).resolve().parents[3] / "shared" / "data" / "wikitext-2-raw" / "wiki.valid.raw"


def test_fp32_bundle_perplexity_within_half_percent_of_pytorch(smollm2_fp32_bundle):
    if not WIKITEXT.is_file():
        pytest.skip(f"WikiText-2 validation text not found beside the checkout ({WIKITEXT.name})")
    from edgesdk.evaluate import PerplexityConfig, bundle_perplexity, reference_perplexity
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model
    from edgesdk.runtime.session import open_runtime

    text = WIKITEXT.read_text(encoding="utf-8")
    config = PerplexityConfig()
    runtime = open_runtime(smollm2_fp32_bundle.path)
    ours = bundle_perplexity(runtime, text, config)
    model = load_model(resolve_model(smollm2_fp32_bundle.manifest["model"]["before"]["source"])).model
    ref = reference_perplexity(model, runtime.tokenizer.encode_plain, text, config)
    relative = ours.perplexity / ref.perplexity - 1
    print(f"\nbundle {ours.perplexity:.4f}  PyTorch {ref.perplexity:.4f}  relative {relative * 100:+.4f} % "
          f"({ours.tokens_scored} tokens, {ours.windows} windows)")
    assert abs(relative) <= 0.005
