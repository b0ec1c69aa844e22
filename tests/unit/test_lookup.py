"""Prompt lookup decoding: the n-gram drafter, and generate() with drafts against without them."""

from __future__ import annotations

import random

import pytest

from edgesdk.runtime.lookup import LookupConfig, NgramDrafter


def _reference_draft(tokens: list[int], config: LookupConfig, limit: int) -> list[int]:
    """The draft by a plain scan: the latest earlier occurrence of the longest suffix that has one, followed through
    the text extended by the draft itself (a continuation that reaches the end goes on with what it drafted)."""
    for n in range(min(config.ngram_max, len(tokens)), config.ngram_min - 1, -1):
        suffix = tokens[len(tokens) - n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                extended = list(tokens)
                for index in range(start + n, start + n + min(limit, config.max_draft)):
                    extended.append(extended[index])
                return extended[len(tokens):]
    return []


def test_draft_follows_the_latest_earlier_occurrence_of_the_longest_suffix():
    drafter = NgramDrafter(LookupConfig(max_draft=3, ngram_max=2, ngram_min=1), [1, 2, 3, 4, 9, 2, 3, 5, 6, 2])
    assert drafter.draft() == [3, 5, 6]  # "2" last came before "3 5 6"
    drafter.push(3)
    assert drafter.draft() == [5, 6, 2]  # "2 3": its latest occurrence is followed by 5 6 2
    assert drafter.draft(limit=1) == [5]
    assert drafter.draft(limit=0) == []
    assert NgramDrafter(LookupConfig(), [7, 8, 9]).draft() == []  # nothing repeats


@pytest.mark.parametrize("seed", range(5))
def test_the_index_finds_what_a_scan_finds(seed):
    rng = random.Random(seed)
    config = LookupConfig(max_draft=rng.randint(1, 6), ngram_max=rng.randint(1, 4), ngram_min=1)
    config = LookupConfig(config.max_draft, config.ngram_max, rng.randint(1, config.ngram_max))
    drafter = NgramDrafter(config)
    tokens: list[int] = []
    for _ in range(300):
        token = rng.randint(0, 5)
        tokens.append(token)
        drafter.push(token)
        limit = rng.randint(0, 8)
        assert drafter.draft(limit) == _reference_draft(tokens, config, limit), (tokens, config, limit)


@pytest.mark.parametrize(("fields", "message"), [
    ({"max_draft": 0}, "max_draft must be a whole number >= 1"),
    ({"ngram_min": 0}, "ngram_min must be"),
    ({"ngram_max": 2, "ngram_min": 3}, "must not exceed"),
    ({"max_draft": True}, "max_draft must be"),
    ({"max_draft": 65}, "max_draft must be at most 64"),
])
def test_bad_settings_are_refused_by_name(fields, message):
    with pytest.raises(ValueError, match=message):
        LookupConfig(**fields)


# ------------------------------------------------------------------------------------- on a tiny bundle


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


def _generate(runtime, prompt: list[int], lookup, **fields):
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.prompt_cache import PromptCache

    cache = PromptCache(runtime.backend)
    tokens, stats = generate(runtime.backend, prompt, SamplingConfig(**{"max_new_tokens": 60, **fields}),
                             runtime.tokenizer.eos_token_ids, cache=cache, lookup=lookup)
    assert runtime.backend.position == len(cache.tokens)  # refused draft tokens left the cache
    assert cache.tokens == [*prompt, *tokens][:len(cache.tokens)]
    return tokens, stats


REPEATING = [5, 6, 7, 8, 9, 10] * 6


# The tiny model's logits are flat (its most likely token has about a tenth of the mass at temperature 0.8): a draw
# from all of them repeats nothing a draft could follow, so the sampled runs keep the two most likely tokens (top-k 2,
# llama.cpp's sampler), whose draws still differ from the greedy answer and repeat enough for drafts to be taken.
@pytest.mark.parametrize(("temperature", "seed"), [(0.0, None), (0.8, 1), (1.2, 2)])
def test_drafts_give_the_answer_decoding_token_by_token_gives(runtime, temperature, seed):
    fields = {"temperature": temperature, "seed": seed, "top_k": 2 if temperature > 0 else 0}
    plain, plain_stats = _generate(runtime, REPEATING, None, **fields)
    drafted, stats = _generate(runtime, REPEATING, LookupConfig(max_draft=4), **fields)
    if temperature > 0:  # sampled, not the greedy answer
        assert plain != _generate(runtime, REPEATING, None)[0]
    assert drafted == plain
    assert stats.stop_reason == plain_stats.stop_reason
    assert stats.draft_tokens > 0
    assert 0 < stats.draft_accepted <= stats.draft_tokens  # some drafts were taken, some steps saved
    assert plain_stats.draft_tokens == 0


def test_drafts_stop_at_the_context_and_under_a_grammar(runtime):
    from edgesdk.runtime.gbnf import parse_grammar
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.grammar import GrammarConstraint

    near_end = (REPEATING * 8)[: runtime.backend.max_context - 10]
    plain, plain_stats = _generate(runtime, near_end, None)
    drafted, stats = _generate(runtime, near_end, LookupConfig(max_draft=8))
    assert (drafted, stats.stop_reason) == (plain, plain_stats.stop_reason)
    assert len(near_end) + len(drafted) <= runtime.backend.max_context + 1
    tokenizer = runtime.tokenizer
    answers = []
    for lookup in (None, LookupConfig()):
        constraint = GrammarConstraint(tokenizer.token_bytes(), parse_grammar('root ::= ("ab" | "abc"){3,9} "."'),
                                       tokenizer.eos_token_ids)
        tokens, stats = generate(runtime.backend, REPEATING, SamplingConfig(max_new_tokens=60),
                                 tokenizer.eos_token_ids, constraint=constraint, lookup=lookup)
        answers.append((tokens, stats.stop_reason))
    assert answers[0] == answers[1]
    assert answers[0][1] == "complete"


def test_a_backend_that_cannot_rewind_decodes_token_by_token(runtime):
    from edgesdk.runtime.generate import SamplingConfig, generate
    from tests._utils.backends import NoRewind

    tokens, stats = generate(NoRewind(runtime.backend), REPEATING, SamplingConfig(max_new_tokens=30),
                             runtime.tokenizer.eos_token_ids, lookup=LookupConfig())
    assert stats.draft_tokens == 0
    assert tokens == _generate(runtime, REPEATING, None, max_new_tokens=30)[0]


def test_run_and_serve_with_lookup_answer_as_without(tiny_bundle, runtime):
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_cli import assert_ok, invoke
    from tests.unit.test_serve import Served

    prompt = "one two three four " * 12
    plain = invoke("run", tiny_bundle.path, "--prompt", prompt, "--raw", "-n", 40, "--threads", 1)
    drafted = invoke("run", tiny_bundle.path, "--prompt", prompt, "--raw", "-n", 40, "--threads", 1, "--lookup", 4,
                     "--stats")
    assert_ok(plain)
    assert_ok(drafted)
    assert drafted.stdout == plain.stdout
    assert " taken" in drafted.stderr
    assert invoke("run", tiny_bundle.path, "--prompt", "x", "--lookup", -1).exit_code == 2
    answers = []
    for lookup in (0, 4):
        server = Served(runtime, ServeDefaults(max_tokens=40, lookup=lookup))
        try:
            assert (server.completer.lookup is None) == (lookup == 0)
            status, answer = server.post("/v1/completions", {"prompt": prompt})
            assert status == 200, answer
            answers.append(answer["choices"][0]["text"])
        finally:
            server.close()
    assert answers[0] == answers[1]
    for bad in (-1, 65, True, 2.0):
        with pytest.raises(ValueError, match="lookup must be 0 .off. or a whole number of draft tokens up to 64"):
            ServeDefaults(lookup=bad)
    assert invoke("run", tiny_bundle.path, "--prompt", "x", "--lookup", 65).exit_code == 2
