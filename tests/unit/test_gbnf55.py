"""GBNF repetition counts and terminals read as llama.cpp's grammar parser reads them."""

from __future__ import annotations

import pytest

from edgesdk.runtime.gbnf import GrammarError, parse_grammar
from edgesdk.runtime.grammar import GrammarMatcher


def _verdict(source: str, text: str) -> str:
    matcher = GrammarMatcher(parse_grammar(source))
    state = matcher.feed(matcher.start(), text.encode())
    return "refused" if state is None else "complete" if matcher.accepts(state) else "prefix"


@pytest.mark.parametrize(("source", "where"), [
    ('root ::= "a"{,2}', "line 1, column 13"),  # parse_sequence: "expecting an int"
    ('root ::= "a"{ ,2}', "line 1, column 13"),
    ('root ::= "a"{2\n}', "line 1, column 13"),  # outside parentheses a line break ends the rule
    ('root ::= "x"\nr ::= "a"{2,\n3}', "line 2, column 10"),
])
def test_a_repetition_count_llama_cpp_refuses_is_refused_naming_where(source, where):
    with pytest.raises(GrammarError) as caught:
        parse_grammar(source)
    assert where in caught.value.problem
    assert "is not {m}, {m,} or {m,n}" in caught.value.problem
    assert "{0,n}" in caught.value.fix


@pytest.mark.parametrize(("source", "text"), [
    ('root ::= ("a"{1 # one\n})', "a"),  # inside parentheses comments and line breaks are space
    ('root ::= ("a"{\n2\n,\n3\n})', "aaa"),
    ('root ::= "a"{ 2 , } "b"', "aaab"),
    ('root ::= "a"{0,2}', "aa"),
])
def test_a_repetition_count_llama_cpp_takes_is_taken(source, text):
    assert _verdict(source, text) == "complete"
    assert _verdict(source, text + "a") == "refused"


@pytest.mark.parametrize(("source", "where"), [
    ('root ::= "a" "\\uD800"', "line 1, column 15"),
    ('root ::= "a" [\\uD800-\\uDFFF]', "line 1, column 14"),
    ('root ::= "a"\nx ::= [^\\x00-\\U0010FFFF]', "line 2, column 7"),
    ('root ::= "a" [^\\x00-\\uD7FF\\uE000-\\U0010FFFF]', "line 1, column 14"),
])
def test_a_terminal_only_utf16_surrogates_could_match_is_refused_naming_where(source, where):
    """No UTF-8 text holds a surrogate, so the matcher never reads one: such a terminal took the "a" before it and
    then left no byte to take, a stall at decoding time instead of an error naming the terminal."""
    with pytest.raises(GrammarError) as caught:
        parse_grammar(source)
    assert where in caught.value.problem
    assert "surrogate" in caught.value.problem


@pytest.mark.parametrize(("source", "text"), [
    ('root ::= [\\uD000-\\uDFFF]', "\ud7ff"),  # the class keeps U+D000-U+D7FF
    ('root ::= [^\\x00-\\uD7FF\\uE001-\\U0010FFFF]', "\ue000"),
    ('root ::= [^a]', "\U0001F600"),
])
def test_a_class_that_takes_a_character_beside_the_surrogates_is_taken(source, text):
    assert _verdict(source, text) == "complete"
