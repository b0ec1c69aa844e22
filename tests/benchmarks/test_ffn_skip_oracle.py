"""How much per-token FFN skipping SmolLM2-135M tolerates, with an oracle choosing the skips.

Power gating (seed 000) skips a layer's FFN for a token when its gate is low. A gate sees only
the FFN's input; this oracle sees the FFN's output and skips the (token, layer) pairs whose
output is smallest against the residual stream it is added to, ||FFN(h)|| / ||x||, under one
global threshold (the quantile of the ratios of the unskipped model). The backbone is frozen,
as in the power stage. Perplexity on the first 2,048 tokens of WikiText-2 valid, windows of 512,
every skip applied inside the forward so later tokens attend to the changed states.

Reading the result against #4's target (>= 1.25x decode at <= +5 % perplexity): in the power
recipe's float32 graph the FFNs hold 59 % of the weight bytes, so 1.25x needs about a third of
the FFN blocks skipped (0.2 / 0.59) even if a step were all weight reads; in an int4 graph, where
skipping every FFN measured 1.5-1.7x (reference/feasibility-ort.md), about half.

A second test gives a skipped FFN a stand-in instead of nothing: a linear map of the MLP's input,
fitted per layer by least squares to the FFN's output on other WikiText text (past the first 200k
characters, as the build's training text), at rank 64 (2.8 % of the FFN's weights) or full rank
576 (12.5 %), reduced-rank as in Izenman 1975 (the fitted outputs projected on their leading
singular directions). The oracle then skips the pairs whose output the stand-in misses least,
||FFN(h) - S(h)|| / ||x||, and adds S(h) in their place.

    python -m pytest tests/benchmarks/test_ffn_skip_oracle.py -m benchmark -s
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.benchmark
torch = pytest.importorskip("torch")

WIKITEXT = Path(__file__).resolve().parents[3] / "shared" / "data" / "wikitext-2-raw" / "wiki.valid.raw"
TOKENS, WINDOW = 2048, 512
QUANTILES = (0.05, 0.1, 0.2, 0.35, 0.5)
FIT_TOKENS = 16_384
STAND_IN_RANKS = (64, 576)


class NormRatioOracle:
    """Forward hooks on every MLP: record ||FFN(h) - S(h)|| / ||x|| per token, or put the stand-in S(h) in place
    of the FFN output of the tokens whose ratio is under the threshold (the first token, the attention sink,
    always runs). Without stand-ins S is zero: the ratio is ||FFN(h)|| / ||x|| and a skipped FFN adds nothing.
    With ``calibrating`` set, each MLP's input and output are kept for :func:`fit_stand_ins` instead."""

    def __init__(self, layers):
        self.threshold: float | None = None
        self.stand_ins: dict[int, torch.Tensor] = {}  # layer -> (hidden + 1, hidden): h @ W[:-1] + W[-1]
        self.calibrating = False
        self.pairs: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.ratios: list[torch.Tensor] = []
        self.skipped = self.total = 0
        self._residual: torch.Tensor | None = None
        for index, layer in enumerate(layers):
            # The MLP's own input is the normed h; the residual x it is added to enters the norm before it.
            layer.post_attention_layernorm.register_forward_hook(self._keep_residual)
            layer.mlp.register_forward_hook(lambda module, args, out, index=index: self._hook(index, args[0], out))

    def _keep_residual(self, module, args, out):
        self._residual = args[0]

    def _hook(self, index: int, h: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if self.calibrating:
            self.pairs.setdefault(index, []).append((h.flatten(0, 1), out.flatten(0, 1)))  # (B*S, hidden) each
            return out
        weights = self.stand_ins.get(index)
        stand_in = torch.zeros_like(out) if weights is None else h @ weights[:-1] + weights[-1]  # (B, S, hidden)
        ratio = (out - stand_in).norm(dim=-1) / self._residual.norm(dim=-1).clamp_min(1e-6)  # (B, S)
        if self.threshold is None:
            self.ratios.append(ratio.flatten())
            return out
        skip = ratio < self.threshold
        skip[:, 0] = False
        self.skipped += int(skip.sum())
        self.total += skip.numel()
        return torch.where(skip.unsqueeze(-1), stand_in, out)

    def measure(self, perplexity, quantiles=QUANTILES) -> list[tuple[float, float]]:
        """(share of FFN blocks skipped, perplexity) at each quantile of the unskipped model's ratios."""
        self.threshold, self.ratios = None, []
        perplexity()
        ratios = torch.cat(self.ratios)
        rows = []
        for quantile in quantiles:
            self.threshold = float(torch.quantile(ratios, quantile))
            self.skipped = self.total = 0
            value = perplexity()
            rows.append((self.skipped / self.total, value))
        self.threshold = None
        return rows


def fit_stand_ins(pairs: dict[int, list[tuple[torch.Tensor, torch.Tensor]]], rank: int) -> dict[int, torch.Tensor]:
    """Per layer the least-squares linear map (with a bias) from the MLP's input to its output, at ``rank``: the
    full fit's outputs projected on their ``rank`` leading right singular vectors (reduced-rank regression). A
    ridge of 1e-3 of the mean diagonal keeps the normal equations well posed."""
    maps = {}
    for index, chunks in pairs.items():
        inputs = torch.cat([h for h, _ in chunks]).double()  # (N, hidden)
        outputs = torch.cat([out for _, out in chunks]).double()  # (N, hidden)
        inputs = torch.cat([inputs, torch.ones(inputs.shape[0], 1, dtype=inputs.dtype)], dim=1)  # (N, hidden + 1)
        gram = inputs.T @ inputs
        gram += 1e-3 * gram.diagonal().mean() * torch.eye(gram.shape[0], dtype=gram.dtype)
        full = torch.linalg.solve(gram, inputs.T @ outputs)  # (hidden + 1, hidden)
        _, _, directions = torch.linalg.svd(inputs @ full, full_matrices=False)  # (hidden, hidden)
        leading = directions[:rank]  # (rank, hidden)
        maps[index] = (full @ leading.T @ leading).float()
    return maps


class Measured:
    """SmolLM2-135M loaded once for the module, its oracle hooks installed, the evaluated tokens and the dense
    perplexity; :meth:`perplexity` scores the tokens with whatever the oracle is set to."""

    def __init__(self):
        if not WIKITEXT.is_file():
            pytest.skip("WikiText-2 validation text not found beside the checkout")
        from edgesdk.models.loader import load_model
        from edgesdk.models.sources import resolve_model

        loaded = load_model(resolve_model("smollm2-135m"))
        self.model, self.tokenizer = loaded.model.eval(), loaded.tokenizer
        self.text = WIKITEXT.read_text(encoding="utf-8")
        self.ids = torch.tensor(self.tokenizer(self.text[:30_000])["input_ids"][:TOKENS])
        self.oracle = NormRatioOracle(self.model.model.layers)
        self.dense = self.perplexity()

    def perplexity(self) -> float:
        from edgesdk.compress.measure import heldout_perplexity

        with torch.inference_mode():
            return heldout_perplexity(self.model, self.ids, WINDOW)

    def rows(self, label: str, rows: list[tuple[float, float]]) -> None:
        for skipped, value in rows:
            print(f"{label:>14}   {skipped:17.1%}   {value:10.3f}   {value / self.dense - 1:+8.1%}")


@pytest.fixture(scope="module")
def smollm2() -> Measured:
    return Measured()


@pytest.fixture(scope="module")
def nothing_in_place(smollm2) -> list[tuple[float, float]]:
    """The oracle's (skipped, perplexity) rows with nothing in place of a skipped FFN, measured once."""
    smollm2.oracle.stand_ins = {}
    return smollm2.oracle.measure(smollm2.perplexity)


def test_oracle_ffn_skipping_cost(smollm2, nothing_in_place):
    print(f"\ndense perplexity {smollm2.dense:.3f} ({TOKENS} tokens)")
    print("FFN blocks skipped   perplexity   vs dense")
    smollm2.rows("nothing", nothing_in_place)
    assert all(value > smollm2.dense for _, value in nothing_in_place)  # removing FFN output never helped on average


def test_oracle_ffn_skipping_with_a_linear_stand_in(smollm2, nothing_in_place):
    model, oracle = smollm2.model, smollm2.oracle
    fit_ids = torch.tensor(smollm2.tokenizer(smollm2.text[200_000:330_000])["input_ids"][:FIT_TOKENS])
    oracle.calibrating = True
    with torch.inference_mode():
        for window in fit_ids.reshape(-1, WINDOW):  # (FIT_TOKENS / WINDOW, WINDOW)
            model(window[None])
    oracle.calibrating = False
    hidden = model.config.hidden_size
    ffn = 3 * hidden * model.config.intermediate_size
    print(f"\ndense perplexity {smollm2.dense:.3f} ({TOKENS} tokens; stand-ins fitted on {FIT_TOKENS} other tokens)")
    print("     stand-in   FFN blocks skipped   perplexity   vs dense")
    measured = {}
    try:
        for rank in STAND_IN_RANKS:
            oracle.stand_ins = fit_stand_ins(oracle.pairs, rank)
            measured[rank] = oracle.measure(smollm2.perplexity)
            weights = min(2 * hidden * rank, hidden * hidden)  # two factors, or the one square map at full rank
            smollm2.rows(f"rank {rank} ({weights / ffn:.1%})", measured[rank])
    finally:
        oracle.stand_ins, oracle.pairs = {}, {}
    smollm2.rows("nothing", nothing_in_place)
    # At its lowest threshold the full-rank stand-in costs less than skipping with nothing in place.
    assert measured[STAND_IN_RANKS[-1]][0][1] < nothing_in_place[0][1]
