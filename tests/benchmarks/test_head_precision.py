"""What quantizing the tied embedding / LM head costs, separately from the layers (PyTorch,
weights exactly as the fused graph stores them; perplexity on WikiText-2 valid, first 200k chars).

    python -m pytest tests/benchmarks/test_head_precision.py -m benchmark -s
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.benchmark
pytest.importorskip("torch")

WIKITEXT = Path(__file__).resolve().parents[3] / "shared" / "data" / "wikitext-2-raw" / "wiki.valid.raw"
POINTS = ((None, None), (8, None), (8, 8), (4, 8), (4, 4))  # (layer bits, head bits); None = float32


def test_head_precision_cost():
    if not WIKITEXT.is_file():
        pytest.skip("WikiText-2 validation text not found beside the checkout")
    from edgesdk.evaluate import PerplexityConfig, reference_perplexity
    from edgesdk.export.validate import fake_quantized_copy
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    loaded = load_model(resolve_model("smollm2-135m"))
    text = WIKITEXT.read_text(encoding="utf-8")
    encode = lambda t: loaded.tokenizer(t)["input_ids"]  # noqa: E731
    config = PerplexityConfig()
    results = {}
    for layer_bits, head_bits in POINTS:
        model = loaded.model if layer_bits is None else fake_quantized_copy(loaded.model, layer_bits, 32, head_bits)
        results[(layer_bits, head_bits)] = reference_perplexity(model, encode, text, config).perplexity
    base = results[(None, None)]
    print(f"\n{'layers':>8}{'head':>8}{'perplexity':>12}{'vs float':>10}")
    for (layer_bits, head_bits), ppl in results.items():
        print(f"{layer_bits or 'fp32':>8}{head_bits or 'fp32':>8}{ppl:>12.3f}{ppl / base - 1:>+10.2%}")
