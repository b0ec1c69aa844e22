"""Speculative decoding with a draft bundle whose context is shorter than the bundle's: past the draft's context the
draft model drafts from the latest tokens that fit in it, as llama.cpp's drafter does (common/speculative.cpp,
``common_speculative_gen_draft``: ``i_start = max(0, prompt_tgt.size() - (n_ctx_dft - n_draft))``), where it
stopped drafting for the rest of the answer; and the answer is still the bundle's own, token for token."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.runtime.generate import ContextShift, SamplingConfig, generate
from edgesdk.runtime.speculative import DraftConfig, DraftModel
from tests._utils.builds import build_lively_bundle

PROMPT = [3 + (7 * index * index + 11 * index) % 317 for index in range(30)]


def _open(bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(bundle.path, threads=1)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return _open(build_lively_bundle(tmp_path_factory.mktemp("target46"), 11, max_context=128))


@pytest.fixture(scope="module")
def short_draft(tmp_path_factory):
    """The target's own model in a bundle that holds 40 tokens: every draft it makes from the same text is taken."""
    return _open(build_lively_bundle(tmp_path_factory.mktemp("short46"), 11, max_context=40))


class _Counted:
    """A drafter that records the length of the text, the limit and the draft's length of each call (wraps the real
    one)."""

    def __init__(self, model: DraftModel):
        self.model, self.calls = model, []

    def drafter(self, prompt_ids):
        inner, calls = self.model.drafter(prompt_ids), self.calls

        class Drafter:
            def push(self, token):
                inner.push(token)

            def draft(self, limit=None):
                drafted = inner.draft(limit)
                calls.append((len(inner.tokens), limit, len(drafted)))
                return drafted

        return Drafter()


@pytest.mark.parametrize("max_draft", [1, 3, 8])
def test_a_draft_model_with_a_shorter_context_drafts_past_it_and_the_answer_is_the_bundle_s(target, short_draft,
                                                                                          max_draft):
    sampling = SamplingConfig(max_new_tokens=90)
    plain, plain_stats = generate(target.backend, PROMPT, sampling, stop_ids=set())
    short_draft.backend.reset()
    model = DraftModel(short_draft.backend, DraftConfig(max_draft=max_draft, p_min=0.0), target.backend.vocab_size)
    counted = _Counted(model)
    drafted, stats = generate(target.backend, PROMPT, sampling, stop_ids=set(), lookup=counted)
    assert drafted == plain
    assert stats.stop_reason == plain_stats.stop_reason
    past = [size for length, limit, size in counted.calls if length > short_draft.backend.max_context and limit]
    assert past  # the text outgrew the draft's 40 tokens
    assert all(size > 0 for size in past)  # and drafts went on
    assert stats.draft_accepted > 0
    assert short_draft.backend.position <= short_draft.backend.max_context
    assert len(model.cached) == short_draft.backend.position


def test_a_text_that_fills_the_draft_s_context_exactly_still_gets_a_one_token_draft(target, short_draft):
    """The draft's cache holds the text and all but the last drafted token: a text of max_context tokens leaves
    room for a draft of one."""
    short_draft.backend.reset()
    model = DraftModel(short_draft.backend, DraftConfig(max_draft=1, p_min=0.0), target.backend.vocab_size)
    text = (PROMPT * 2)[: short_draft.backend.max_context]
    assert len(model.drafter(text).draft()) == 1
    # the draft is the draft model's greedy token after the whole text
    short_draft.backend.reset()
    logits = short_draft.backend.prefill(np.asarray(text, np.int64))[-1]
    model.cached = []
    assert model.drafter(text).draft() == [int(np.argmax(logits))]


def test_the_window_moves_in_strides_so_the_draft_s_cache_is_reused(target, short_draft):
    """Past its context the draft model does not prefill its whole window at every step: the window's start moves
    by half the draft's context at a time, and in between only the new tokens are prefilled."""
    short_draft.backend.reset()
    model = DraftModel(short_draft.backend, DraftConfig(max_draft=2, p_min=0.0), target.backend.vocab_size)
    prefilled = []
    backend = short_draft.backend
    original = backend.prefill

    def counting(token_ids, keep_logits=1):
        prefilled.append(len(token_ids))
        return original(token_ids, keep_logits)

    backend.prefill = counting
    try:
        generate(target.backend, PROMPT, SamplingConfig(max_new_tokens=90), stop_ids=set(), lookup=model)
    finally:
        del backend.prefill
    assert sum(prefilled) < 4 * (len(PROMPT) + 90)


@pytest.mark.parametrize("shift", [ContextShift(keep=0), ContextShift(keep=-1, discard=5)])
def test_with_a_context_shift_the_answer_is_the_bundle_s_own(target, short_draft, shift):
    sampling = SamplingConfig(max_new_tokens=200)
    plain, _ = generate(target.backend, PROMPT, sampling, stop_ids=set(), shift=shift)
    short_draft.backend.reset()
    model = DraftModel(short_draft.backend, DraftConfig(max_draft=4, p_min=0.0), target.backend.vocab_size)
    drafted, stats = generate(target.backend, PROMPT, sampling, stop_ids=set(), lookup=model, shift=shift)
    assert drafted == plain
    assert stats.context_shifts > 0
    assert stats.draft_accepted > 0
