"""Log-probabilities of the tokens of an answer (and, for ``echo``, of its prompt), as OpenAI's
``logprobs`` report them: each token's log-probability under the model and its most likely
alternatives.

They come from the model's own next-token distribution (log-softmax of the logits the backend
returned), before temperature, top-p, penalties or a JSON-mode constraint shape the choice, as
OpenAI's and llama-server's (without ``post_sampling_probs``) are.

A token the model gives no chance (a logit of -inf, as a float16 engine's overflow leaves) has the log-probability
-inf, which JSON cannot hold (Python writes ``-Infinity``, which JSON parsers refuse): it is reported as the lowest
finite float32, -3.4028234663852886e+38, as llama-server reports a probability of 0 (``logarithm()`` in
tools/server/server-task.h: "nlohmann::json converts -inf to null, so we need to prevent that").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

NO_CHANCE = float(np.finfo(np.float32).min)  # llama-server's log-probability of a token with probability 0


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float | None  # None for a prompt's first token: nothing predicts it
    top: tuple[tuple[int, float], ...]  # the most likely tokens at this position, most likely first


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """(..., V) -> (..., V) in float64. In a row holding logits of +inf (a float16 engine's overflow upwards) those
    tokens share all the probability equally and every other token has none: the limit of the softmax, where
    ``inf - inf`` would make the whole row NaN."""
    values = logits.astype(np.float64)
    top = values.max(axis=-1, keepdims=True)  # (..., 1)
    overflowed = np.isposinf(top)  # (..., 1)
    values = np.where(overflowed, np.where(np.isposinf(values), 0.0, -np.inf), values)
    shifted = values - np.where(overflowed, 0.0, top)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


@dataclass
class LogprobRecorder:
    """Collects a :class:`TokenLogprob` per answer token (``generate(logprobs=...)``); with ``prompt``,
    also per prompt token (the first has none: nothing predicts it). The end-of-text token that
    stopped the answer is not one of the answer's; it is kept apart in ``end``."""

    top: int = 0  # alternatives kept per position
    prompt: bool = False
    answer: list[TokenLogprob] = field(default_factory=list)
    prompt_entries: list[TokenLogprob] = field(default_factory=list)
    end: TokenLogprob | None = None  # the end-of-text token the answer stopped at, if it did

    def entry(self, logits: np.ndarray, token: int) -> TokenLogprob:
        """``logits`` (V,) at the position that ``token`` follows. The alternatives are the ``top`` most likely,
        equally likely ones in the order of their ids (the one greedy sampling takes, ``np.argmax``'s, first)."""
        # -inf (no chance) as llama-server reports it, and NaN too: a row with no finite logit (all -inf, or NaN from
        # the engine) gives no token a chance, and NaN is no JSON (Python writes ``NaN``, which JSON parsers refuse)
        with np.errstate(invalid="ignore"):  # -inf - -inf in such a row: NaN, taken here
            scores = np.fmax(log_softmax(logits), NO_CHANCE)
        top = ()
        if self.top:
            count = min(self.top, scores.shape[0])
            cut = np.partition(scores, scores.shape[0] - count)[scores.shape[0] - count]  # the count-th largest
            near = np.flatnonzero(scores >= cut)  # in id order, with every token tied at the cut
            best = near[np.argsort(-scores[near], kind="stable")[:count]]
            top = tuple((int(t), float(scores[t])) for t in best)
        return TokenLogprob(int(token), float(scores[token]), top)

    def record(self, logits: np.ndarray, token: int) -> None:
        self.answer.append(self.entry(logits, token))

    def record_prompt(self, logits: np.ndarray, prompt_ids: list[int]) -> None:
        """``logits`` (T, V) of a whole prompt's prefill: row i predicts token i + 1."""
        self.prompt_entries = [TokenLogprob(int(prompt_ids[0]), None, ())] + [
            self.entry(logits[index - 1], token) for index, token in enumerate(prompt_ids) if index]
