"""What 32 x 32 block sparsity costs SmolLM2-135M before any recovery, by how blocks are chosen
and allocated, against unstructured sparsity of the same model (PyTorch, float weights).

Perplexity on the first 4,096 tokens of WikiText-2 valid (windows of 512) for speed; the bundle
figures through the runtime are in the README. Calibration text is wiki.valid.raw after its
first 200k characters plus Tiny Shakespeare, so the evaluated text is never seen.

    python -m pytest tests/benchmarks/test_block_sparsity_quality.py -m benchmark -s
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

pytestmark = pytest.mark.benchmark
torch = pytest.importorskip("torch")

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
WIKITEXT = DATA / "wikitext-2-raw" / "wiki.valid.raw"
BLOCK = 32


@pytest.fixture(scope="module")
def setup():
    """SmolLM2-135M, the evaluated token ids, calibration batches and each linear's input Hessian."""
    if not WIKITEXT.is_file():
        pytest.skip("WikiText-2 validation text not found beside the checkout")
    from edgesdk.compress import fake_quant, sparsify
    from edgesdk.compress.data import DataConfig, TokenData
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    loaded = load_model(resolve_model("smollm2-135m"))
    model = loaded.model.eval()
    ids = torch.tensor(loaded.tokenizer(WIKITEXT.read_text(encoding="utf-8")[:30_000])["input_ids"][:4096])
    data = TokenData.load(DataConfig(files=(str(WIKITEXT), str(DATA / "tinyshakespeare" / "input.txt")),
                                     skip_chars=200_000, generated_sequences=0), loaded.tokenizer)
    batches = data.batches(16, 2, 256, 3)
    hessians = sparsify.input_hessians(model, fake_quant.decoder_linears(model), batches)
    return model, ids, batches, hessians


def test_block_sparsity_cost(setup):
    from edgesdk.compress import fake_quant, sparsify
    from edgesdk.compress.measure import heldout_perplexity

    model, ids, batches, hessians = setup
    linears = fake_quant.decoder_linears(model)

    def perplexity(masks=None, refit=False, block=BLOCK) -> float:
        copy_ = copy.deepcopy(model)
        if masks is not None:
            copy_.config.edgesdk_sparsity = {"block": block,
                                             "masks": {n: sparsify.encode_mask(m) for n, m in masks.items()}}
            if refit:
                sparsify.reconstruct(copy_, masks, hessians, block)
            sparsify.apply_masks(copy_)
        return heldout_perplexity(copy_, ids, 512)

    rows = [("dense", "-", 1.0, perplexity())]
    fisher = sparsify.block_importance(model, batches, sparsify.SparsifyConfig(importance="fisher"), BLOCK)
    rows.append(("fisher, one global threshold (seed)", "no", 0.9,
                 perplexity(sparsify.plan_masks(fisher, sparsify.SparsifyConfig(density=0.9, importance="fisher")))))
    wanda = sparsify.block_importance(model, batches, sparsify.SparsifyConfig(importance="wanda"), BLOCK)
    rows.append(("wanda, every weight the same", "yes", 0.9,
                 perplexity(sparsify.plan_masks_by_density(wanda, dict.fromkeys(wanda, 0.9)), refit=True)))
    costs = sparsify.weight_sensitivity(model, wanda, batches[:1], BLOCK, 0.3)
    sizes = {n: s.numel() for n, s in wanda.items()}
    for density in (0.97, 0.95, 0.9):
        densities = sparsify.allocate_densities(costs, sizes, sparsify.SparsifyConfig(density=density))
        rows.append(("wanda, measured allocation (default)", "yes", density,
                     perplexity(sparsify.plan_masks_by_density(wanda, densities), refit=True)))
    norms = sparsify.input_norms(model, linears, batches)
    for fraction in (0.1, 0.3):  # unstructured Wanda, per output row, for scale
        copy_ = copy.deepcopy(model)
        with torch.no_grad():
            for name, linear in fake_quant.decoder_linears(copy_).items():
                score = linear.weight.abs() * norms[name][None, :]  # (N, K)
                drop = score.topk(int(fraction * score.shape[1]), dim=1, largest=False).indices
                linear.weight.scatter_(1, drop, 0.0)
        rows.append(("unstructured wanda (no kernel skips these)", "no", 1 - fraction, heldout_perplexity(copy_, ids, 512)))
    base = rows[0][3]
    print(f"\n{'blocks chosen by':<44}{'refit':>6}{'density':>9}{'perplexity':>12}{'vs dense':>10}")
    for label, refit, density, value in rows:
        print(f"{label:<44}{refit:>6}{density:>9.2f}{value:>12.3f}{value / base - 1:>+10.1%}")
    measured = [r[3] for r in rows if r[0].startswith("wanda, measured")]
    assert measured == sorted(measured), "more blocks dropped should cost more"


def test_block_size_cost(setup):
    """The same measured allocation and refit with smaller square blocks: what 16 x 16 and 8 x 8
    tiles (more index entries and kernel loop steps per byte) buy back in perplexity."""
    from edgesdk.compress import sparsify
    from edgesdk.compress.measure import heldout_perplexity

    model, ids, batches, hessians = setup
    dense = heldout_perplexity(model, ids, 512)
    print(f"\ndense {dense:.3f}\n{'block':>6}{'density':>9}{'perplexity':>12}{'vs dense':>10}")
    for block in (32, 16, 8):
        wanda = sparsify.block_importance(model, batches, sparsify.SparsifyConfig(importance="wanda"), block)
        costs = sparsify.weight_sensitivity(model, wanda, batches[:1], block, 0.3)
        sizes = {n: s.numel() for n, s in wanda.items()}
        for density in (0.95, 0.9):
            densities = sparsify.allocate_densities(costs, sizes, sparsify.SparsifyConfig(density=density))
            masks = sparsify.plan_masks_by_density(wanda, densities)
            copy_ = copy.deepcopy(model)
            copy_.config.edgesdk_sparsity = {"block": block,
                                             "masks": {n: sparsify.encode_mask(m) for n, m in masks.items()}}
            sparsify.reconstruct(copy_, masks, hessians, block)
            sparsify.apply_masks(copy_)
            value = heldout_perplexity(copy_, ids, 512)
            print(f"{block:>6}{density:>9.2f}{value:>12.3f}{value / dense - 1:>+10.1%}", flush=True)
