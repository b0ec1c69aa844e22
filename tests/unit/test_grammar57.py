"""A backwards class range's fix is written as GBNF reads it; JSON mode takes only the tokens it allows; a tokenizer
constrained answers cannot read is refused naming every constraint."""

import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.gbnf import GrammarError, parse_grammar
from edgesdk.runtime.json_mode import JsonConstraint, token_bytes_table


def _fix_of(source: str) -> str:
    with pytest.raises(GrammarError) as caught:
        parse_grammar(source)
    return str(caught.value).split("fix: write it as ", 1)[1]


@pytest.mark.parametrize(("written", "low", "high"), [
    ("[\\]-\\[]", ord("["), ord("]")),  # [ and ] open and close a class: its fix needs their escapes
    ("[\\x1f-\\n]", 0x0A, 0x1F),  # a line break and a control character, written as escapes, not raw
    ("[z-^]", ord("^"), ord("z")),  # ^ first in a class would negate it
])
def test_backwards_range_fix_is_a_class_that_reads_as_the_swapped_range(written, low, high):
    fix = _fix_of(f"root ::= {written}")
    assert "\n" not in fix
    assert "\x1f" not in fix
    (element,) = parse_grammar(f"root ::= [{fix}]").alternatives[0]
    assert element[1:] == (((low, high),), False)


TABLE = [b"{", b"}", b'"', None, b"x"]  # 3: a special token (end of text), no bytes


@pytest.mark.parametrize("token", [3, -1, -5, len(TABLE)])
def test_json_advance_refuses_what_allows_refuses(token):
    constraint = JsonConstraint(TABLE)
    assert not constraint.allows(token)
    with pytest.raises(ValueError, match=f"token {token} does not continue the JSON answer"):
        constraint.advance(token)
    assert constraint.state == JsonConstraint(TABLE).state


def test_json_advance_negative_id_is_not_read_from_the_end_of_the_table():
    constraint = JsonConstraint([b"x", b"{"])
    assert not constraint.allows(-1)
    with pytest.raises(ValueError, match="token -1 does not continue"):
        constraint.advance(-1)  # was read as token 1, "{", and opened the object
    assert constraint.state.mode == "top"
    assert constraint.allows(1)


def test_unreadable_tokenizer_is_refused_for_every_constraint_not_only_json_mode():
    """The token table serves a --grammar or json_schema answer too: the refusal named only JSON mode and told to
    leave out --json, which a grammar request never passed."""
    from tokenizers import Tokenizer, decoders, models

    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tokenizer.decoder = decoders.WordPiece()
    with pytest.raises(EdgeSDKError) as caught:
        token_bytes_table(tokenizer, 2)
    assert "GBNF grammar" in caught.value.problem
    assert "WordPiece" in caught.value.problem
    assert "--grammar" in caught.value.fix
    assert "--json-schema" in caught.value.fix


def test_negated_token_missing_from_the_vocabulary_is_not_told_to_become_a_string():
    """A string "<foo>" matches the text; !<foo> means any token but it: the fix must keep the negation."""
    from edgesdk.runtime.grammar import GrammarMatcher

    with pytest.raises(GrammarError) as caught:
        GrammarMatcher(parse_grammar('root ::= !<foo> "a"'), lambda text: None)
    assert "!<foo>" in caught.value.problem
    assert "!<[" in caught.value.fix
    assert '"<foo>"' not in caught.value.fix
    with pytest.raises(GrammarError) as caught:
        GrammarMatcher(parse_grammar("root ::= <foo>"), lambda text: None)
    assert '"<foo>"' in caught.value.fix
