"""What block sparsity costs before any recovery: SmolLM2-135M with INT8 per-channel weights (the
QDQ / block-sparse kernel numerics), 32 x 32 blocks dropped by Fisher or Wanda importance at a
range of densities, perplexity on WikiText-2 valid (first 200k characters, PyTorch).

Calibration text is the rest of wiki.valid.raw (after the evaluated 200k characters) and Tiny
Shakespeare, so the evaluated text is never seen.

    python -m pytest tests/benchmarks/test_block_sparsity_quality.py -m benchmark -s
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

pytestmark = pytest.mark.benchmark
pytest.importorskip("torch")

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
WIKITEXT = DATA / "wikitext-2-raw" / "wiki.valid.raw"
POINTS = (("fisher", 0.9), ("fisher", 0.8), ("fisher", 0.7), ("wanda", 0.8))


def test_block_sparsity_cost():
    if not WIKITEXT.is_file():
        pytest.skip("WikiText-2 validation text not found beside the checkout")
    from edgesdk.compress import fake_quant, sparsify
    from edgesdk.compress.data import DataConfig, TokenData
    from edgesdk.evaluate import PerplexityConfig, reference_perplexity
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    loaded = load_model(resolve_model("smollm2-135m"))
    encode = lambda t: loaded.tokenizer(t)["input_ids"]  # noqa: E731
    text = WIKITEXT.read_text(encoding="utf-8")
    data = TokenData.load(DataConfig(files=(str(WIKITEXT), str(DATA / "tinyshakespeare" / "input.txt")),
                                     skip_chars=200_000, generated_sequences=0), loaded.tokenizer)
    scheme = fake_quant.QuantScheme(weight_bits=8, granularity="channel", activations="none", embedding_bits=None)
    base = copy.deepcopy(loaded.model).eval()
    fake_quant.attach(base, scheme)
    fake_quant.detach(base, bake=True)

    def ppl(model) -> float:
        return reference_perplexity(model, encode, text, PerplexityConfig()).perplexity

    rows = [("float", "-", 1.0, ppl(loaded.model)), ("int8", "-", 1.0, ppl(base))]
    scores = {}
    for importance, density in POINTS:
        config = sparsify.SparsifyConfig(density=density, importance=importance)
        if importance not in scores:
            model = copy.deepcopy(base)
            fake_quant.attach(model, scheme)
            batches = data.batches(config.calibration_batches, config.batch_size, config.sequence_length, config.seed)
            scores[importance] = sparsify.block_importance(model, batches, config, 32)
            fake_quant.detach(model, bake=False)
        model = copy.deepcopy(base)
        masks = sparsify.plan_masks(scores[importance], config)
        model.config.edgesdk_sparsity = {"block": 32, "masks": {n: sparsify.encode_mask(m) for n, m in masks.items()}}
        sparsify.apply_masks(model)
        fake_quant.attach(model, scheme)
        fake_quant.detach(model, bake=True)
        rows.append(("int8", importance, sparsify.density_summary(masks)["density"], ppl(model)))
    reference = rows[0][3]
    print(f"\n{'weights':>8}{'importance':>12}{'density':>9}{'perplexity':>12}{'vs float':>10}")
    for weights, importance, density, value in rows:
        print(f"{weights:>8}{importance:>12}{density:>9.2f}{value:>12.3f}{value / reference - 1:>+10.2%}")
    assert rows[1][3] < rows[-2][3], "dropping 30 % of the blocks should cost perplexity"
