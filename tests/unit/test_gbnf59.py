"""Review 59 of GBNF grammars, the grammar matcher and JSON-schema patterns (edgesdk/runtime/gbnf.py, grammar.py,
json_pattern.py) against llama.cpp's src/llama-grammar.cpp and grammars/README.md."""

from __future__ import annotations

import pytest

from edgesdk.runtime.gbnf import GrammarError, parse_grammar
from edgesdk.runtime.grammar import GrammarMatcher
from edgesdk.runtime.json_pattern import PatternError, string_matcher
from tests.unit.test_json_schema_allof40 import _takes


def _verdict(matcher: GrammarMatcher, text: str) -> str:
    state = matcher.feed(matcher.start(), text.encode())
    return "refused" if state is None else "complete" if matcher.accepts(state) else "prefix"


# ------------------------------------------------------------------- a pattern read over every character


@pytest.mark.parametrize("pattern", ["^a|\\uD800$", "^a\\uD800?$", "^(?:a|[\\uDC00-\\uDFFF]+)$"])
def test_a_pattern_with_a_lone_surrogate_it_can_skip_is_followed_over_every_character(pattern):
    # the enum filter reads a pattern over every character; a class of surrogates only was written into its grammar,
    # which refuses such a class, and the pattern was refused as "too large to follow"
    matcher = string_matcher(pattern, every=True)
    assert _verdict(matcher, "a") == "complete"
    assert _verdict(matcher, "b") == "refused"


def test_an_enum_beside_a_pattern_with_a_lone_surrogate_keeps_the_values_it_matches():
    schema = {"type": "object", "properties": {"v": {"enum": ["a", "b"], "pattern": "^a|\\uD800$"}},
              "required": ["v"]}
    assert _takes(schema, '{"v":"a"}')
    assert not _takes(schema, '{"v":"b"}')


def test_a_pattern_that_needs_a_lone_surrogate_is_refused_naming_it_over_every_character():
    with pytest.raises(PatternError) as caught:
        string_matcher("^x\\uD800$", every=True)
    assert "half of a UTF-16 surrogate pair" in caught.value.problem
    assert "too large" not in caught.value.problem
    assert "\\uD83D\\uDE00" in caught.value.fix
    with pytest.raises(PatternError, match=r"an empty class \[\] that cannot be skipped"):
        string_matcher("x[]", every=True)


# ------------------------------------------------------------------------------------ token terminals


@pytest.mark.parametrize("source", ["root ::= <[12>", "root ::= <[12] >", "root ::= !<[1]x>", 'root ::= <[1] "x>"'])
def test_a_token_id_left_unclosed_is_refused_where_it_is_written(source):
    # llama.cpp's parse_token reads '<[' as the start of an id and refuses what does not end it with ']>'; it was
    # taken here as the text of a token ('<[12>'), refused only later, against the model, as "not one token"
    with pytest.raises(GrammarError) as caught:
        parse_grammar(source)
    assert "line 1, column 10" in caught.value.problem
    assert "is not a whole number between '<[' and ']>'" in caught.value.problem
    assert "<[1000]>" in caught.value.fix


def test_a_token_id_and_a_token_text_are_still_read():
    ((id_element,),) = parse_grammar("root ::= <[12]>").alternatives
    ((text_element,),) = parse_grammar("root ::= !<think>").alternatives
    assert id_element == ("t", 12, False)
    assert text_element == ("t", "<think>", True)
