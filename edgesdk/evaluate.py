"""Perplexity of a bundle through its runtime, and of the PyTorch source model for reference; KL
divergence between the two; a last-word accuracy task.

Non-overlapping windows (context 512, stride 512, as DESIGN.md fixes): each window is scored
from an empty cache, and every token but the window's first is predicted. The same windows and
the same token ids go through both paths, so the two numbers compare like for like.

A model whose tokenizer puts a BOS token in front of every text (Gemma, Llama 2) sees one at the
start of each window, as ``llama-perplexity`` gives it: the window's first token, never scored, is
replaced by BOS. Without it Gemma's perplexity is far off what it computes on the texts it is given
(always after BOS); for a tokenizer that adds none (SmolLM2, Qwen) nothing changes.

``method="llama-perplexity"`` follows llama.cpp's ``llama-perplexity`` instead (``perplexity()`` in
tools/perplexity/perplexity.cpp, formerly examples/perplexity), so that the figure is the one it prints
for the same model and text:

- the text is tokenized once with the tokenizer's special tokens, so a BOS leads it where the
  tokenizer adds one (``common_tokenize(ctx, text, true)``);
- fewer than 2 x n_ctx tokens are refused ("you need at least 2*n_ctx tokens");
- the tokens are cut into ``len(tokens) // n_ctx`` chunks of n_ctx: the tail that does not fill a
  chunk is dropped;
- each chunk is scored from an empty cache with its first token replaced by BOS where the
  vocabulary adds one (``llama_vocab_get_add_bos``);
- only the second half of each chunk is scored: with ``first = n_ctx / 2`` (integer division), the
  logits at positions first .. n_ctx - 2 predict tokens first + 1 .. n_ctx - 1, n_ctx - first - 1 tokens
  per chunk;
- the perplexity is exp of the mean negative log-likelihood over all scored tokens, and its uncertainty (its
  "Final estimate: PPL = X +/- Y") the perplexity times sqrt(var / (n - 1)), var the population variance of
  the n tokens' negative log-likelihoods (:class:`PerplexityResult`; given under either method).

``--kl-divergence`` in llama.cpp scores the same positions of the same chunks, and so does
:func:`divergence` under this method.

``ppl_stride=N`` under this method is ``llama-perplexity --ppl-stride N`` (``perplexity_v2`` in the same file), its
strided perplexity:

- the text tokenized and refused below 2 x n_ctx tokens as above;
- ``(len(tokens) - n_ctx + N - 1) // N`` windows of n_ctx tokens, started N apart (the last one ends before the
  text's end, whatever is left after it unscored); ``--chunks`` keeps the first of them;
- each window scored from an empty cache as its tokens are: ``perplexity_v2`` puts BOS in place of the window's
  first token only after the window was decoded, so the model never reads it (the text's own BOS leads the first);
- only the last N tokens of each window are scored, the first window's too: the logits at positions
  n_ctx - N - 1 .. n_ctx - 2 predict tokens n_ctx - N .. n_ctx - 1, N tokens a window.

Its n_ctx is the context llama-perplexity creates, not its ``-c``: ``max(1, -b / -c) * -c + N / 2`` tokens (-b is
2048 by default: -c 512 gives 2048 + N / 2, -c 4096 gives 4096 + N / 2), or more where llama.cpp rounds the context
up, logged as "Calculation chunk = ..."; pass that as ``context`` for its figure. It prints no uncertainty; the one
given here is computed as above. :func:`divergence` scores the same windows, which llama.cpp cannot
(``perplexity_v2`` writes no ``--kl-divergence-base`` file).
"""

from __future__ import annotations

import math
import re
import sys
import unicodedata
from dataclasses import dataclass

import numpy as np

from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.fim import leading_bos
from edgesdk.runtime.hooked_pass import hooked_pass
from edgesdk.runtime.logprobs import log_softmax

WINDOWS, LLAMA_PERPLEXITY = "windows", "llama-perplexity"
METHODS = (WINDOWS, LLAMA_PERPLEXITY)


@dataclass(frozen=True)
class PerplexityConfig:
    context: int = 512  # tokens per window (llama-perplexity: per chunk, its n_ctx)
    # window step; equal to context means non-overlapping windows, as DESIGN.md measures and llama-perplexity
    # chunks; None (the default): the context, whatever context is given
    stride: int | None = None
    max_chars: int | None = 200_000  # evaluate the first N characters of the text (DESIGN.md measure)
    method: str = WINDOWS  # or LLAMA_PERPLEXITY (module docstring)
    # the first N windows (chunks) only, as llama-perplexity's --chunks N ("max number of chunks to process"):
    # the text is still read and checked whole; None: all of them
    chunks: int | None = None
    # llama-perplexity's --ppl-stride N (LLAMA_PERPLEXITY only): windows of context tokens N apart, the last N of
    # each scored, no BOS put in (module docstring); None: its chunks
    ppl_stride: int | None = None

    def __post_init__(self):
        if self.chunks is not None and self.chunks < 1:
            raise ValueError(f"chunks {self.chunks} scores no window: pass 1 or more, or none to score them all")
        if self.ppl_stride is not None:
            self._check_ppl_stride()
        if self.stride is None:  # a fixed default of 512 overlapped the windows of a longer context and refused a
            object.__setattr__(self, "stride", self.context)  # shorter one, llama-perplexity's chunks too
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.method == LLAMA_PERPLEXITY:
            if self.context < 3 and self.ppl_stride is None:  # n_ctx - n_ctx/2 - 1 scored tokens a chunk: none below 3
                raise ValueError(f"llama-perplexity scores tokens n_ctx/2 + 1 .. n_ctx - 1 of each chunk, so it "
                                 f"needs context >= 3, got {self.context}; pass a context of 3 or more")
            if self.stride != self.context:
                raise ValueError(f"llama-perplexity cuts the text into chunks of context tokens, with no "
                                 f"stride; got stride {self.stride} for context {self.context}")
        elif self.context < 2:
            raise ValueError(f"context {self.context} is too short: a window's first token is read, not scored, so "
                             "a window needs at least 2 tokens; pass a context of 2 or more")
        elif not 1 <= self.stride <= self.context:
            raise ValueError(f"stride {self.stride} is outside 1 .. {self.context} (the context): a step longer than "
                             f"the window would skip the tokens between windows; pass a stride of 1 to {self.context}, "
                             "or none for non-overlapping windows")

    def _check_ppl_stride(self) -> None:
        """Refuse a ``ppl_stride`` outside llama-perplexity's rule, or one past what a window can score: with N >=
        n_ctx, ``perplexity_v2`` reads the logits before its window's first (out of its vector's bounds). A context
        too short for any stride (below 2 tokens) is named as such, not as a stride out of an empty range."""
        if self.method != LLAMA_PERPLEXITY:
            raise ValueError(f"ppl_stride {self.ppl_stride} is llama-perplexity's --ppl-stride, and method is "
                             f"{self.method!r}: pass method {LLAMA_PERPLEXITY!r}, or a stride for windows")
        if self.context < 2:
            raise ValueError(f"context {self.context} is too short for ppl_stride {self.ppl_stride}: each window's "
                             "first token is read, not scored, so a window needs at least 2 tokens; pass a context "
                             f"of {max(2, self.ppl_stride + 1)} or more (ppl_stride + 1, ppl_stride at least 1)")
        if not 1 <= self.ppl_stride < self.context:
            raise ValueError(f"ppl_stride {self.ppl_stride} is outside 1 .. {self.context - 1}: each window of "
                             f"context {self.context} tokens scores its last ppl_stride tokens, and its first token "
                             f"is read, not scored; pass a ppl_stride of 1 to {self.context - 1}, or a larger context")


@dataclass(frozen=True)
class PerplexityResult:
    perplexity: float
    tokens_scored: int
    windows: int
    # llama-perplexity's "Final estimate: PPL = X +/- Y" (perplexity() in tools/perplexity/perplexity.cpp): the
    # perplexity times sqrt(var / (n - 1)), var the population variance of the n scored tokens' negative
    # log-likelihoods; None where var is not positive (one token), where llama-perplexity prints no estimate
    uncertainty: float | None = None
    # the perplexity over windows (chunks) 1 .. i after each window i, the running "[1]15.2,[2]16.9,..." values
    # llama-perplexity prints as its chunks finish; the last is the perplexity. Empty where not kept window by window
    running: tuple[float, ...] = ()

    def to_json(self) -> dict:
        """The figures as JSON; ``chunk_perplexities`` the running values, where kept: the perplexity over windows
        1 .. i after each window i, under either method (under llama-perplexity's rule its ``[i]`` values, under
        --method windows the same running figure over its windows)."""
        figures = {"perplexity": round(self.perplexity, 6),
                   "perplexity_uncertainty": None if self.uncertainty is None else round(self.uncertainty, 6),
                   "tokens_scored": self.tokens_scored, "windows": self.windows}
        if self.running:
            figures["chunk_perplexities"] = [round(value, 6) for value in self.running]
        return figures


def windows(ids: list[int], config: PerplexityConfig) -> list[tuple[int, int, int]]:
    """(start, end, first scored position within the window) for each window.

    With stride < context, the overlap is context already scored by the previous window. Under
    llama-perplexity's rule: ``len(ids) // context`` chunks, the tail dropped, each scored from
    position ``context // 2 + 1``; with ``config.ppl_stride`` N, windows N apart, each scored from position
    ``context - N`` (module docstring). ``config.chunks``: the first that many of them, as llama-perplexity's
    ``--chunks N`` keeps ``min(N, n_chunk_max)``.
    """
    return _all_windows(ids, config)[:config.chunks]


def _all_windows(ids: list[int], config: PerplexityConfig) -> list[tuple[int, int, int]]:
    """:func:`windows` before ``config.chunks`` keeps the first of them."""
    if config.ppl_stride is not None:  # perplexity_v2: n_chunk_max windows, each scoring its last ppl_stride tokens
        n, step = config.context, config.ppl_stride
        return [(i * step, i * step + n, n - step) for i in range((len(ids) - n + step - 1) // step)]
    if config.method == LLAMA_PERPLEXITY:
        n = config.context
        return [(i * n, (i + 1) * n, n // 2 + 1) for i in range(len(ids) // n)]
    spans, start, scored_until = [], 0, 1
    while start < len(ids) - 1:
        end = min(start + config.context, len(ids))
        spans.append((start, end, max(scored_until - start, 1)))
        scored_until = end
        if end == len(ids):
            break
        start += config.stride
    return spans


def _log_softmax_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The negative log-likelihood of each target, in float64. Where a row holds logits of +inf (a float16 engine's
    overflow) the window goes through :func:`log_softmax`, which takes the softmax's limit there, as
    :func:`divergence` takes it for its PPL(Q), where ``inf - inf`` would make the row's loss, and the perplexity, NaN."""
    logits = logits.astype(np.float64)
    rows = np.arange(len(targets))
    peak = logits.max(axis=-1, keepdims=True)  # (T, 1)
    if np.isposinf(peak).any():  # rare: the leaner sum below is kept for the windows that do not overflow
        return -log_softmax(logits)[rows, targets]
    log_z = peak[:, 0] + np.log(np.exp(logits - peak).sum(axis=-1))
    return log_z - logits[rows, targets]


def perplexity(score_window, ids: list[int], config: PerplexityConfig, progress: bool = False,
               label: str = "perplexity", bos_id: int | None = None, on_window=None) -> PerplexityResult:
    """Generic loop: ``score_window(window_ids) -> logits (len, vocab)`` for each window, whose first token is
    ``bos_id`` where one is given (module docstring). ``on_window(i, running)``, where given, is told each window's
    running perplexity as it finishes (1-based ``i``), as llama-perplexity prints ``[i]ppl`` then: minutes on a
    board are not silent, and a run cut short has said its figures so far."""
    from tqdm import tqdm

    spans, bos_id = _checked_windows(ids, config, "perplexity"), _window_bos(config, bos_id)
    losses, total, count, running = [], 0.0, 0, []
    for index, (start, end, first) in enumerate(tqdm(spans, desc=label, disable=not progress, unit="window"), 1):
        window = _window(ids, start, end, bos_id)
        logits = score_window(window)  # (T, V); row t predicts token t+1
        losses.append(_log_softmax_nll(logits[first - 1:-1], window[first:]))
        total, count = total + float(losses[-1].sum()), count + len(losses[-1])
        running.append(exp_or_inf(total / count))
        if on_window is not None:
            on_window(index, running[-1])
    return _perplexity_result(np.concatenate(losses), len(spans), tuple(running))


def _perplexity_result(nll: np.ndarray, windows: int, running: tuple[float, ...] = ()) -> PerplexityResult:
    """The perplexity of the scored tokens' negative log-likelihoods ``nll``, and its uncertainty as
    llama-perplexity gives it (:class:`PerplexityResult`); ``running``: the running values, where kept."""
    count, ppl = len(nll), exp_or_inf(float(nll.mean()))
    variance = float(nll.var())  # llama-perplexity: nll2 / count - (nll / count)^2, an estimate only where > 0
    uncertainty = ppl * math.sqrt(variance / (count - 1)) if variance > 0 and count > 1 else None
    return PerplexityResult(ppl, count, windows, uncertainty, running)


def _checked_windows(ids: list[int], config: PerplexityConfig, measure: str,
                     cut: bool | None = None) -> list[tuple[int, int, int]]:
    """:func:`windows`, after refusing a text too short for ``measure`` under ``config.method``. ``cut``: whether
    ``config.max_chars`` cut the text (None: not known here); the fix offers a higher --max-chars only where it
    may give more tokens, not where the whole text was read (--max-chars 0, or a text shorter than it)."""
    more = "raise --max-chars (0 scores the whole file)" if cut is not False else None
    if config.method == LLAMA_PERPLEXITY and len(ids) < 2 * config.context:
        raise EdgeSDKError(f"the text gives {len(ids)} token(s); llama-perplexity's rule needs at least 2 x the "
                           f"context, {2 * config.context} tokens, for --context {config.context} (llama-perplexity "
                           "refuses fewer)", ", ".join(["pass a longer --text file", *([more] if more else [])])
                           + " or lower --context")
    if len(ids) < 2:
        raise EdgeSDKError(f"the text gives {len(ids)} token(s); {measure} needs at least 2",
                           "pass a longer --text file" + (f", or {more}" if more else ""))
    return windows(ids, config)


def _text_ids(ids: list[int], text: str, config: PerplexityConfig, measure: str) -> list[int]:
    """``ids``, the tokens of ``text`` as ``config`` keeps it, after refusing them where too few for ``measure``
    (:func:`_checked_windows`, told whether --max-chars cut the text)."""
    _checked_windows(ids, config, measure, cut=bool(config.max_chars) and len(text) > config.max_chars)
    return ids


def _window_bos(config: PerplexityConfig, bos_id: int | None) -> int | None:
    """The token put in place of each window's first: ``bos_id``, but none under ``config.ppl_stride``, where
    llama-perplexity's ``perplexity_v2`` puts BOS there only after the window was decoded (module docstring)."""
    return None if config.ppl_stride is not None else bos_id


def _window(ids: list[int], start: int, end: int, bos_id: int | None) -> np.ndarray:
    """``ids[start:end]`` as int64, its first token (context, never a target) replaced by ``bos_id`` when given."""
    window = np.asarray(ids[start:end], np.int64)
    if bos_id is not None:
        window[0] = bos_id
    return window


def exp_or_inf(mean_nll: float) -> float:
    """exp, with inf past the float range (a mean loss over 709.8 nats) where math.exp raises."""
    return math.inf if mean_nll > math.log(sys.float_info.max) else math.exp(mean_nll)  # NaN stays NaN


def backend_record(runtime) -> dict:
    """``eval --json``'s record of the backend its figures came from: ``backend``, the one that ran them, and
    ``backend_reasons``, each backend tried before it (the bundle's runtime chain, or --backend) with why it did not
    open, as :func:`edgesdk.runtime.session.open_runtime` kept them on the runtime ({} where the first one opened). A
    figure of ort-cpu in place of a Jetson bundle's tensorrt is the CPU's, not the board's."""
    return {"backend": runtime.backend.name, "backend_reasons": dict(runtime.backend_reasons)}


def bundle_perplexity(runtime, text: str, config: PerplexityConfig = PerplexityConfig(),
                      progress: bool = False, hook=None, on_window=None) -> PerplexityResult:
    """Perplexity through the bundle's own runtime backend; ``hook`` (a
    :class:`~edgesdk.runtime.generate.StepHook`: the thermal guard's) steps each window (:func:`bundle_scorer`) and is
    told the measurement's end after the last, or after the window that failed; ``on_window`` as
    :func:`perplexity` takes it."""
    try:
        return perplexity(bundle_scorer(runtime, hook), _scored_ids(runtime, text, config), config, progress,
                          bos_id=leading_bos(runtime.tokenizer), on_window=on_window)
    finally:
        if hook is not None:
            hook.end(None)  # as an answer cut short ends: a clock the guard capped is given back


def reference_perplexity(model, tokenizer_encode, text: str, config: PerplexityConfig = PerplexityConfig(),
                         progress: bool = False, bos_id: int | None = None) -> PerplexityResult:
    """The same measure with the PyTorch model (host only); ``bos_id`` as the bundle's (:func:`leading_bos`).
    ``tokenizer_encode`` adds no special tokens: under llama-perplexity's rule ``bos_id`` leads the text, as
    :func:`bundle_perplexity` puts it."""
    ids = _lead(tokenizer_encode(text[: config.max_chars] if config.max_chars else text), config, bos_id)
    ids = _text_ids(ids, text, config, "perplexity")
    return perplexity(reference_scorer(model), ids, config, progress, bos_id=bos_id)


@dataclass(frozen=True)
class DivergenceResult:
    """How far the bundle's next-token distributions are from the reference model's, token by token.

    The statistics llama.cpp's ``llama-perplexity --kl-divergence`` prints (``kl_divergence()`` in
    tools/perplexity/perplexity.cpp), the bundle in the place of its Q and the reference model in that of
    its base, computed as it computes them, over the positions :func:`perplexity` scores (llama.cpp's own
    under ``method="llama-perplexity"``):

    - per scored token: the negative log-likelihood of the text's next token under each model, the KL
      divergence KL(P_reference || P_bundle) = sum_i p_i (ln p_i - ln q_i) (nats; a token the reference
      gives probability 0 adds nothing, as 0 ln 0 = 0), Δp = q(token) - p(token), and whether both put the
      same token on top;
    - a mean's uncertainty is llama.cpp's ``mean_and_uncertainty``: sqrt(var / (n - 1)) with var the
      population variance, 0 for n <= 10; the covariance of the two models' losses is
      cov(a, b) / (n - 1), 0 for n < 10;
    - PPL(Q)/PPL(base) = exp(mean ln(PPL(Q)/PPL(base))), the uncertainty of the log ratio
      sqrt(s_Q^2 + s_base^2 - 2 cov) and that of an exp(x) its value times x's;
    - RMS Δp = sqrt(mean Δp^2), its uncertainty 0.5 / RMS times that of mean Δp^2;
    - same top token: the fraction n_same / n, its uncertainty sqrt(f (1 - f) / (n - 1));
    - percentiles interpolate linearly between sorted values at fraction x (n - 1) (numpy's default).

    KL divergence and ln ratios are in nats; Δp, its RMS and the same-top fraction are fractions (llama.cpp
    prints them x 100, as percent). llama.cpp reads the base model's log-probabilities from its
    ``--kl-divergence-base`` file, stored as 16-bit steps over the top 16 nats, and leaves out of the KL sum
    the tokens below e^-16 there; here both distributions are taken whole in float64, so its figures can
    differ slightly from these.
    """

    mean_kld: float
    median_kld: float
    p99_kld: float
    max_kld: float
    same_top_token: float  # fraction of scored tokens where both models' most likely token agrees
    tokens_scored: int
    mean_kld_uncertainty: float
    min_kld: float
    kld_percentiles: dict  # "99.9" .. "0.1" -> KL divergence at that percentile (llama.cpp's list)
    same_top_token_uncertainty: float
    ppl: float  # llama.cpp's Mean PPL(Q): the bundle's perplexity over the scored tokens
    ppl_uncertainty: float
    ppl_reference: float  # Mean PPL(base)
    ppl_reference_uncertainty: float
    ppl_correlation: float  # Cor(ln(PPL(Q)), ln(PPL(base))), a fraction
    ln_ppl_ratio: float  # Mean ln(PPL(Q)/PPL(base))
    ln_ppl_ratio_uncertainty: float
    ppl_ratio: float  # Mean PPL(Q)/PPL(base)
    ppl_ratio_uncertainty: float
    ppl_difference: float  # Mean PPL(Q)-PPL(base)
    ppl_difference_uncertainty: float
    mean_dp: float  # mean of q(token) - p(token)
    mean_dp_uncertainty: float
    dp_percentiles: dict  # "max", "99.9" .. "0.1", "min" -> Δp (llama.cpp's list; "50.0" is the median)
    rms_dp: float
    rms_dp_uncertainty: float

    def to_json(self) -> dict:
        def r(value: float) -> float:
            return round(value, 6)

        return {"mean_kld": r(self.mean_kld), "median_kld": r(self.median_kld),
                "p99_kld": r(self.p99_kld), "max_kld": r(self.max_kld),
                "same_top_token": r(self.same_top_token), "tokens_scored": self.tokens_scored,
                "mean_kld_uncertainty": r(self.mean_kld_uncertainty), "min_kld": r(self.min_kld),
                "kld_percentiles": {key: r(value) for key, value in self.kld_percentiles.items()},
                "same_top_token_uncertainty": r(self.same_top_token_uncertainty),
                "ppl": r(self.ppl), "ppl_uncertainty": r(self.ppl_uncertainty),
                "ppl_reference": r(self.ppl_reference), "ppl_reference_uncertainty": r(self.ppl_reference_uncertainty),
                "ppl_correlation": r(self.ppl_correlation),
                "ln_ppl_ratio": r(self.ln_ppl_ratio), "ln_ppl_ratio_uncertainty": r(self.ln_ppl_ratio_uncertainty),
                "ppl_ratio": r(self.ppl_ratio), "ppl_ratio_uncertainty": r(self.ppl_ratio_uncertainty),
                "ppl_difference": r(self.ppl_difference),
                "ppl_difference_uncertainty": r(self.ppl_difference_uncertainty),
                "mean_dp": r(self.mean_dp), "mean_dp_uncertainty": r(self.mean_dp_uncertainty),
                "dp_percentiles": {key: r(value) for key, value in self.dp_percentiles.items()},
                "rms_dp": r(self.rms_dp), "rms_dp_uncertainty": r(self.rms_dp_uncertainty)}


KLD_PERCENTILES = (99.9, 99.0, 95.0, 90.0, 10.0, 5.0, 1.0, 0.1)  # llama-perplexity's, beside max, median, min
DP_PERCENTILES = (99.9, 99.0, 95.0, 90.0, 75.0, 50.0, 25.0, 10.0, 5.0, 1.0, 0.1)


def _mean_and_uncertainty(values: np.ndarray) -> tuple[float, float]:
    """llama.cpp's ``mean_and_uncertainty``: the mean and sqrt(var / (n - 1)), 0 where n <= 10."""
    mean = float(values.mean())
    variance = float(values.var())
    return mean, math.sqrt(variance / (len(values) - 1)) if variance > 0 and len(values) > 10 else 0.0


def _covariance(a: np.ndarray, b: np.ndarray) -> float:
    """llama.cpp's ``covariance`` of two means: cov(a, b) / (n - 1), 0 where n < 10."""
    return float(((a - a.mean()) * (b - b.mean())).mean()) / (len(a) - 1) if len(a) >= 10 else 0.0


def divergence(score_bundle, score_reference, ids: list[int], config: PerplexityConfig,
               progress: bool = False, bos_id: int | None = None) -> DivergenceResult:
    """KL(P_reference || P_bundle) and the other statistics of :class:`DivergenceResult` over the positions
    :func:`perplexity` scores, window by window.

    Each ``score_*(window_ids) -> logits (len, vocab)``; the vocabularies must match (the bundle keeps
    its source model's tokenizer)."""
    from tqdm import tqdm

    figures = []
    spans, bos_id = _checked_windows(ids, config, "a divergence"), _window_bos(config, bos_id)
    for start, end, first in tqdm(spans, desc="divergence", disable=not progress, unit="window"):
        window = _window(ids, start, end, bos_id)
        ours = score_bundle(window)[first - 1:-1]  # (T, V): row t predicts token t+1
        theirs = score_reference(window)[first - 1:-1]
        if ours.shape != theirs.shape:
            _rows_divergence(ours, theirs, window[first:])  # refused, naming both shapes
        figures.append(_window_divergence(ours, lambda rows, theirs=theirs: theirs[rows], window[first:]))
    return _divergence_result(*(np.concatenate(parts) for parts in zip(*figures, strict=True)))


DIVERGENCE_BLOCK = 32  # rows of a window compared at once: a few float64 (rows, V) arrays, not (context, V)


def _window_divergence(ours: np.ndarray, theirs, targets: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per scored position of one window, from the bundle's logits ``ours`` (T, V) and the reference's, ``theirs(rows)
    -> (len(rows), V)`` for a slice of rows: KL(P_reference || P_bundle), each model's negative log-likelihood of
    ``targets``, and whether both put the same token on top. Taken :data:`DIVERGENCE_BLOCK` rows at a time, so that
    the float64 copies of the comparison take O(block x V), not O(T x V): a window of 511 positions over Gemma 3's
    262,144 tokens would need gigabytes (each row's figures are its own, so the blocks change no result)."""
    figures, block = [], DIVERGENCE_BLOCK
    for begin in range(0, len(ours), block):
        rows = slice(begin, min(begin + block, len(ours)))
        figures.append(_rows_divergence(ours[rows], theirs(rows), targets[rows]))
    if not figures:
        return _rows_divergence(ours, theirs(slice(0, 0)), targets)
    return tuple(np.concatenate(parts) for parts in zip(*figures, strict=True))


def _rows_divergence(ours: np.ndarray, theirs: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, ...]:
    """:func:`_window_divergence`'s figures for rows ``ours`` and ``theirs`` (T, V) both at hand."""
    if ours.shape != theirs.shape:
        raise EdgeSDKError(f"the bundle gives logits of shape {ours.shape} and the reference {theirs.shape}",
                           "compare a bundle with the model it was built from (eval --reference)")
    log_p, log_q = log_softmax(theirs), log_softmax(ours)
    p = np.exp(log_p)
    with np.errstate(invalid="ignore"):  # 0 * (-inf - ln q): a token the reference rules out adds 0
        kld = np.where(p == 0, 0.0, p * (log_p - log_q)).sum(axis=-1)  # (T,); NaN stays NaN
    rows = np.arange(len(ours))
    return kld, -log_q[rows, targets], -log_p[rows, targets], ours.argmax(axis=-1) == theirs.argmax(axis=-1)


def _divergence_result(klds: np.ndarray, nll: np.ndarray, nll_reference: np.ndarray,
                       same: np.ndarray) -> DivergenceResult:
    """:class:`DivergenceResult`'s statistics from the per-token figures, whether the reference's distributions came
    from the PyTorch model (:func:`divergence`) or from a ``--kl-divergence-base`` file (:func:`base_divergence`)."""
    values = np.maximum(klds, 0.0)  # rounding can leave -1e-16 where the two agree
    n = len(values)

    mean_kld, mean_kld_unc = _mean_and_uncertainty(values)
    log_ppl, log_ppl_unc = _mean_and_uncertainty(nll)
    log_ref, log_ref_unc = _mean_and_uncertainty(nll_reference)
    cov = _covariance(nll, nll_reference)
    ppl, ppl_ref = exp_or_inf(log_ppl), exp_or_inf(log_ref)
    ppl_unc, ppl_ref_unc = ppl * log_ppl_unc, ppl_ref * log_ref_unc
    with np.errstate(divide="ignore", invalid="ignore"):  # no spread in one model's losses: no correlation
        correlation = float(np.float64(cov) / (log_ppl_unc * log_ref_unc))
    ln_ratio = log_ppl - log_ref
    ln_ratio_unc = math.sqrt(max(log_ppl_unc ** 2 + log_ref_unc ** 2 - 2 * cov, 0.0))
    ratio = exp_or_inf(ln_ratio)
    difference_unc = math.sqrt(max(ppl_unc ** 2 + ppl_ref_unc ** 2 - 2 * ppl * ppl_ref * cov, 0.0))

    dp = np.exp(-nll) - np.exp(-nll_reference)
    mean_dp, mean_dp_unc = _mean_and_uncertainty(dp)
    mse, mse_unc = _mean_and_uncertainty(dp ** 2)
    rms = math.sqrt(mse)
    same_top = float(same.mean())
    same_top_unc = math.sqrt(same_top * (1 - same_top) / (n - 1)) if n > 1 else math.nan
    return DivergenceResult(
        mean_kld=mean_kld, median_kld=float(np.median(values)), p99_kld=float(np.percentile(values, 99)),
        max_kld=float(values.max()), same_top_token=same_top, tokens_scored=n,
        mean_kld_uncertainty=mean_kld_unc, min_kld=float(values.min()),
        kld_percentiles={f"{q:.1f}": float(np.percentile(values, q)) for q in KLD_PERCENTILES},
        same_top_token_uncertainty=same_top_unc,
        ppl=ppl, ppl_uncertainty=ppl_unc, ppl_reference=ppl_ref, ppl_reference_uncertainty=ppl_ref_unc,
        ppl_correlation=correlation, ln_ppl_ratio=ln_ratio, ln_ppl_ratio_uncertainty=ln_ratio_unc,
        ppl_ratio=ratio, ppl_ratio_uncertainty=ratio * ln_ratio_unc,
        ppl_difference=ppl - ppl_ref, ppl_difference_uncertainty=difference_unc,
        mean_dp=mean_dp, mean_dp_uncertainty=mean_dp_unc,
        dp_percentiles={"max": float(dp.max()), **{f"{q:.1f}": float(np.percentile(dp, q)) for q in DP_PERCENTILES},
                        "min": float(dp.min())},
        rms_dp=rms, rms_dp_uncertainty=0.5 / rms * mse_unc if rms > 0 else 0.0)


def bundle_divergence(runtime, model, text: str, config: PerplexityConfig = PerplexityConfig(),
                      progress: bool = False) -> DivergenceResult:
    """:func:`divergence` of the bundle from its PyTorch source ``model`` over the same token ids and
    windows as :func:`bundle_perplexity` (host only)."""
    return divergence(bundle_scorer(runtime), reference_scorer(model), _scored_ids(runtime, text, config, "a divergence"),
                      config, progress, bos_id=leading_bos(runtime.tokenizer))


# --- --kl-divergence-base: the source model's distributions written on the host, read on a board -------------------
#
# llama-perplexity's two runs (tools/perplexity/perplexity.cpp): the base model with --kl-divergence-base FNAME writes
# its log-probabilities to FNAME, the quantized model with --kl-divergence-base FNAME --kl-divergence reads them back
# and prints the KL statistics. llama.cpp keeps the whole vocabulary of every scored token, 16-bit steps: for
# SmolLM2's 49,152 tokens 96 kB a token, gigabytes for a WikiText run; and the most likely tokens alone do not do
# (SmolLM2 needs 38,000 of its 49,152 on average to hold all but 1e-6 of a position's probability). A position's
# logits are its last hidden state (what the output layer reads, hidden_size floats) times the output layer, so the
# file keeps those instead: each scored position's hidden state in float32 (2.3 kB for SmolLM2's 576) and the output
# layer once (its weight, and bias where it has one, float32), checked on the host to give back the model's own
# logits. The board multiplies them out again: the source model's distributions whole, to float32 rounding.
KL_BASE_FORMAT, KL_BASE_VERSION = "edgesdk-kl-divergence-base", 1
KL_BASE_ARRAYS = ("header", "tokens", "hidden", "head", "head_bias")
# the scoring settings a file is written with, and the eval options that set them; a read under others is refused
KL_BASE_OPTIONS = {"method": "--method", "context": "--context", "stride": "--stride", "chunks": "--chunks",
                   "ppl_stride": "--ppl-stride", "max_chars": "--max-chars"}
KL_BASE_LOGIT_TOLERANCE = 1e-3  # of the largest logit's size: the logits given back differ by float32 rounding only


@dataclass(frozen=True)
class DivergenceBase:
    """A ``--kl-divergence-base`` file as :func:`read_divergence_base` found it, checked whole: ``header`` its JSON
    record (settings, tokenizer, bundle, source model), the arrays of the layout above."""

    path: str
    header: dict
    tokens: np.ndarray  # (N,) the token ids scored, BOS included where the method puts one in front
    hidden: np.ndarray  # (S, H) float32, the hidden state the output layer reads at each scored position
    head: np.ndarray  # (V, H) float32, the output layer's weight
    head_bias: np.ndarray  # (V,) float32, its bias, or (0,) where it has none

    def logits(self, rows: slice) -> np.ndarray:
        """The source model's logits at scored positions ``rows``, (T, V) float32."""
        logits = self.hidden[rows] @ self.head.T
        return logits + self.head_bias if len(self.head_bias) else logits


def kl_base_settings(config: PerplexityConfig) -> dict:
    """The settings that decide which positions are scored, as a ``--kl-divergence-base`` file records them."""
    return {"method": config.method, "context": config.context, "stride": config.stride,
            "chunks": config.chunks, "ppl_stride": config.ppl_stride, "max_chars": config.max_chars}


def _option_value(key: str, value) -> str:
    """A recorded setting as eval's option takes it (None: -1 chunks, 0 characters, no --ppl-stride)."""
    if value is None:
        return {"chunks": "-1", "max_chars": "0", "ppl_stride": "0", "stride": "(--context)"}[key]
    return str(value)


def tokenizer_identity(runtime) -> str:
    """The sha256 of the bundle's tokenizer file, as its manifest records it: the same for every bundle built from
    one source model, another for another tokenizer, whose token ids a file's would not match."""
    manifest = runtime.bundle.manifest
    return manifest["files"][manifest["tokenizer"]["file"]]["sha256"]


def write_divergence_base(score_hidden, head: np.ndarray, head_bias: np.ndarray | None, ids: list[int],
                          config: PerplexityConfig, path, header: dict, progress: bool = False,
                          bos_id: int | None = None) -> tuple[PerplexityResult, int]:
    """The reference's distributions over the positions :func:`perplexity` scores, written to ``path`` (the layout
    above; host only): ``score_hidden(window) -> (logits (T, V), hidden (T, H))``, the hidden states the output layer
    ``head`` (V, H) and ``head_bias`` read. Each window's logits are checked to be given back by them, so that a
    model whose logits are more than its output layer's (a final soft cap) is refused, not written wrong. Returns the
    reference's perplexity from the same pass and the positions written. Written beside ``path`` and moved over it at
    the end, so that a run cut short leaves no half file under its name."""
    import json
    import os
    from pathlib import Path

    from tqdm import tqdm

    spans, window_bos = _checked_windows(ids, config, "a divergence"), _window_bos(config, bos_id)
    path = Path(path)
    partial = check_divergence_base_writable(path)  # before the minutes of scoring, not after
    head = np.ascontiguousarray(head, np.float32)
    bias = np.zeros(0, np.float32) if head_bias is None else np.asarray(head_bias, np.float32)
    hidden, losses = [], []
    for start, end, first in tqdm(spans, desc="kl-divergence-base", disable=not progress, unit="window"):
        window = _window(ids, start, end, window_bos)
        logits, states = score_hidden(window)
        logits, states = logits[first - 1:-1], np.asarray(states[first - 1:-1], np.float32)
        given = states @ head.T + bias if len(bias) else states @ head.T
        scale = max(1.0, float(np.abs(logits).max()))
        if given.shape != logits.shape or not np.abs(given - logits).max() <= KL_BASE_LOGIT_TOLERANCE * scale:
            raise EdgeSDKError("the source model's logits are not its last hidden state times its output layer (a "
                               "final soft cap or scaling after it), so --kl-divergence-base cannot keep them so",
                               "compare on the host with --reference --kl-divergence instead")
        hidden.append(states)
        losses.append(_log_softmax_nll(logits, window[first:]))
    header = {"format": KL_BASE_FORMAT, "version": KL_BASE_VERSION, **header, "settings": kl_base_settings(config),
              "vocab_size": head.shape[0]}
    arrays = {"header": np.frombuffer(json.dumps(header, sort_keys=True).encode(), np.uint8),
              "tokens": np.asarray(ids, np.int64), "hidden": np.concatenate(hidden), "head": head, "head_bias": bias}
    try:
        with open(partial, "wb") as handle:  # a file object: np.savez would add .npz to a name without it
            np.savez(handle, **arrays)
        os.replace(partial, path)
    except OSError as exc:  # a disk that fills up, a directory made read-only or removed while scoring
        raise _write_refusal(path, exc) from exc
    finally:
        try:
            partial.unlink(missing_ok=True)
        except OSError:
            pass  # where it could not be made, there is none to remove
    return _perplexity_result(np.concatenate(losses), len(spans)), len(arrays["hidden"])


def check_divergence_base_writable(path, text=None, bundle=None):
    """The ``.partial`` file a ``--kl-divergence-base`` file is written to beside ``path``, created and removed
    again: a place that takes no file (a read-only directory, /proc) is refused before the minutes of scoring.

    Writing replaces whatever ``path`` names, so a path that is not a file this would be refused: the ``text`` file
    being scored (its text would be lost), a path inside the ``bundle`` directory (a file written there fails the
    bundle's verification), or any existing file that is not an earlier base file (:func:`_base_file_problem`)."""
    import os
    from pathlib import Path

    path = Path(path)
    fresh = "pass another path, e.g. " + _fresh_base_name(path)
    target = path.resolve()
    if text is not None and (target == Path(text).resolve() or _same_file(path, text)):
        raise EdgeSDKError(f"--kl-divergence-base {path} is the --text file {text}: writing the base there would "
                           "overwrite the text it scores", fresh)
    if bundle is not None and Path(bundle).is_dir() and target.is_relative_to(Path(bundle).resolve()):
        raise EdgeSDKError(f"--kl-divergence-base {path} is inside the bundle directory {bundle}: a file written "
                           "there replaces or adds to the bundle's files, which then fail its verification",
                           f"pass a path outside the bundle, e.g. {_fresh_base_name(path)}")
    if path.exists() or path.is_symlink():
        problem = _base_file_problem(path)
        if problem is not None:
            raise EdgeSDKError(f"--kl-divergence-base {path} exists and {problem}: writing would overwrite it (an "
                               "earlier base file is the only file it replaces)",
                               f"pass another path, or delete it first (e.g. {_fresh_base_name(path)})")
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        with open(partial, "wb"):
            pass
        partial.unlink()
    except OSError as exc:
        raise _write_refusal(path, exc) from exc
    return partial


def _same_file(a, b) -> bool:
    """Whether two paths name one file (a hard link or a second name for it); False where either is not there."""
    import os

    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _fresh_base_name(path) -> str:
    """A file name for a new ``--kl-divergence-base`` file, suggested where ``path`` cannot take one (a name only: the
    fix of a refused read is run on the host, where the board's directories are not)."""
    from pathlib import Path

    return "base.kld" if Path(path).name != "base.kld" else "base-new.kld"


class _NotAnArchive(ValueError):
    """A file np.load reads as a single array (a .npy file), where a ``--kl-divergence-base`` file is an archive."""


def _open_base_archive(path):
    """``path`` opened as the .npz archive a ``--kl-divergence-base`` file is, without pickles (a file from elsewhere
    runs no code), for use in ``with``. A .npy file, which np.load gives as an array (no members, and no context
    manager), is refused by its magic before its array is read (it may be large); any other file
    that is no archive np.load refuses itself (ValueError, without pickles)."""
    with open(path, "rb") as handle:
        magic = handle.read(len(np.lib.format.MAGIC_PREFIX))
    if magic == np.lib.format.MAGIC_PREFIX:
        raise _NotAnArchive("a single .npy array, not the .npz archive eval writes")
    return np.load(path, allow_pickle=False)


def _base_file_problem(path) -> str | None:
    """Why the existing ``path`` is not a ``--kl-divergence-base`` file this (or another) edgesdk wrote, None where
    it is one: its header (an .npz member, read without the arrays) must record eval's format. The version is not
    checked: a base file of another layout is still one, which a new one may replace."""
    import json
    import zipfile
    import zlib

    if not path.is_file():
        return "is not a regular file"
    try:
        with _open_base_archive(path) as data:
            if "header" not in data.files:
                return "is no file eval --kl-divergence-base wrote (no header)"
            header = json.loads(data["header"].tobytes().decode())
    except _NotAnArchive as exc:
        return f"is no file eval --kl-divergence-base wrote ({exc})"
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, UnicodeDecodeError) as exc:
        return f"is no file eval --kl-divergence-base wrote (not the .npz archive it writes: {type(exc).__name__})"
    if not isinstance(header, dict) or header.get("format") != KL_BASE_FORMAT:
        return "is no file eval --kl-divergence-base wrote (its header records another format)"
    return None


def _write_refusal(path, exc: OSError) -> EdgeSDKError:
    """A ``--kl-divergence-base`` file that cannot be written where it was asked for, named with the system's
    reason."""
    return EdgeSDKError(f"--kl-divergence-base {path} cannot be written: {exc.strerror or exc}",
                        "pass a path in a directory this user can write to, on a disk with room for it "
                        "(a few kB a scored position and the output layer once)")


def _base_refusal(path, problem: str) -> EdgeSDKError:
    """A ``--kl-divergence-base`` file that cannot be read as one, named with what is wrong and how to get one."""
    return EdgeSDKError(f"--kl-divergence-base {path}: {problem}",
                        "write one on the host, where the source model loads, to a new path: edgesdk eval BUNDLE "
                        f"--text FILE --kl-divergence-base {_fresh_base_name(path)} (the --text file and settings "
                        "this run uses), then copy it here")


def read_divergence_base(path) -> DivergenceBase:
    """A ``--kl-divergence-base`` file, read without pickles (``allow_pickle=False``: a file from elsewhere runs no
    code) and checked whole before any scoring: a file that is missing, is no such file, was cut short or is
    inconsistent is refused naming it."""
    import json
    import zipfile
    import zlib

    try:
        with _open_base_archive(path) as data:
            missing = [name for name in KL_BASE_ARRAYS if name not in data.files]
            if missing:
                raise _base_refusal(path, f"is not a file eval --kl-divergence-base wrote: it lacks {', '.join(missing)}")
            arrays = {name: data[name] for name in KL_BASE_ARRAYS}
    except FileNotFoundError as exc:
        raise EdgeSDKError(f"--kl-divergence-base {path}: no such file",
                           f"pass the file eval --kl-divergence-base {path} wrote on the host (without "
                           "--kl-divergence, it writes one there)") from exc
    except IsADirectoryError as exc:
        raise _base_refusal(path, "is a directory, not a file") from exc
    except _NotAnArchive as exc:
        raise _base_refusal(path, f"is not a file eval --kl-divergence-base wrote: it is {exc}") from exc
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise _base_refusal(path, f"is damaged or no file eval --kl-divergence-base wrote ({exc})") from exc
    try:
        header = json.loads(arrays["header"].tobytes().decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise _base_refusal(path, f"its header is damaged ({exc})") from exc
    if not isinstance(header, dict) or header.get("format") != KL_BASE_FORMAT:
        raise _base_refusal(path, f"is not a file eval --kl-divergence-base wrote (format {header.get('format')!r})"
                            if isinstance(header, dict) else "its header is no record")
    if header.get("version") != KL_BASE_VERSION:
        raise _base_refusal(path, f"has layout version {header.get('version')!r}, and this edgesdk reads version "
                            f"{KL_BASE_VERSION} (upgrade edgesdk on this machine to the host's)")
    base = DivergenceBase(str(path), header, **{name: arrays[name] for name in KL_BASE_ARRAYS[1:]})
    problem = _base_problem(base)
    if problem:
        raise _base_refusal(path, f"is damaged: {problem}")
    return base


def _base_problem(base: DivergenceBase) -> str | None:
    """What makes ``base``'s arrays disagree with each other or its header (a file cut or altered), None if nothing."""
    vocab, settings = base.header.get("vocab_size"), base.header.get("settings")
    if not isinstance(vocab, int) or vocab < 1 or not isinstance(settings, dict):
        return "its header records no vocab_size or settings"
    if base.tokens.ndim != 1 or not np.issubdtype(base.tokens.dtype, np.integer):
        return f"its tokens are {base.tokens.dtype} of shape {base.tokens.shape}, not a list of token ids"
    for name in ("hidden", "head", "head_bias"):
        if getattr(base, name).dtype != np.float32:
            return f"its {name} is {getattr(base, name).dtype}, not float32"
    if base.hidden.ndim != 2 or base.head.ndim != 2 or base.head.shape[0] != vocab or \
            base.hidden.shape[1] != base.head.shape[1]:
        return f"hidden states of shape {base.hidden.shape} and an output layer of shape {base.head.shape} do " \
               f"not make logits over its {vocab} tokens"
    if base.head_bias.shape not in ((0,), (vocab,)):
        return f"the output layer's bias has shape {base.head_bias.shape}, for {vocab} tokens"
    return None


def check_divergence_base(base: DivergenceBase, config: PerplexityConfig, tokenizer: str, ids: list[int]) -> None:
    """Refuse a ``--kl-divergence-base`` file that does not hold this run's positions: written under other scoring
    settings (each named with its option and value), for another tokenizer, or from another text (the first token
    that differs)."""
    path, written = base.path, base.header["settings"]
    differ = {key: (written.get(key), value) for key, value in kl_base_settings(config).items()
              if written.get(key) != value}
    # a stride equal to the context on both sides (llama-perplexity's, and --method windows' default) goes with the
    # context: named, its fix "--stride N" would be refused under llama-perplexity and is redundant under windows
    if "stride" in differ and (written.get("method") == LLAMA_PERPLEXITY or (
            written.get("stride") == written.get("context") and config.stride == config.context)):
        del differ["stride"]
    if differ:
        said = ", ".join(f"{KL_BASE_OPTIONS[key]} {_option_value(key, was)} (this run: {_option_value(key, now)})"
                         for key, (was, now) in differ.items())
        raise EdgeSDKError(f"--kl-divergence-base {path} was written with {said}, so it holds other positions",
                           "pass " + " ".join(f"{KL_BASE_OPTIONS[key]} {_option_value(key, was)}"
                                              for key, (was, _) in differ.items())
                           + " as it was written, or write it again on the host with this run's settings")
    if base.header.get("tokenizer_sha256") != tokenizer:
        raise EdgeSDKError(f"--kl-divergence-base {path} was written for the tokenizer of bundle "
                           f"{base.header.get('bundle_id')} (tokenizer sha256 {str(base.header.get('tokenizer_sha256'))[:16]}...), "
                           f"and this bundle's tokenizer is another (sha256 {tokenizer[:16]}...): its token ids are "
                           "not this bundle's",
                           "compare bundles built from the same source model, or write the file again on the host "
                           "with this bundle")
    if len(base.tokens) != len(ids) or not np.array_equal(base.tokens, np.asarray(ids, np.int64)):
        at = next((i for i, (a, b) in enumerate(zip(base.tokens.tolist(), ids, strict=False))
                   if a != b), min(len(base.tokens), len(ids)))
        raise EdgeSDKError(f"--kl-divergence-base {path} was written from another text: it holds {len(base.tokens)} "
                           f"tokens and --text gives {len(ids)}, the first to differ at token {at}",
                           "pass the --text file (and --max-chars) it was written from, or write it again on the "
                           "host from this text")
    scored = sum(end - start - first for start, end, first in _checked_windows(ids, config, "a divergence"))
    if len(base.hidden) != scored:
        raise _base_refusal(path, f"is damaged: it holds {len(base.hidden)} positions, and its text and settings "
                            f"score {scored}")


def base_divergence(score_bundle, ids: list[int], config: PerplexityConfig, base: DivergenceBase,
                    progress: bool = False, bos_id: int | None = None) -> DivergenceResult:
    """:func:`divergence` of the bundle from the reference's logits given back by ``base`` (its layout above) in
    place of the PyTorch model's: no torch needed, as on a board. ``base`` must hold this run's positions
    (:func:`check_divergence_base`)."""
    from tqdm import tqdm

    spans, window_bos = _checked_windows(ids, config, "a divergence"), _window_bos(config, bos_id)
    figures, row = [], 0
    for start, end, first in tqdm(spans, desc="divergence", disable=not progress, unit="window"):
        window = _window(ids, start, end, window_bos)
        ours = score_bundle(window)[first - 1:-1]  # (T, V): row t predicts token t+1
        if row + len(ours) > len(base.hidden):
            break
        figures.append(_window_divergence(
            ours, lambda rows, row=row: base.logits(slice(row + rows.start, row + rows.stop)), window[first:]))
        row += len(ours)
    if row != len(base.hidden) or len(figures) != len(spans):
        raise EdgeSDKError(f"--kl-divergence-base {base.path} holds {len(base.hidden)} positions and this run scores "
                           "others", "write it again on the host with this run's settings")
    return _divergence_result(*(np.concatenate(parts) for parts in zip(*figures, strict=True)))


def write_bundle_divergence_base(runtime, model, text: str, config: PerplexityConfig, path,
                                 progress: bool = False) -> tuple[PerplexityResult, int]:
    """:func:`write_divergence_base` of the bundle's PyTorch source ``model`` over the token ids and windows
    :func:`bundle_perplexity` scores (host only), the file recording the bundle's tokenizer, its id and its source."""
    header = {"tokenizer_sha256": tokenizer_identity(runtime), "bundle_id": runtime.bundle.bundle_id,
              "source": runtime.bundle.manifest["model"]["before"].get("source")}
    output, score = model.get_output_embeddings(), hidden_scorer(model)
    bias = getattr(output, "bias", None)
    try:
        return write_divergence_base(score, output.weight.detach().float().numpy(),
                                     None if bias is None else bias.detach().float().numpy(),
                                     _scored_ids(runtime, text, config, "a divergence"), config, path, header,
                                     progress, bos_id=leading_bos(runtime.tokenizer))
    finally:
        score.handle.remove()  # the model scores on (--last-word) without it


def hidden_scorer(model):
    """``score(window) -> (logits, hidden)`` through the PyTorch model (host only): its logits, and the hidden states
    its output layer read, caught on the way in (whatever the model's own hidden_states hold)."""
    import torch

    output, caught = model.get_output_embeddings(), []
    handle = output.register_forward_pre_hook(lambda module, args: caught.append(args[0]))

    def score(window: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        caught.clear()
        with torch.no_grad():
            logits = model(torch.from_numpy(window)[None], use_cache=False).logits[0].float().numpy()
        return logits, caught[-1][0].float().numpy()

    score.handle = handle  # removed by the caller when done
    return score


def check_bundle_divergence_base(runtime, text: str, config: PerplexityConfig, base: DivergenceBase) -> None:
    """:func:`check_divergence_base` against the bundle's tokenizer and the ids it scores of ``text``."""
    check_divergence_base(base, config, tokenizer_identity(runtime), _scored_ids(runtime, text, config, "a divergence"))


def bundle_base_divergence(runtime, text: str, config: PerplexityConfig, base: DivergenceBase,
                           progress: bool = False) -> DivergenceResult:
    """:func:`base_divergence` of the bundle over the token ids and windows :func:`bundle_perplexity` scores, after
    :func:`check_bundle_divergence_base`: no torch, as on a board."""
    ids = _scored_ids(runtime, text, config, "a divergence")
    check_divergence_base(base, config, tokenizer_identity(runtime), ids)
    return base_divergence(bundle_scorer(runtime), ids, config, base, progress, bos_id=leading_bos(runtime.tokenizer))


def bundle_scorer(runtime, hook=None):
    """``score(window) -> logits`` through the bundle's runtime, each window from an empty cache;
    ``score.max_tokens`` is the longest window it takes (the bundle's max_context). ``hook`` (a
    :class:`~edgesdk.runtime.generate.StepHook`) sees each window as a prefill step that yields no token, as it sees
    an embedding's pass in ``edgesdk serve``: the thermal guard may hold the window back (a pause on a board past its
    hard limit) and is told its compute time after it."""
    backend = runtime.backend

    def score(window: np.ndarray) -> np.ndarray:
        backend.reset()
        if hook is None:
            return backend.prefill(window, keep_logits=len(window))
        return hooked_pass(hook, len(window), lambda: backend.prefill(window, keep_logits=len(window)))

    score.max_tokens = backend.max_context
    return score


def reference_scorer(model):
    """``score(window) -> logits`` through the PyTorch model (host only)."""
    import torch

    def score(window: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model(torch.from_numpy(window)[None], use_cache=False).logits[0].float().numpy()

    return score


DEFAULT_BUDGETS = (1.0, 0.8, 0.6)


def _scored_ids(runtime, text: str, config: PerplexityConfig, measure: str = "perplexity") -> list[int]:
    """The ids a text is scored on: read as plain text, a special token's name written in it (``<|im_end|>``) as
    the characters it is, as llama-perplexity's ``common_tokenize(ctx, text, true)`` reads it; too few for
    ``measure`` refused (:func:`_text_ids`)."""
    ids = runtime.tokenizer.encode_plain(text[: config.max_chars] if config.max_chars else text)
    return _text_ids(_lead(ids, config, leading_bos(runtime.tokenizer)), text, config, measure)


def _lead(ids: list[int], config: PerplexityConfig, bos_id: int | None) -> list[int]:
    """``ids`` with ``bos_id`` in front under llama-perplexity's rule, which tokenizes the text with its special
    tokens (module docstring); as they are otherwise, where each window's first token becomes BOS."""
    return [bos_id, *ids] if config.method == LLAMA_PERPLEXITY and bos_id is not None else ids


def _gated_pass(backend, ids: list[int], config: PerplexityConfig, tau: float | None, progress: bool,
                bos_id: int | None = None, read: list | None = None) -> tuple[PerplexityResult, float]:
    """Perplexity with a fixed threshold (None: gating off) and the fraction of FFN blocks that ran; the gates of
    every position of each window (scored or not, as the executed fraction counts them), as this pass reads them,
    are appended to ``read`` where one is given."""
    run, total = 0, 0

    def score(window: np.ndarray) -> np.ndarray:
        nonlocal run, total
        backend.reset()
        logits = backend.prefill(window, keep_logits=len(window))
        gates = backend.last_gates  # (S, L)
        executed = gates >= tau if tau is not None else np.ones_like(gates, bool)
        run, total = run + int(executed.sum()), total + executed.size
        if read is not None:
            read.append(np.asarray(gates).ravel())
        return logits

    before = backend.gating, backend.fixed_tau
    backend.gating, backend.fixed_tau = tau is not None, tau
    try:
        label = "perplexity, gating off" if tau is None else f"perplexity, tau {tau:.3f}"  # one bar per point
        result = perplexity(score, ids, config, progress, label, bos_id)
    finally:
        backend.gating, backend.fixed_tau = before
    return result, run / max(total, 1)


def controlled_tau(backend, ids: list[int], steps: int = 256, bos_id: int | None = None) -> float:
    """The threshold the run-time controller settles at on ``ids``: token-by-token decode with the
    controller in the loop, mean tau over the second half of ``steps`` steps; the first token is
    ``bos_id`` where one is given, as in the perplexity windows."""
    backend.reset()
    before = backend.gating, backend.fixed_tau
    backend.gating, backend.fixed_tau = True, None
    taus = []
    try:
        backend.prefill(_window(ids, 0, 1, bos_id))
        steps = min(steps, backend.max_context - 1)
        for token in ids[1: steps + 1]:
            taus.append(backend.tau)
            backend.decode(int(token))
        half = taus[len(taus) // 2:] or [backend.tau]  # read while the controller still steers
    finally:
        backend.gating, backend.fixed_tau = before
        backend.reset()
    return float(np.mean(half))


BUDGET_TOLERANCE = 0.005  # a budget's tau is settled once its share of FFN blocks is this close (or a block away)
BUDGET_STEPS = 12  # at most this many passes over the first window to set a budget's first tau
BUDGET_PASSES = 3  # at most this many passes over the whole text to settle it


def _share_at(backend, window: np.ndarray, tau: float) -> tuple[float, np.ndarray]:
    """The share of FFN blocks that run when ``window`` is scored at the fixed threshold ``tau``, gating on (the
    power adapters' scales acting, as the gated passes run), and the gates as that pass reads them."""
    backend.reset()
    backend.gating, backend.fixed_tau = True, tau
    backend.prefill(window, keep_logits=1)
    gates = backend.last_gates.ravel()
    return float(np.mean(gates >= tau)), gates


def _settle(share_at, budget: float, steps: int) -> tuple[float, float, object]:
    """(tau, its share, what ``share_at`` gave with it) closest to ``budget`` in at most ``steps`` calls of
    ``share_at(tau) -> (share of FFN blocks run, gates read at tau, anything)``. Each step takes the
    ``1 - budget`` quantile of the gates read at the last tau, kept inside the bracket of taus known to run too
    many and too few blocks (halved where it falls outside), until the share is within ``BUDGET_TOLERANCE`` (or one
    block) of the budget. The first tau is ``share_at.start``."""
    # sigmoid gates: every one runs at 0, none above 1 (below 0 is gating off, never tried: halves lie above it)
    low, high = float(np.nextafter(0.0, -1.0)), float(np.nextafter(1.0, 2.0))
    tau, best = share_at.start, None
    for _ in range(steps):
        if not low < tau < high:
            tau = (low + high) / 2
        share, gates, extra = share_at(tau)
        if best is None or abs(share - budget) < abs(best[1] - budget):
            best = (tau, share, extra)
        if abs(share - budget) <= max(BUDGET_TOLERANCE, 1 / max(gates.size, 1)):
            break
        low, high = (tau, high) if share > budget else (low, tau)
        tau = float(np.quantile(gates, 1 - budget))
    return best


def budget_tau(backend, window: np.ndarray, budget: float) -> tuple[float, float]:
    """(tau, share of FFN blocks it runs on ``window``) for a compute ``budget``: the threshold whose gated pass
    over ``window`` runs ``budget`` of the blocks, the gates read as that pass reads them (:func:`_settle`, from
    the quantile of the gates read at tau 0, every block running).

    With gating on the adapters' scales act and a skipped block changes the layers after it, so the gates read
    with gating off (the loaded model) are not those a gated pass compares with tau: budget 0.9 chosen from them
    ran 93.8 % of the blocks on SmolLM2. Budget 1 is tau 0: every gate is at least 0."""
    if budget >= 1:
        return 0.0, 1.0

    def share_at(tau: float):
        share, gates = _share_at(backend, window, tau)
        return share, gates, None

    share_at.start = float(np.quantile(_share_at(backend, window, 0.0)[1], 1 - budget))
    tau, share, _ = _settle(share_at, budget, BUDGET_STEPS)
    return tau, share


def gated_perplexity(runtime, text: str, config: PerplexityConfig = PerplexityConfig(),
                     budgets: tuple[float, ...] = DEFAULT_BUDGETS, progress: bool = False) -> dict:
    """Perplexity of a power-gated bundle: gating off, at the controller's setting, and over budgets.

    Prefill scores a whole window at one threshold, so each point uses a fixed tau: the
    controller's setting is the mean tau it settles at while decoding the head of the text
    (:func:`controlled_tau`); a budget b is the tau whose gated pass runs a share b of the FFN blocks, the
    gates read as that pass reads them (with gating on, the adapters' scales act): first found on the first
    window (:func:`budget_tau`), then, where the pass over the whole text runs a share further than
    ``BUDGET_TOLERANCE`` from b, taken again from the gates that pass read, for at most ``BUDGET_PASSES``
    passes; the point is the pass closest to b. Each point reports the budget, its tau and the fraction of
    FFN blocks that ran (``executed_fraction``), and the passes taken.
    """
    backend = runtime.backend
    ids = _scored_ids(runtime, text, config)
    bos = _window_bos(config, leading_bos(runtime.tokenizer))
    off, _ = _gated_pass(backend, ids, config, None, progress, bos)
    tau_star = controlled_tau(backend, ids, bos_id=bos)
    chosen, executed = _gated_pass(backend, ids, config, tau_star, progress, bos)
    first = _window(ids, 0, min(config.context, len(ids)), bos)  # the first window as the passes score it
    curve = []
    for budget in budgets:
        before = backend.gating, backend.fixed_tau
        try:
            start, _ = budget_tau(backend, first, budget)
        finally:
            backend.gating, backend.fixed_tau = before
            backend.reset()
        passes: list[float] = []

        def share_at(tau: float, passes: list[float] = passes):
            read: list[np.ndarray] = []
            point, ran = _gated_pass(backend, ids, config, tau, progress, bos, read)
            passes.append(tau)
            return ran, np.concatenate(read), point

        share_at.start = start
        tau, ran, point = _settle(share_at, budget, 1 if budget >= 1 else BUDGET_PASSES)
        curve.append({"budget": budget, "tau": round(tau, 5), "executed_fraction": round(ran, 4),
                      "perplexity": round(point.perplexity, 6), "passes": len(passes)})
    return {"gating_off": off.to_json(),
            "chosen": {**chosen.to_json(), "tau": round(tau_star, 5), "executed_fraction": round(executed, 4),
                       "relative_to_off": round(chosen.perplexity / off.perplexity - 1, 6)},
            "curve": curve}


# ------------------------------------------------------------------------------- last-word accuracy

LAST_WORD_MIN_WORDS, LAST_WORD_MAX_WORDS = 40, 150
# (context, last word): a paragraph cut at its last space; the word is scored where :func:`_is_word` takes it
LAST_WORD = re.compile(r"(.*\S)\s+(\S+)$")


def _is_word(text: str) -> bool:
    """Whether ``text`` is a word of letters of any script: a letter first (Unicode category L*: "c", "М", "न"), then
    letters, combining marks (M*: the accent of a decomposed "é", Devanagari's vowel signs and virama), apostrophes
    and hyphens. Digits of any kind ("1990", "²"), number letters ("Ⅻ") and the underscore are not letters."""
    return bool(text) and unicodedata.category(text[0]).startswith("L") and all(
        unicodedata.category(char)[0] in "LM" or char in "'-" for char in text[1:])


@dataclass(frozen=True)
class LastWordResult:
    documents: int
    accuracy: float  # words whose every token is the greedy one
    word_perplexity: float  # exp of the mean negative log-likelihood of a word
    # the accuracy's standard error, as lm-evaluation-harness gives its acc_stderr (mean_stderr: the 0/1 scores'
    # sample standard deviation over sqrt(n)), which is sqrt(p (1 - p) / (n - 1)), the "+/-" llama-perplexity prints
    # beside its Winogrande and multiple-choice accuracy; None for one document
    accuracy_uncertainty: float | None = None

    def to_json(self) -> dict:
        return {"documents": self.documents, "accuracy": round(self.accuracy, 6),
                "accuracy_uncertainty": None if self.accuracy_uncertainty is None
                else round(self.accuracy_uncertainty, 6),
                "word_perplexity": round(self.word_perplexity, 4)}


def last_word_documents(text: str) -> list[tuple[str, str]]:
    """(context, last word) of each paragraph of 40-150 words that ends in " ." (WikiText's form), its last word
    3 characters or more of letters of any script, combining marks, apostrophes and hyphens, a letter first
    (:func:`_is_word`): a LAMBADA-style cloze (Paperno et al. 2016) on any text of that form."""
    documents = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("=") or not LAST_WORD_MIN_WORDS <= len(line.split()) <= LAST_WORD_MAX_WORDS \
                or not line.endswith(" ."):
            continue
        found = LAST_WORD.search(line[:-2].rstrip())
        if found and len(found.group(2)) >= 3 and _is_word(found.group(2)):
            documents.append((found.group(1), found.group(2)))
    return documents


def last_word_accuracy(score_window, encode, documents: list[tuple[str, str]],
                       max_tokens: int | None = None, bos_id: int | None = None) -> LastWordResult:
    """Score each document as lm-evaluation-harness scores a loglikelihood request: the context and
    context + " " + word encoded apart, the word's tokens those past the context's, each from one
    window (``score_window(ids) -> logits (T, V)``, from an empty cache). A document longer than
    ``max_tokens`` (default: ``score_window.max_tokens`` where the scorer has one, else no limit)
    keeps its last tokens, as the harness cuts one to its model's max_length: the window is
    ``(context + word)[-(max_tokens + 1):-1]``. ``bos_id`` goes in front of both encodings, as the harness
    puts a model's BOS (Gemma's) in front of its requests."""
    if not documents:
        raise EdgeSDKError("the text has no paragraph to score for the last-word task (40-150 words ending "
                           "in ' .', as WikiText's)", "pass WikiText-2 (wiki.valid.raw) or text of that form")
    limit = max_tokens if max_tokens is not None else getattr(score_window, "max_tokens", None)
    correct, likelihoods = 0, []
    for context, word in documents:
        lead = [] if bos_id is None else [bos_id]
        prefix, whole = lead + encode(context), lead + encode(f"{context} {word}")
        targets = np.asarray(whole[len(prefix):])
        fed = whole if limit is None or len(whole) <= limit else whole[-(limit + 1):-1]
        last = len(fed) - (len(fed) == len(whole))  # past the row that predicts the word's last token
        rows = log_softmax(score_window(np.asarray(fed, np.int64))[last - len(targets): last])  # (n, V)
        likelihoods.append(float(rows[np.arange(len(targets)), targets].sum()))
        correct += bool((rows.argmax(axis=-1) == targets).all())
    n, accuracy = len(documents), correct / len(documents)
    uncertainty = math.sqrt(accuracy * (1 - accuracy) / (n - 1)) if n > 1 else None
    return LastWordResult(n, accuracy, exp_or_inf(-float(np.mean(likelihoods))), uncertainty)
