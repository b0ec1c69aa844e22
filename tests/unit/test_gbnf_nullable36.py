"""Rules that come back to themselves through rules that can match the empty text, without llama.cpp: taken
and matched where llama.cpp takes them (its ``llama_grammar_detect_left_recursion`` counts as empty only a
rule with an empty alternative, and its ``llama_grammar_advance_stack`` expands a stack once), refused where
its expansion never ends. ``test_grammar_llama_cpp36.py`` checks the same grammars against llama.cpp."""

from __future__ import annotations

import pytest

from edgesdk.runtime.gbnf import GrammarError, parse_grammar
from edgesdk.runtime.grammar import GrammarMatcher


def _verdict(source: str, text: bytes) -> str:
    matcher = GrammarMatcher(parse_grammar(source))
    state = matcher.feed(matcher.start(), text)
    return "refused" if state is None else "complete" if matcher.accepts(state) else "prefix"


@pytest.mark.parametrize(("source", "verdicts"), [
    ('root ::= ("x"?)*', {b"": "complete", b"xx": "complete", b"xy": "refused"}),
    ('root ::= (ws)*\nws ::= | " "', {b"": "complete", b"  ": "complete", b" x": "refused"}),
    ('root ::= a\na ::= b a | "y"\nb ::= c\nc ::= | "z"', {b"": "prefix", b"zz": "prefix", b"zzy": "complete",
                                                            b"yz": "refused"}),
    ('root ::= ("x"? "c"?)* "y"', {b"": "prefix", b"xccxy": "complete", b"yx": "refused"}),
    ('root ::= x\nx ::= y x | "!"\ny ::= ("a"?)*', {b"": "prefix", b"aa": "prefix", b"aa!": "complete"}),
    ('root ::= "q"\na ::= b a "x" | "y"\nb ::= "z"?', {b"": "prefix", b"q": "complete", b"qz": "refused"}),
])
def test_a_rule_that_comes_back_through_empty_ones_last_in_its_alternative_is_taken_and_matched(source, verdicts):
    for text, verdict in verdicts.items():
        assert _verdict(source, text) == verdict, (source, text)


def test_the_expansion_through_rules_that_match_nothing_ends_where_it_came_back_to_a_stack_it_had():
    """``("x"?)*`` expands R ::= G R | to G, to "x"? and to its empty alternative, and so to R again: the
    same stack, which the walk has seen, so it stops (llama_grammar_advance_stack's ``seen``). Nested, the
    stacks stay two however many x are read: "x" on top, and the empty one (the whole text matched)."""
    matcher = GrammarMatcher(parse_grammar('root ::= ((("x"?)*)*)*'))
    state = matcher.start()
    assert len(state[0]) == 2
    for _ in range(3):
        state = matcher.feed(state, b"x")
        assert matcher.accepts(state)
        assert len(state[0]) == 2


@pytest.mark.parametrize(("source", "where"), [
    ('root ::= a\na ::= b a "x" | "y"\nb ::= "z"?', "line 2, column 9"),
    ('root ::= x\nx ::= y x "e" | "!"\ny ::= ("a"?)*', "line 2, column 9"),
])
def test_a_rule_that_comes_back_through_empty_ones_with_more_after_is_refused_naming_where(source, where):
    with pytest.raises(GrammarError) as caught:
        parse_grammar(source)
    assert where in caught.value.problem
    assert "can come back to itself here without reading a character" in caught.value.problem
    assert "has more to read after it" in caught.value.problem
    assert "read at least one character" in caught.value.fix


def test_a_long_chain_of_rules_that_match_nothing_through_each_other_is_checked_without_deep_recursion():
    """Nullable rules and their strongly connected components are found without Python recursion."""
    count = 3000
    rules = [f"r{index} ::= r{index + 1}" for index in range(count)] + [f"r{count} ::= \"a\"?"]
    grammar = parse_grammar("root ::= (r0)* \"!\"\n" + "\n".join(rules))
    assert len(grammar.rules) > count
    assert _verdict("root ::= (r0 r1)* \"!\"\nr0 ::= \"a\"?\nr1 ::= \"b\"?", b"abba!") == "complete"
