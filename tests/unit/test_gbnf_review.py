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


def test_a_repetition_of_a_repetition_that_writes_out_millions_of_symbols_is_refused():
    # each repetition copies what it repeats: {1000}{1000} of a two-character literal is two million
    # symbols ({1000}{1000}{1000} would be two billion, past any board's memory)
    with pytest.raises(GrammarError, match=r"write out 2,002,000 symbols, past 1,000,000") as caught:
        parse_grammar('root ::= "ab"{1000}{1000}')
    assert "line 1, column 20" in caught.value.problem
    assert "in parentheses" in caught.value.fix
    grammar = parse_grammar('root ::= ("ab"{1000}){1000}')  # the form the fix names: the group is written once
    assert len(grammar.alternatives[grammar.rules[grammar.root][0]]) == 1000
    assert _matches('root ::= "ab"{10}{0,10}', "ab" * 40)
    assert not _matches('root ::= "ab"{10}{0,10}', "ab" * 5)


@pytest.mark.parametrize(("source", "problem", "fix"), [
    # a symbol the language does not have is named as such, not as a group left open
    ('root ::= ( "a" ! )', "line 1, column 16: unexpected '!' in the rule 'root' (at '! )')", "!<[id]> or !<text>"),
    ('root ::= ("a" ; "b")', "line 1, column 15: unexpected ';' in the rule 'root'", 'write it in a string: ";"'),
    ("root ::= 'yes' | 'no'", "line 1, column 10: unexpected \"'\" in the rule 'root'", "double quotes"),
    ('root ::= "a" \\ "b"', "unexpected '\\\\'", 'write it in a string: "\\\\"'),
    # a continuation line that starts with '|', as in other BNF dialects, is not one in llama.cpp's
    ('root ::= "a"\r\n  | "b"\r\n', "line 2, column 3: expected a rule name (letters, digits, '-' or '_') (at '| \"b\"')",
     "after a '|' that ends the line"),
    ('root ::= [a-z\nb ::= "x"', "the character class is not closed (at the end of the line)", "same line"),
])
def test_errors_name_the_character_that_is_wrong_and_how_to_write_it(source, problem, fix):
    with pytest.raises(GrammarError) as caught:
        parse_grammar(source)
    assert problem in caught.value.problem
    assert fix in caught.value.fix
