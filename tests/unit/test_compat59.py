"""Anthropic's max_tokens / thinking budget rule, and llama.cpp's reading of large GBNF repetition counts."""

from __future__ import annotations

import pytest

from edgesdk.runtime.gbnf import GrammarError, parse_grammar
from edgesdk.runtime.grammar import GrammarMatcher
from edgesdk.serve.anthropic import parse_messages_request
from edgesdk.serve.api import ApiError

MESSAGES = [{"role": "user", "content": "Why is the sky blue?"}]


def _thinking(max_tokens, budget):
    return {"max_tokens": max_tokens, "messages": MESSAGES, "thinking": {"type": "enabled", "budget_tokens": budget}}


@pytest.mark.parametrize(("max_tokens", "budget", "fixes"), [
    (2048, 2048, ["at least 2049", "from 1024 to 2047", '"adaptive"']),
    (10, 2048, ["at least 2049", '"adaptive"']),
    (4096.0, 8192.0, ["at least 8193", "from 1024 to 4095"]),
])
def test_a_thinking_budget_not_below_max_tokens_is_refused_as_anthropic_refuses_it(max_tokens, budget, fixes):
    """Anthropic answers 400 "`max_tokens` must be greater than `thinking.budget_tokens`" (its extended thinking
    guide); edgesdk took such a request."""
    with pytest.raises(ApiError) as caught:
        parse_messages_request(_thinking(max_tokens, budget))
    error = caught.value
    assert error.status == 400
    assert error.param == "max_tokens"
    assert f"'max_tokens' {int(max_tokens)} must be greater than 'thinking.budget_tokens' {int(budget)}" in error.message
    for fix in fixes:
        assert fix in error.message
    if max_tokens <= 1024:
        assert "budget_tokens' from" not in error.message  # no budget below 1024 is taken


@pytest.mark.parametrize("thinking", [{"type": "enabled", "budget_tokens": 2048}, {"type": "adaptive"},
                                      {"type": "disabled"}])
def test_a_budget_below_max_tokens_and_thinking_without_a_budget_are_taken(thinking):
    request = parse_messages_request({"max_tokens": 2049, "messages": MESSAGES, "thinking": thinking})
    assert request.max_tokens == 2049
    small = parse_messages_request({"max_tokens": 16, "messages": MESSAGES, "thinking": {"type": "adaptive"}})
    assert small.template_kwargs == {"enable_thinking": True}


def test_the_token_count_route_s_stand_in_max_tokens_is_not_checked():
    """/v1/messages/count_tokens takes no max_tokens; the server parses its body with a stand-in and ``counting``,
    while a real request with max_tokens 1 and a budget is refused."""
    request = parse_messages_request(_thinking(1, 4096), counting=True)
    assert request.template_kwargs == {"enable_thinking": True}
    with pytest.raises(ApiError, match="'max_tokens' 1 must be greater"):
        parse_messages_request(_thinking(1, 4096))


@pytest.mark.parametrize("source", ['root ::= [a-z]{0,50000}', 'root ::= "a"{3,524288}', 'root ::= "a"{2,10001}'])
def test_a_maximum_past_the_counts_followed_is_read_as_none_as_llama_cpp_reads_it(source):
    """llama.cpp's parser reads a maximum past MAX_REPETITION_THRESHOLD (2000) as none (ggml-org/llama.cpp#26613:
    schemas write a large maxLength for "no limit"); edgesdk refused any count past 10,000."""
    matcher = GrammarMatcher(parse_grammar(source))
    state = matcher.feed(matcher.start(), b"a" * 12_000)
    assert state is not None
    assert matcher.accepts(state)
    assert matcher.feed(matcher.start(), b"a") is not None


def test_a_maximum_followed_exactly_still_ends_the_answer():
    matcher = GrammarMatcher(parse_grammar('root ::= "a"{0,10000}'))
    assert matcher.accepts(matcher.feed(matcher.start(), b"a" * 10_000))
    assert matcher.feed(matcher.start(), b"a" * 10_001) is None


def test_a_minimum_past_the_counts_followed_is_refused_naming_the_count_the_limit_and_the_fix():
    with pytest.raises(GrammarError) as caught:
        parse_grammar('root ::= "a"{20000,30000}')
    problem, fix = caught.value.problem, caught.value.fix
    assert "the repetition {20000,30000} repeats at least 20000 times, past the 10,000 followed here" in problem
    assert "MAX_REPETITION_THRESHOLD, 2,000" in problem
    assert '("a"{1000}){20}' in fix
    matcher = GrammarMatcher(parse_grammar('root ::= ("a"{1000}){20}'))  # the fix's grammar is taken
    assert matcher.accepts(matcher.feed(matcher.start(), b"a" * 20_000))
