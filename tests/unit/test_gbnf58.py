"""GBNF errors whose fix must be right as written, and JSON-string patterns that repeat the empty text."""

from __future__ import annotations

import re

import pytest

from edgesdk.runtime.gbnf import GrammarError, parse_grammar
from edgesdk.runtime.grammar import GrammarMatcher
from edgesdk.runtime.json_pattern import string_matcher


def _verdict(matcher: GrammarMatcher, text: str) -> str:
    state = matcher.feed(matcher.start(), text.encode())
    return "refused" if state is None else "complete" if matcher.accepts(state) else "prefix"


@pytest.mark.parametrize("char", ["\U000E0001", "\U000F0000", "\u200b", "\x7f"])
def test_the_string_an_unexpected_character_fix_offers_matches_that_character(char):
    # \u reads four hexadecimal digits: "\uE0001" was offered for U+E0001, which is U+E000 and a "1"
    with pytest.raises(GrammarError) as caught:
        parse_grammar(f'root ::= "a" {char}')
    written = re.search(r'write it in a string: (".*")$', caught.value.fix).group(1)
    matcher = GrammarMatcher(parse_grammar(f"root ::= {written}"))
    assert _verdict(matcher, char) == "complete"


@pytest.mark.parametrize(("source", "names", "not_named"), [
    # an empty rule left for later: its '::=' ends the line, so the next rule's name was read into it
    ('root ::= "a" todo\ntodo ::=\nother ::= "b"\n', ["'todo'", "'::='", '""'], ["parentheses", "'|'"]),
    ('root ::= "a" |\nb ::= "c"', ["'root'", "end none of its lines with a '|'"], ["parentheses", "'::='"]),
    ('root ::= (\n"a"\nb ::= "c"', ["'root'", "close its parentheses"], ["'|'", "'::='"]),
])
def test_a_rule_that_runs_into_the_next_is_told_the_cause_that_made_it_go_on(source, names, not_named):
    with pytest.raises(GrammarError) as caught:
        parse_grammar(source)
    assert "starts before the previous rule ended" in caught.value.problem
    for name in names:
        assert name in caught.value.fix
    for name in not_named:
        assert name not in caught.value.fix


@pytest.mark.parametrize("pattern", ["^()*a$", "^(?:)+a$", "^(?:){2,}a$", "^x(?:)*?a$"])
def test_a_pattern_that_repeats_an_empty_group_is_followed_not_refused_as_too_large(pattern):
    # ECMA-262 takes these (the group matches the empty text, any number of times); the grammar written for them
    # was ("")*, which the GBNF reader refuses as left recursion, and the pattern as "too large to follow"
    matcher = string_matcher(pattern)
    text = "xa" if pattern.startswith("^x") else "a"
    assert _verdict(matcher, text) == "complete"
    assert _verdict(matcher, text + "a") == "refused"
    assert re.fullmatch(pattern.strip("^$").replace("*?", "*"), text)
