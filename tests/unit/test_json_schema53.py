"""The JSON schema constraint's unique arrays of numbers and long integer bounds (edgesdk/runtime/json_schema.py),
and the fuzz test's own checker (tests/unit/test_json_schema_fuzz37.py) on numbers it once stalled or misread."""

from __future__ import annotations

import json
from decimal import Decimal

from edgesdk.runtime import json_schema
from edgesdk.runtime.json_schema import SchemaConstraint, compile_schema
from tests.unit import test_json_schema_fuzz37 as fuzz

BYTES = [bytes([b]) for b in range(256)]


def _unique_array(items: dict) -> dict:
    return {"type": "object", "properties": {"v": {"type": "array", "items": items, "uniqueItems": True}},
            "required": ["v"]}


def _after(schema: dict, text: bytes) -> SchemaConstraint:
    constraint = SchemaConstraint(BYTES, compile_schema(schema))
    for byte in text:
        constraint.advance(byte)
    return constraint


def _allowed(constraint: SchemaConstraint) -> bytes:
    return bytes(byte for byte in range(256) if constraint.allows(byte))


def test_a_repeated_zero_in_a_unique_integer_array_is_refused_before_it_leaves_no_byte():
    """``[0,0`` left a unique array of integers with no byte at all (no digit follows 0, and 0 is taken): the
    sampler had nothing to choose. The second 0 is refused; every byte still allowed keeps a way on."""
    constraint = _after(_unique_array({"type": "integer"}), b'{"v":[0,')
    assert not constraint.allows(ord("0"))
    assert set(b"123456789-") <= set(_allowed(constraint))
    constraint = _after(_unique_array({"type": "integer"}), b'{"v":[1234567890123456,123456789012345')
    assert not constraint.allows(ord("6"))  # 16 digits, the cap: the same number again, with no digit to follow
    constraint.advance(ord("7"))
    assert _allowed(constraint) == b"\n ,]"


def test_a_number_that_can_only_be_zero_again_is_refused_in_a_unique_array():
    """A zero mantissa before an exponent stays zero whatever the exponent's digits (``[0,0.0e2542691346207593``
    was a dead end a fuzz walk found), as does one of 16 zero fraction digits, the cap."""
    schema = _unique_array({"type": "number"})
    assert not _after(schema, b'{"v":[0,0.0').allows(ord("e"))
    assert not _after(schema, b'{"v":[-0.0,0').allows(ord("E"))
    assert not _after(schema, b'{"v":[0,0.' + b"0" * 15).allows(ord("0"))
    assert _after(schema, b'{"v":[1,0.0').allows(ord("e"))  # zero is not taken yet
    far = _after(schema, b'{"v":[1e1234567890123456,1e123456789012345')
    assert not far.allows(ord("6"))
    assert far.allows(ord("7"))
    ends = _after(schema, b'{"v":[1,0.0e1]}')  # a zero written once is fine
    assert ends.complete


def test_an_integer_with_a_bound_of_a_thousand_digits_tries_a_few_digit_counts_per_byte(monkeypatch):
    """Each byte of a bounded integer tried every count of digits still to come up to the bound's, each a product of
    the bound's size: with minimum 10**999 and maximum 10**1000, a value took 73 s (2.3 s now, every byte probed).
    Only the counts whose values can reach the bounds are tried."""
    schema = {"type": "object", "properties": {"v": {"type": "integer", "minimum": 10 ** 999, "maximum": 10 ** 1000}},
              "required": ["v"]}
    tried = []
    real = json_schema._has_multiple
    monkeypatch.setattr(json_schema, "_has_multiple", lambda *args: tried.append(args) or real(*args))
    constraint = _after(schema, b'{"v":1')
    tried.clear()
    assert constraint.allows(ord("2"))
    assert len(tried) <= 3
    assert not _after(schema, b'{"v":2').allows(ord("}"))  # 2 is below 10**999
    text = b'{"v":1' + b"0" * 999
    done = _after(schema, text)
    assert not done.allows(ord("1"))  # 10**999 + more digits passes 10**1000
    assert done.allows(ord("0"))  # 10**1000, the maximum
    assert done.allows(ord("}"))


def test_the_fuzz_checker_reads_a_far_exponent_beside_a_bounded_option_without_expanding_it():
    """A walk of anyOf's unbounded option writes 1e9999999999999999; the checker compared it with the bounded option
    as a Fraction, 10**16 digits multiplied out in one C call, which held a CI worker for over ten minutes."""
    schema = {"type": "object", "properties": {"v": {"anyOf": [{"type": "number", "minimum": 0, "multipleOf": 0.5},
                                                               {"type": "number"}]}}, "required": ["v"]}
    for text in ('{"v":1e9999999999999999}', '{"v":-1E+9999999999999999}', '{"v":3e-9999999999999999}'):
        assert fuzz._valid(schema, json.loads(text, parse_float=Decimal), schema)
    assert fuzz._multiple_of(Decimal("1e9999999999999999"), 0.5)
    assert not fuzz._multiple_of(Decimal("1e9999999999999999"), 3)
    assert not fuzz._multiple_of(Decimal("3e-9999999999999999"), 0.5)
    fuzz.check_schema(schema, 1)


def test_the_fuzz_checker_reads_a_bound_as_the_decimal_it_writes():
    """0.1 meets minimum 0.1 (JSON Schema reads both as the decimal 0.1, a parser as the same double); the checker
    compared the decimal 0.1 with the double's exact value, 0.1000000000000000055..., and failed a sound walk."""
    schema = {"type": "object", "properties": {"v": {"type": "number", "minimum": 0.1, "exclusiveMaximum": 250.6,
                                                     "multipleOf": 0.1}}, "required": ["v"]}
    assert fuzz._valid(schema, json.loads('{"v": 0.1}', parse_float=Decimal), schema)
    assert not fuzz._valid(schema, json.loads('{"v": 0.0999999999999999}', parse_float=Decimal), schema)
    assert not fuzz._valid(schema, json.loads('{"v": 250.6}', parse_float=Decimal), schema)
