"""Token generation (edgesdk/runtime/generate.py): a draft model on the target's own backend, the count of accepted
drafts at the answer's end, and the stats of an answer a stop string ended."""

from __future__ import annotations

import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.generate import GenerationStats, SamplingConfig, generate
from edgesdk.runtime.lookup import LookupConfig
from edgesdk.runtime.speculative import DraftConfig, DraftModel

LOOP = 77  # a token a logit bias or a script makes the answer repeat


class Script:
    """A constraint that allows exactly the tokens of ``script``, one at a time, and is complete after
    ``complete_after`` of them (never where None): it makes the answer known in advance whatever the model."""

    def __init__(self, script: list[int], complete_after: int | None = None):
        self.script, self.complete_after, self.taken = script, complete_after, 0

    def allows(self, token_id: int) -> bool:
        return self.taken < len(self.script) and token_id == self.script[self.taken]

    def advance(self, token_id: int) -> None:
        self.taken += 1

    @property
    def complete(self) -> bool:
        return self.complete_after is not None and self.taken >= self.complete_after


class StopString(Exception):
    """What a caller's ``on_token`` raises to end the answer where a stop string is found in its text."""


def stop_string_at(count: int):
    """An ``on_token`` that ends the answer at its ``count``-th token."""
    seen = []

    def on_token(token: int) -> None:
        seen.append(token)
        if len(seen) == count:
            raise StopString

    return on_token


def test_a_draft_model_on_the_target_s_own_backend_is_refused_by_name(runtime):
    """The draft model's decodes went into the target's own KV cache between the target's passes: the answer was
    silently another than the plain one (9 of 60 prompts differed on SmolLM2). It is now refused before anything
    runs, naming the backend and the fix, and the target's cache is left as it was."""
    backend = runtime.backend
    prompt = [5, 17, 99, 3, 40]
    plain, _ = generate(backend, prompt, SamplingConfig(max_new_tokens=12), set())
    model = DraftModel(backend, DraftConfig(max_draft=4, p_min=0.0))
    with pytest.raises(EdgeSDKError) as caught:
        generate(backend, prompt, SamplingConfig(max_new_tokens=12), set(), lookup=model)
    assert "the target's own" in str(caught.value)
    assert backend.name in str(caught.value)
    assert "open_draft_model" in caught.value.fix
    assert model.cached == []  # the draft model never ran
    assert generate(backend, prompt, SamplingConfig(max_new_tokens=12), set())[0] == plain


def test_a_draft_model_on_a_backend_of_its_own_is_taken(target, same_model):
    prompt = [5, 17, 99, 3, 40]
    sampling = SamplingConfig(max_new_tokens=12)
    plain, _ = generate(target.backend, prompt, sampling, set())
    model = DraftModel(same_model.backend, DraftConfig(max_draft=4, p_min=0.0))
    drafted, stats = generate(target.backend, prompt, sampling, set(), lookup=model)
    assert drafted == plain
    assert stats.draft_accepted == stats.draft_tokens > 0


def test_an_accepted_drafted_stop_token_is_counted(runtime):
    """The prompt holds "77 77 77" followed by the stop id 2, so once the answer says 77 the lookup drafts "2 ...";
    the answer's next token is 2, the drafted one, and it ends the answer. That accepted draft token was not counted
    (the stop check ran before the drafted-and-checked branch): draft_accepted read 0 of the pass's drafts, where
    llama-server counts every accepted draft token (``n_draft_accepted += ids.size() - 1``)."""
    stop = 2
    prompt = [5, LOOP, LOOP, LOOP, stop, 9, LOOP, LOOP]
    tokens, stats = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=20), {stop},
                             constraint=Script([LOOP, stop]), lookup=LookupConfig(max_draft=4))
    assert tokens == [LOOP]
    assert stats.stop_reason == "eos"
    assert stats.draft_tokens == 4
    assert stats.draft_accepted == 1


def test_an_accepted_draft_token_that_completes_the_constraint_is_counted(runtime):
    """A looping answer whose constraint is complete at its 9th token: the pass after the first token checked 8
    drafted tokens and the answer took all 8 (tokens 2 to 9), the last one completing it. That one was not
    counted (7 of 8)."""
    sampling = SamplingConfig(max_new_tokens=40, logit_bias=((LOOP, 100.0),))
    prompt = [5, 17, 99, 3, LOOP, LOOP, LOOP]
    tokens, stats = generate(runtime.backend, prompt, sampling, set(), constraint=Script([LOOP] * 40, 9),
                             lookup=LookupConfig(max_draft=8))
    assert tokens == [LOOP] * 9
    assert stats.stop_reason == "complete"
    assert (stats.draft_tokens, stats.draft_accepted) == (8, 8)


def test_an_accepted_draft_token_that_a_stop_string_ends_at_is_counted(runtime):
    """A caller's ``on_token`` that raises to end the answer (a stop string found in the text) at the 5th token, a
    drafted and accepted one: the answer's ``stats`` counted 3 accepted of the 4 it took."""
    sampling = SamplingConfig(max_new_tokens=40, logit_bias=((LOOP, 100.0),))
    prompt = [5, 17, 99, 3, LOOP, LOOP, LOOP]
    stats = GenerationStats()
    with pytest.raises(StopString):
        generate(runtime.backend, prompt, sampling, set(), on_token=stop_string_at(5),
                 lookup=LookupConfig(max_draft=8), stats=stats)
    assert stats.draft_tokens == 8
    assert stats.draft_accepted == 4


def test_the_stats_of_an_answer_a_stop_string_ended_count_its_tokens(runtime):
    """``stats`` is passed in so that a caller whose ``on_token`` raises to end the answer (a stop string) still
    reads what happened; its ``new_tokens`` read 0 and its ``decode_s`` 0 there (no decode speed), though 6 tokens
    were taken in 5 decode steps."""
    stats = GenerationStats()
    with pytest.raises(StopString):
        generate(runtime.backend, [5, 17, 99, 3, 40], SamplingConfig(max_new_tokens=20), set(),
                 on_token=stop_string_at(6), stats=stats)
    assert stats.new_tokens == 6
    assert len(stats.token_latencies_s) == 5
    assert stats.decode_s > 0
    assert stats.decode_tok_s is not None
