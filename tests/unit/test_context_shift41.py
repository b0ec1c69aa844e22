"""The context shift of edgesdk/runtime/generate.py (llama.cpp's ``--context-shift`` / ``--keep``, Ollama's ``shift``):
a full context keeps its first ``n_keep`` tokens, drops the ``n_discard`` after them and goes on. Checked on a real
ONNX Runtime session of a tiny lively bundle with a 32-token context against a reference twin: generate run by hand on
the kept ids at each shift."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from edgesdk.errors import EdgeSDKError  # noqa: E402
from edgesdk.runtime.generate import ContextShift, SamplingConfig, generate, shaped  # noqa: E402
from edgesdk.runtime.lookup import LookupConfig  # noqa: E402
from edgesdk.runtime.prompt_cache import PromptCache  # noqa: E402

MAX_CONTEXT = 32
PROMPT = [5, 17, 99, 3, 250, 41, 8, 77, 120, 64]


@pytest.fixture(scope="module")
def lively(tmp_path_factory):
    from edgesdk.runtime.session import open_runtime
    from tests._utils.builds import build_lively_bundle

    bundle = build_lively_bundle(tmp_path_factory.mktemp("shift41"), seed=5, max_context=MAX_CONTEXT)
    return open_runtime(bundle.path, threads=1)


def _twin(backend, prompt: list[int], tokens: int, n_keep: int, n_discard: int) -> list[int]:
    """The answer a context shift should give, built by hand: greedy generate until the context is full, then at each
    shift generate again from the kept ids and the token that did not fit, taking the token its prefill predicts."""
    sampling = SamplingConfig(max_new_tokens=tokens)
    answer, stats = generate(backend, prompt, sampling, set())
    held = list(prompt) + answer[:-1]  # what the cache holds before the last token
    while len(answer) < tokens:
        assert stats.stop_reason == "max_context"
        assert len(held) == MAX_CONTEXT
        held = held[:n_keep] + held[n_keep + n_discard:]
        more, stats = generate(backend, [*held, answer[-1]], SamplingConfig(max_new_tokens=tokens - len(answer)),
                               set())
        held = [*held, answer[-1], *more[:-1]]
        answer += more
    return answer


@pytest.mark.parametrize(("keep", "n_keep"), [(0, 0), (4, 4), (-1, len(PROMPT))])
def test_a_greedy_answer_longer_than_the_context_equals_its_reference_twin(lively, keep, n_keep):
    backend = lively.backend
    tokens = 3 * MAX_CONTEXT
    answer, stats = generate(backend, PROMPT, SamplingConfig(max_new_tokens=tokens), set(),
                             shift=ContextShift(keep=keep))
    n_discard = (MAX_CONTEXT - n_keep) // 2
    assert answer == _twin(backend, PROMPT, tokens, n_keep, n_discard)
    assert (len(answer), stats.new_tokens, stats.stop_reason) == (tokens, tokens, "max_new_tokens")
    assert stats.context_shifts >= 2
    assert len(answer) + len(PROMPT) > MAX_CONTEXT


def test_shifting_off_still_stops_at_the_full_context(lively):
    answer, stats = generate(lively.backend, PROMPT, SamplingConfig(max_new_tokens=3 * MAX_CONTEXT), set())
    assert (len(answer), stats.stop_reason, stats.context_shifts) == (MAX_CONTEXT - len(PROMPT) + 1, "max_context", 0)


def test_keep_counts_the_bos_on_top_and_a_given_discard_is_taken(lively):
    backend = lively.backend
    answer, _ = generate(backend, PROMPT, SamplingConfig(max_new_tokens=2 * MAX_CONTEXT), set(),
                         shift=ContextShift(keep=2, discard=5, bos=True))
    assert answer == _twin(backend, PROMPT, 2 * MAX_CONTEXT, 3, 5)


def test_the_prompt_cache_holds_the_shifted_tokens_and_serves_the_next_prompt(lively):
    backend = lively.backend
    cache = PromptCache(backend)
    tokens = 2 * MAX_CONTEXT
    answer, _ = generate(backend, PROMPT, SamplingConfig(max_new_tokens=tokens), set(), cache=cache,
                         shift=ContextShift(keep=4))
    assert answer == _twin(backend, PROMPT, tokens, 4, (MAX_CONTEXT - 4) // 2)
    # The cache was rewound to the twin's last prompt and run on; redo the shifted run to check its own record.
    answer, _ = generate(backend, PROMPT, SamplingConfig(max_new_tokens=tokens), set(), cache=cache,
                         shift=ContextShift(keep=4))
    assert len(cache.tokens) == backend.position
    assert cache.tokens[:4] == PROMPT[:4]
    assert cache.tokens[-1] == answer[-2]
    # The next prompt starting with what the cache holds prefills only what follows it, and answers as a whole
    # prefill of it does.
    follow = [*cache.tokens, answer[-1]]
    reused, stats = generate(backend, follow, SamplingConfig(max_new_tokens=4), set(), cache=cache)
    assert stats.cached_tokens == len(follow) - 1
    whole, _ = generate(backend, follow, SamplingConfig(max_new_tokens=4), set())
    assert reused == whole


def test_drafts_go_on_after_a_shift_and_change_no_token(lively):
    backend = lively.backend
    tokens = 3 * MAX_CONTEXT
    plain, _ = generate(backend, PROMPT, SamplingConfig(max_new_tokens=tokens), set(), shift=ContextShift(keep=4))
    drafted, stats = generate(backend, PROMPT, SamplingConfig(max_new_tokens=tokens), set(),
                              lookup=LookupConfig(max_draft=4, ngram_min=1), shift=ContextShift(keep=4))
    assert drafted == plain
    assert stats.context_shifts >= 2
    assert stats.draft_tokens > 0
    assert backend.position <= MAX_CONTEXT


def _stepwise(backend, prompt: list[int], sampling: SamplingConfig, n_keep: int, n_discard: int) -> list[int]:
    """The greedy answer picked step by step from a whole prefill of what the context holds, shifted by hand where it
    is full, the penalties (repeat_last_n -1) looking back over the last n_ctx tokens of prompt and answer (llama.cpp's
    penalty sampler keeps its own ring of them, which a shift of the KV cache leaves as it is)."""
    held, history, answer = list(prompt), list(prompt), []
    while len(answer) < sampling.max_new_tokens:
        backend.reset()
        logits = backend.prefill(np.asarray(held, np.int64), keep_logits=1)[-1]
        token = int(np.argmax(shaped(logits, history[-MAX_CONTEXT:], sampling)))  # -1: the last n_ctx
        answer.append(token)
        history.append(token)
        if len(held) == MAX_CONTEXT:
            held = held[:n_keep] + held[n_keep + n_discard:]
        held.append(token)
    return answer


def test_penalties_and_logprobs_go_on_across_a_shift(lively):
    from edgesdk.runtime.logprobs import LogprobRecorder

    backend = lively.backend
    sampling = SamplingConfig(max_new_tokens=2 * MAX_CONTEXT, repeat_penalty=1.5, repeat_last_n=-1,
                              frequency_penalty=0.5)
    recorder = LogprobRecorder(top=2)
    answer, stats = generate(backend, PROMPT, sampling, set(), logprobs=recorder, shift=ContextShift(keep=4))
    assert stats.context_shifts >= 2
    assert answer == _stepwise(backend, PROMPT, sampling, 4, (MAX_CONTEXT - 4) // 2)
    assert [entry.token for entry in recorder.answer] == answer


@pytest.mark.parametrize(("shift", "named"), [
    (ContextShift(keep=MAX_CONTEXT), f"keep {MAX_CONTEXT} keeps {MAX_CONTEXT} tokens"),
    (ContextShift(keep=MAX_CONTEXT - 1, bos=True), f"keeps {MAX_CONTEXT} tokens"),
    (ContextShift(keep=2, discard=MAX_CONTEXT), f"discard {MAX_CONTEXT} is more than the {MAX_CONTEXT - 2}"),
])
def test_a_keep_that_leaves_nothing_to_discard_is_refused_before_anything_runs(lively, shift, named):
    long_prompt = (PROMPT * 4)[:MAX_CONTEXT]
    with pytest.raises(EdgeSDKError, match=named) as caught:
        generate(lively.backend, long_prompt, SamplingConfig(max_new_tokens=8), set(), shift=shift)
    assert "max_context of 32" in caught.value.problem
    assert caught.value.fix


def test_the_whole_prompt_kept_is_refused_only_where_the_answer_reaches_the_full_context(lively):
    prompt = (PROMPT * 4)[:MAX_CONTEXT]
    answer, stats = generate(lively.backend, prompt, SamplingConfig(max_new_tokens=1), set(),
                             shift=ContextShift(keep=-1))
    assert (len(answer), stats.context_shifts) == (1, 0)
    with pytest.raises(EdgeSDKError, match="keep -1 \\(the whole prompt of 32 tokens\\) keeps 32 tokens"):
        generate(lively.backend, prompt, SamplingConfig(max_new_tokens=2), set(), shift=ContextShift(keep=-1))


@pytest.mark.parametrize(("field", "value"), [("keep", -2), ("keep", 1.5), ("keep", True), ("discard", -1)])
def test_a_context_shift_setting_that_is_no_count_is_refused_by_name(field, value):
    with pytest.raises(ValueError, match=f"context shift {field}"):
        ContextShift(**{field: value})


def _window_twin(backend, prompt: list[int], tokens: int, window: int, n_keep: int, n_discard: int) -> list[int]:
    """:func:`_twin` within a context ``window`` smaller than the bundle's: each greedy run is cut where the tokens
    the cache holds reach the window."""
    answer, _ = generate(backend, prompt, SamplingConfig(max_new_tokens=min(tokens, window - len(prompt) + 1)), set())
    held = list(prompt) + answer[:-1]
    while len(answer) < tokens:
        assert len(held) == window
        held = held[:n_keep] + held[n_keep + n_discard:]
        more, _ = generate(backend, [*held, answer[-1]],
                           SamplingConfig(max_new_tokens=min(tokens - len(answer), window - len(held))), set())
        held = [*held, answer[-1], *more[:-1]]
        answer += more
    return answer


def test_a_window_below_the_bundle_s_context_shifts_within_it(lively):
    """Ollama's ``num_ctx`` below the bundle's context: the answer shifts when the tokens held reach the window."""
    backend, window = lively.backend, 20
    tokens = 3 * MAX_CONTEXT
    answer, stats = generate(backend, PROMPT, SamplingConfig(max_new_tokens=tokens), set(),
                             shift=ContextShift(keep=4, window=window))
    assert answer == _window_twin(backend, PROMPT, tokens, window, 4, (window - 4) // 2)
    assert stats.context_shifts > 3 * MAX_CONTEXT // window
    assert backend.position <= window
    with pytest.raises(ValueError, match="window must be a whole number of tokens >= 2"):
        ContextShift(window=1)
    with pytest.raises(EdgeSDKError, match="leaves nothing to discard in the context window of 10"):
        generate(backend, PROMPT, SamplingConfig(max_new_tokens=tokens), set(),
                 shift=ContextShift(keep=-1, window=len(PROMPT)))
