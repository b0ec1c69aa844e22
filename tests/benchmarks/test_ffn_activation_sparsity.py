"""How far neuron-level FFN sparsity gets SmolLM2-135M toward #4's target, with the backbone frozen.

Skipping whole FFN blocks per token costs too much on this model (test_ffn_skip_oracle.py). The
finer choice skips single neurons of the SwiGLU FFN ``down(silu(gate(h)) * up(h))`` per token,
reading only the weight rows of the neurons kept, with per-layer thresholds calibrated on text and
no training:

- CATS (Lee et al. 2024, arXiv 2404.08763): zero the neurons whose ``|silu(gate(h))|`` is below
  the layer's threshold. The gate projection is still computed in full, so a sparsity s saves
  2s/3 of the FFN's weight reads (the up and down rows of the neurons zeroed).
- TEAL (Liu et al. 2024, arXiv 2408.14690): threshold the input of every FFN matmul by magnitude,
  ``h`` before gate and up and ``silu(gate(h)) * up(h)`` before down, each at sparsity s; that
  saves the fraction s of the FFN's weight reads.

Thresholds are the s-quantiles of the magnitudes the dense model produces on WikiText-2 text past
the first 200k characters (as the build's training text), 2,048 tokens; perplexity on the first
2,048 tokens of WikiText-2 valid, windows of 512 (as test_ffn_skip_oracle.py). The FFNs hold 59 %
of the power recipe's weight bytes, so 1.25x decode needs about a third of the FFN's weight reads
saved (test_ffn_skip_oracle.py's docstring): s = 0.5 for CATS, s = 0.35 for TEAL, and more where
a gathered read is slower than a dense one.

    python -m pytest tests/benchmarks/test_ffn_activation_sparsity.py -m benchmark -s
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.benchmark
torch = pytest.importorskip("torch")

WIKITEXT = Path(__file__).resolve().parents[3] / "shared" / "data" / "wikitext-2-raw" / "wiki.valid.raw"
TOKENS, WINDOW = 2048, 512
SPARSITIES = (0.3, 0.4, 0.5, 0.6)
SAMPLE_STRIDE = 5  # every 5th magnitude is kept for the quantiles (torch.quantile takes at most 2**24 values)


class SparseFfns:
    """Replaces each layer's MLP forward with one that runs dense (:attr:`method` "dense", recording magnitudes
    while :attr:`recording`) or zeroes the neurons below the layer's thresholds ("cats" or "teal")."""

    def __init__(self, model):
        self.method, self.recording = "dense", False
        self.thresholds: dict[tuple[str, int], float] = {}
        self.samples: dict[tuple[str, int], list[torch.Tensor]] = {}
        for index, layer in enumerate(model.model.layers):
            layer.mlp.forward = self._forward(index, layer.mlp)

    def _record(self, key: tuple[str, int], values: torch.Tensor) -> None:
        self.samples.setdefault(key, []).append(values.abs().flatten()[::SAMPLE_STRIDE].float())

    def _forward(self, index: int, mlp):
        silu = torch.nn.functional.silu

        def forward(h: torch.Tensor) -> torch.Tensor:  # h: (B, T, hidden)
            if self.method == "dense":
                active = silu(mlp.gate_proj(h))  # (B, T, intermediate)
                product = active * mlp.up_proj(h)
                if self.recording:
                    self._record(("gate", index), active)
                    self._record(("input", index), h)
                    self._record(("product", index), product)
                return mlp.down_proj(product)
            if self.method == "cats":
                active = silu(mlp.gate_proj(h))
                active = active * (active.abs() >= self.thresholds[("gate", index)])
                return mlp.down_proj(active * mlp.up_proj(h))
            h = h * (h.abs() >= self.thresholds[("input", index)])
            product = silu(mlp.gate_proj(h)) * mlp.up_proj(h)
            product = product * (product.abs() >= self.thresholds[("product", index)])
            return mlp.down_proj(product)

        return forward

    def calibrate(self, sparsity: float) -> None:
        self.thresholds = {key: float(torch.quantile(torch.cat(parts), sparsity))
                           for key, parts in self.samples.items()}


def test_activation_sparsity_against_the_dense_model():
    if not WIKITEXT.is_file():
        pytest.skip("WikiText-2 validation text not found beside the checkout")
    from edgesdk.compress.measure import heldout_perplexity
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    loaded = load_model(resolve_model("smollm2-135m"))
    model, tokenizer = loaded.model.eval(), loaded.tokenizer
    text = WIKITEXT.read_text(encoding="utf-8")
    heldout = torch.tensor(tokenizer(text[:40_000])["input_ids"][:TOKENS])
    calibration = torch.tensor(tokenizer(text[200_000:260_000])["input_ids"][:TOKENS])
    sparse = SparseFfns(model)
    with torch.inference_mode():
        sparse.recording = True
        for row in calibration.reshape(-1, WINDOW):  # (windows, WINDOW)
            model(row[None])
        sparse.recording = False
        dense = heldout_perplexity(model, heldout, WINDOW)
        print(f"\ndense perplexity {dense:.3f}")
        rows = {}
        for sparsity in SPARSITIES:
            sparse.calibrate(sparsity)
            for method, saved in (("cats", 2 * sparsity / 3), ("teal", sparsity)):
                sparse.method = method
                rows[method, sparsity] = heldout_perplexity(model, heldout, WINDOW)
                print(f"{method} sparsity {sparsity:.0%}: FFN reads saved {saved:.0%}, perplexity "
                      f"{rows[method, sparsity]:.3f} ({rows[method, sparsity] / dense - 1:+.1%})")
    assert all(value > dense * 0.99 for value in rows.values())  # zeroing neurons never helps by more than noise
