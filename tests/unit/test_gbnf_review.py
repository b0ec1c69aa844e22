"""GBNF grammars, review: llama.cpp's grammars read the same way, crashes on unusual grammars, and
property checks of the matcher and the constraint over texts generated from grammars."""

from __future__ import annotations

import pytest

from edgesdk.runtime.gbnf import GrammarError, parse_grammar
from edgesdk.runtime.grammar import GrammarMatcher


def _matches(source: str, text: str | bytes) -> bool:
    matcher = GrammarMatcher(parse_grammar(source))
    state = matcher.feed(matcher.start(), text.encode() if isinstance(text, str) else text)
    return state is not None and matcher.accepts(state)


def test_a_long_run_of_rules_that_may_match_nothing_is_matched_without_a_recursion_error():
    # each optional w is a rule the matcher steps through before it finds a character: the run
    # is longer than Python's recursion limit
    source = "root ::= " + "w " * 1500 + '"!"\nw ::= "x"?\n'
    assert _matches(source, "!")
    assert _matches(source, "xx!")
    assert not _matches(source, "x?")


@pytest.mark.parametrize(("source", "message"), [
    ('root ::= "a"{²}', "is not {m}"),
    ('root ::= "a"{1,³}', "is not {m}"),
    ('root ::= <[²]>', "not a whole number"),
])
def test_digits_other_than_ascii_in_counts_and_token_ids_are_refused_as_a_grammar_error(source, message):
    with pytest.raises(GrammarError, match=message):
        parse_grammar(source)
