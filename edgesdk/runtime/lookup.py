"""Prompt lookup decoding: draft the next tokens by finding the text's last few tokens earlier in it.

An answer often repeats its prompt or itself: a summary quotes its source, an edit copies the code
around the change, a JSON answer repeats keys, and a small model loops. Where the last ``n`` tokens
(``n`` from ``ngram_max`` down to ``ngram_min``) occurred before, the tokens that followed them
then are a draft of what follows now (Saxena 2023, "Prompt Lookup Decoding"; llama.cpp's
``llama-lookup``, transformers' ``prompt_lookup_num_tokens``). The model checks a draft of ``k``
tokens in one forward pass over ``k + 1`` positions (:func:`~edgesdk.runtime.generate.generate`):
the token it picks from each position's logits is kept while it equals the draft, so the answer is
the one decoding token by token gives, sampled or greedy (a deterministic draft is accepted with
exactly the model's probability of that token: Leviathan et al. 2023, "Fast Inference from
Transformers via Speculative Decoding", with a draft distribution that is a point mass), and each
check yields at least one token. The cache entries of refused draft tokens are rewound.

The n-grams are indexed as the text grows (the most recent earlier occurrence of each), so a
lookup costs a few dictionary reads however long the context.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral

MAX_DRAFT = 64  # a pass keeps (draft + 1) rows of logits: 64 are 12.6 MB on SmolLM2's 49,152 tokens
# the index keeps, per token, each n-gram from ngram_min to ngram_max tokens that ends before it: at 16 about 2.4 KB a
# token (10 MB for 4,096), where ngram_max 2,048 took tens of GB for a 3,000-token text; llama.cpp's n-gram lookup
# stops at 4 (common/ngram-cache.h, LLAMA_NGRAM_MAX)
MAX_NGRAM = 16


@dataclass(frozen=True)
class LookupConfig:
    """How drafts are found and how long they may be."""

    max_draft: int = 8  # draft tokens checked at once (the pass runs max_draft + 1 positions)
    ngram_max: int = 4  # longest run of last tokens looked up
    ngram_min: int = 2  # shortest: a single token recurs too often to predict what follows it

    def __post_init__(self):
        for name in ("max_draft", "ngram_max", "ngram_min"):
            value = getattr(self, name)
            # any whole number (numpy's too, as SamplingConfig takes them), kept as a Python int
            if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
            object.__setattr__(self, name, int(value))
        if self.max_draft > MAX_DRAFT:
            raise ValueError(f"max_draft must be at most {MAX_DRAFT} (a pass keeps max_draft + 1 rows of logits), "
                             f"got {self.max_draft}")
        if self.ngram_max > MAX_NGRAM:
            raise ValueError(f"ngram_max must be at most {MAX_NGRAM} (the index keeps every n-gram up to ngram_max "
                             f"tokens long ending at each token), got {self.ngram_max}; pass one of 1 to {MAX_NGRAM} "
                             "(llama.cpp's lookup looks up at most 4)")
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"ngram_min ({self.ngram_min}) must not exceed ngram_max ({self.ngram_max})")

    def drafter(self, prompt_ids) -> NgramDrafter:
        """The drafts of one answer after ``prompt_ids``."""
        return NgramDrafter(self, prompt_ids)


class NgramDrafter:
    """The token sequence so far (prompt and answer) with an index of where each n-gram last ended."""

    def __init__(self, config: LookupConfig, tokens: list[int] | tuple[int, ...] = ()):
        self.config = config
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], int] = {}  # n-gram -> index just past its latest occurrence
        for token in tokens:
            self.push(token)

    def push(self, token: int) -> None:
        """Append a token; the n-grams ending before it become findable."""
        tokens = self.tokens
        tokens.append(int(token))
        end = len(tokens) - 1  # index the n-grams ending just before this token are followed by
        for n in range(self.config.ngram_min, self.config.ngram_max + 1):
            if end - n >= 0:
                self._ends[tuple(tokens[end - n:end])] = end

    def draft(self, limit: int | None = None) -> list[int]:
        """Up to ``max_draft`` (and ``limit``) tokens that followed the longest run of the last tokens
        found earlier (:func:`_continuation`); empty when none was."""
        room = self.config.max_draft if limit is None else min(limit, self.config.max_draft)
        if room <= 0:
            return []
        tokens = self.tokens
        for n in range(min(self.config.ngram_max, len(tokens)), self.config.ngram_min - 1, -1):
            start = self._ends.get(tuple(tokens[len(tokens) - n:]))
            if start is not None:
                return _continuation(tokens, start, room)
        return []


def _continuation(tokens: list[int], start: int, room: int) -> list[int]:
    """``room`` tokens of what followed ``tokens[:start]``, whose last tokens are the text's last ones: the text's
    own tokens from ``start`` on, and where they reach the end of the text, the draft itself. An occurrence that
    ends ``p`` tokens before the end (the latest one, in a loop of period ``p``) has only ``p`` tokens after it; the
    text that follows the match is the text ``p`` tokens back, so the draft goes on repeating them, as a lookup that
    drafts token by token and reads each drafted token as text (llama.cpp's ``common_ngram_cache_draft``) goes on: a
    loop of one token ("77 77 77 ...", a small model's) is drafted ``room`` tokens at a time, not one."""
    draft = tokens[start:start + room]
    period = len(tokens) - start
    while len(draft) < room:
        draft.append(draft[len(draft) - period])
    return draft
