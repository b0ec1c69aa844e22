"""Token generation: prompt lookup drafts that follow a loop go on for the whole draft (edgesdk/runtime/lookup.py)."""

from __future__ import annotations

import pytest

from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.lookup import LookupConfig, NgramDrafter


@pytest.mark.parametrize(("text", "draft"), [
    ([9, 5, 5, 5, 5], [5] * 8),  # a loop of one token
    ([1, 2, 3, 1, 2, 3, 1, 2], [3, 1, 2, 3, 1, 2, 3, 1]),  # a loop of three
])
def test_a_draft_that_reaches_the_end_of_the_text_goes_on_with_the_loop(text, draft):
    """The latest earlier occurrence of the last tokens ends a loop's period before the end: only that many tokens
    follow it in the text. The draft stopped there (one token for "5 5 5 5", with room for 8), where the text after
    the match is the text a period back, drafted again and again, as llama.cpp's and transformers' lookups draft
    the whole room in a loop."""
    assert NgramDrafter(LookupConfig(max_draft=8), text).draft() == draft
    assert NgramDrafter(LookupConfig(max_draft=8), text).draft(limit=2) == draft[:2]


def test_a_looping_answer_is_checked_a_full_draft_at_a_time_and_stays_the_plain_answer(runtime):
    """A logit bias makes the greedy answer one token over and over (a small model's loop). Each pass fed one drafted
    token (60 tokens in 30 passes with max_draft 8); each pass now checks 8, and the answer is the plain one."""
    backend, loop = runtime.backend, 77
    sampling = SamplingConfig(max_new_tokens=60, logit_bias=((loop, 100.0),))
    prompt = [5, 17, 99, 3, loop, loop, loop]
    plain, _ = generate(backend, prompt, sampling, set())
    drafted, stats = generate(backend, prompt, sampling, set(), lookup=LookupConfig(max_draft=8))
    assert drafted == plain == [loop] * 60
    passes = len(drafted) - stats.draft_accepted  # the prefill's token, then one per pass
    assert stats.draft_accepted == stats.draft_tokens
    assert passes <= -(-60 // 9) + 1  # 9 tokens a pass (the token fed and 8 drafted), the last pass cut short
