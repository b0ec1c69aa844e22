"""Log-probabilities of the tokens of an answer (and, for ``echo``, of its prompt), as OpenAI's
``logprobs`` report them: each token's log-probability under the model and its most likely
alternatives.

They come from the model's own next-token distribution (log-softmax of the logits the backend
returned), before temperature, top-p, penalties or a JSON-mode constraint shape the choice, as
OpenAI's and llama-server's (without ``post_sampling_probs``) are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float | None  # None for a prompt's first token: nothing predicts it
    top: tuple[tuple[int, float], ...]  # the most likely tokens at this position, most likely first


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """(..., V) -> (..., V) in float64."""
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
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
        """``logits`` (V,) at the position that ``token`` follows."""
        scores = log_softmax(logits)
        top = ()
        if self.top:
            count = min(self.top, scores.shape[0])
            best = np.argpartition(-scores, count - 1)[:count]
            best = best[np.argsort(-scores[best], kind="stable")]
            top = tuple((int(t), float(scores[t])) for t in best)
        return TokenLogprob(int(token), float(scores[token]), top)

    def record(self, logits: np.ndarray, token: int) -> None:
        self.answer.append(self.entry(logits, token))

    def record_prompt(self, logits: np.ndarray, prompt_ids: list[int]) -> None:
        """``logits`` (T, V) of a whole prompt's prefill: row i predicts token i + 1."""
        self.prompt_entries = [TokenLogprob(int(prompt_ids[0]), None, ())] + [
            self.entry(logits[index - 1], token) for index, token in enumerate(prompt_ids) if index]
