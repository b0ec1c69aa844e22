"""Mixed precision on SmolLM2-135M: held-out perplexity of post-training INT4 (block 32, INT8
head) as the Fisher choice keeps 0, 5, 10 and 15 % of the linear weights at 8 bits.

The choice is measured on 8 batches of 2 x 256 tokens of WikiText-2 valid beyond its first 200,000
characters; the figure is perplexity on the first 8,192 tokens (never seen), windows of 256.

    python -m pytest tests/benchmarks/test_mixed_precision.py -m benchmark -s
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

pytestmark = pytest.mark.benchmark
torch = pytest.importorskip("torch")

WIKITEXT = Path(__file__).resolve().parents[3] / "shared" / "data" / "wikitext-2-raw" / "wiki.valid.raw"
FRACTIONS = (0.0, 0.05, 0.1, 0.15)


def test_fisher_mixed_precision_against_plain_int4():
    if not WIKITEXT.is_file():
        pytest.skip("WikiText-2 validation text not found beside the checkout")
    from edgesdk.compress import fake_quant
    from edgesdk.compress.measure import heldout_perplexity
    from edgesdk.compress.mixed_precision import choose_units, rounding_gains, unit_linears
    from edgesdk.compress.prune import fisher_diagonal
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    loaded = load_model(resolve_model("smollm2-135m"))
    model, text = loaded.model.eval(), WIKITEXT.read_text(encoding="utf-8")
    heldout = torch.tensor(loaded.tokenizer(text[:40_000])["input_ids"][:8192])
    pool = torch.tensor(loaded.tokenizer(text[200_000:])["input_ids"])
    starts = torch.randint(0, pool.numel() - 257, (8, 2), generator=torch.Generator().manual_seed(3))
    batches = [torch.stack([pool[s: s + 256] for s in row.tolist()]) for row in starts]
    gains = rounding_gains(model, fisher_diagonal(copy.deepcopy(model), batches), 32)
    names = unit_linears(model)
    print(f"\nfloat: {heldout_perplexity(model, heldout):.3f}")
    for fraction in FRACTIONS:
        units = choose_units(model, gains, fraction)
        quantized = copy.deepcopy(model)
        fake_quant.attach(quantized, fake_quant.QuantScheme(
            weight_bits=4, activations="none", embedding_bits=8,
            eight_bit_linears=tuple(name for unit in units for name in names[unit])))
        fake_quant.detach(quantized, bake=True)
        print(f"int4, {fraction:.0%} of linear weights at 8 bits ({len(units)} units): "
              f"{heldout_perplexity(quantized, heldout):.3f}; first units: {units[:6]}")
