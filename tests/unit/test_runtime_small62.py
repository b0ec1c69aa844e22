"""Prompt lookup's n-gram sizes: the index keeps every n-gram up to ``ngram_max`` tokens ending at each token, so a
``ngram_max`` past what a lookup needs is refused by name rather than taking memory that grows with it."""

from __future__ import annotations

import pytest

from edgesdk.runtime.lookup import LookupConfig

MAX_NGRAM = 16  # edgesdk.runtime.lookup.MAX_NGRAM


@pytest.mark.parametrize("ngram_max", [MAX_NGRAM + 1, 2048])
def test_an_ngram_max_past_the_cap_is_refused_by_name(ngram_max):
    # ngram_max 2048 was taken, and a drafter over a 3,000-token text then indexed about 6 million n-grams averaging
    # 1,000 tokens each (tens of GB) before its first draft
    with pytest.raises(ValueError, match=rf"ngram_max must be at most {MAX_NGRAM} .*got {ngram_max}"):
        LookupConfig(ngram_max=ngram_max)


def test_the_longest_ngram_allowed_drafts_from_a_bounded_index():
    config = LookupConfig(max_draft=4, ngram_max=MAX_NGRAM, ngram_min=2)
    tokens = [*range(100, 140)] * 3  # a text that repeats: each n-gram recurs
    drafter = config.drafter(tokens)
    assert drafter.draft() == [100, 101, 102, 103]  # "... 138 139" last came before "100 101 102 103"
    assert len(drafter._ends) <= len(tokens) * (MAX_NGRAM - 1)  # at most one entry per n-gram size and token
