"""JSON mode's numbers follow llama.cpp's number rule (common/json-schema-to-grammar.cpp, which its
json_object mode writes): ``"-"? integral-part ("." decimal-part)? ([eE] [-+]? integral-part)?`` with
``integral-part ::= [0] | [1-9] [0-9]{0,15}`` and ``decimal-part ::= [0-9]{1,16}``."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from edgesdk.runtime.json_mode import DONE, JsonConstraint, JsonState, feed

LLAMA_CPP_DIGITS = 16  # digits in each part of llama.cpp's number


def answer(number: str) -> JsonState | None:
    return feed(JsonState(), b'{"a": ' + number.encode() + b"}")


@pytest.mark.parametrize("number", ["1" * LLAMA_CPP_DIGITS, "-" + "9" * LLAMA_CPP_DIGITS, "0." + "0" * LLAMA_CPP_DIGITS, "1e" + "9" * LLAMA_CPP_DIGITS, "1E-0",
                                    "-0.5e+10", "1" * LLAMA_CPP_DIGITS + "." + "2" * LLAMA_CPP_DIGITS + "e-" + "3" * LLAMA_CPP_DIGITS])
def test_numbers_within_llama_cpp_caps_are_taken(number):
    state = answer(number)
    assert state is not None, number
    assert state.mode == DONE, number


@pytest.mark.parametrize("number", ["1" * (LLAMA_CPP_DIGITS + 1), "-" + "9" * (LLAMA_CPP_DIGITS + 1), "0." + "0" * (LLAMA_CPP_DIGITS + 1), "1e" + "9" * (LLAMA_CPP_DIGITS + 1), "1e05",
                                    "1E-01", "1e+00"])
def test_digits_past_llama_cpp_caps_or_an_exponents_leading_zero_are_refused(number):
    assert answer(number) is None, number


def test_a_number_token_stops_at_the_cap_and_the_number_can_still_end():
    """A model cannot stall in digits: after 16 integral digits only a point, an exponent or the
    number's end may follow, and what ends there parses (as Decimal and as JSON)."""
    constraint = JsonConstraint([b'{"a": ', b"1234", b"5", b"}", b".", b"e"])
    constraint.advance(0)
    for _ in range(4):
        constraint.advance(1)
    assert not constraint.allows(1)  # a 17th digit
    assert not constraint.allows(2)
    assert all(constraint.allows(token) for token in (3, 4, 5))  # the object's end, a point, an exponent
    constraint.advance(3)
    assert constraint.complete
    assert Decimal(str(json.loads('{"a": ' + "1234" * 4 + "}")["a"])) == Decimal("1234" * 4)


def test_a_walk_of_exponent_digits_stops_where_decimal_still_reads_the_number():
    """Digits fed one by one into an exponent stop at the cap: the number written is one Python's
    Decimal reads (uncapped, the walk went on to an exponent of 19 digits, which it refuses)."""
    state = feed(JsonState(), b'{"a": -1.5e+')
    written = b"-1.5e+"
    for _ in range(40):
        after = feed(state, b"7")
        if after is None:
            break
        state, written = after, written + b"7"
    assert written == b"-1.5e+" + b"7" * LLAMA_CPP_DIGITS
    assert Decimal(written.decode()).adjusted() == int(b"7" * LLAMA_CPP_DIGITS)
    assert feed(state, b"}").mode == DONE


def test_a_free_form_schema_value_refuses_an_exponents_leading_zero_as_llama_cpp_does():
    """A JSON Schema's free-form value (additionalProperties: true) scans numbers with JSON mode's
    automaton: its exponent is llama.cpp's integral-part too."""
    from edgesdk.runtime.json_schema import SchemaConstraint, compile_schema

    compiled = compile_schema({"type": "object", "additionalProperties": True})
    assert SchemaConstraint([b'{"a": 1e5}'], compiled).allows(0)
    assert not SchemaConstraint([b'{"a": 1e05}'], compiled).allows(0)


def test_a_free_form_schema_value_caps_a_numbers_digits_as_json_mode_does():
    """A free-form value's numbers follow llama.cpp's ``value`` rule, 16 digits a part, while a schema integer
    with a longer bound keeps its bound's digits."""
    from edgesdk.runtime.json_schema import SchemaConstraint, compile_schema

    free = compile_schema({"type": "object", "additionalProperties": True})
    sixteen, seventeen = b"1" * 16, b"1" * 17
    for number in (sixteen, b"1." + sixteen, b"1e" + sixteen):
        assert SchemaConstraint([b'{"a": ' + number + b"}"], free).allows(0)
    for number in (seventeen, b"1." + seventeen, b"1e" + seventeen):
        assert not SchemaConstraint([b'{"a": ' + number + b"}"], free).allows(0)
    wide = compile_schema({"type": "object", "properties": {"a": {"type": "integer", "maximum": 10**20}},
                           "required": ["a"]})
    assert SchemaConstraint([b'{"a": ' + b"1" * 20 + b"}"], wide).allows(0)
