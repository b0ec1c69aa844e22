"""String lengths, integer bounds and llama.cpp's digit caps in the JSON schema constraint
(edgesdk/runtime/json_schema.py): every text of the schema accepted, every other refused, no way in
that cannot be finished, and answers generated on a tiny bundle within the bounds."""

from __future__ import annotations

import json
import random

import pytest

from edgesdk.runtime.json_schema import SchemaConstraint, SchemaError, compile_schema

BYTES = [bytes([b]) for b in range(256)]  # a "tokenizer" whose token i is byte i


def _wrapped(schema: dict) -> dict:
    return {"type": "object", "properties": {"v": schema}, "required": ["v"]}


def _complete(schema: dict, value_text: str) -> bool:
    """The constraint takes ``{"v":VALUE}`` whole and ends there."""
    constraint = SchemaConstraint(BYTES, compile_schema(_wrapped(schema)))
    for byte in f'{{"v":{value_text}}}'.encode():
        if not constraint.allows(byte):
            return False
        constraint.advance(byte)
    return constraint.complete


def _plain_integer_text(text: str) -> bool:
    """JSON's integer form without ``-0`` (which the bounded constraint never writes)."""
    digits = text.removeprefix("-")
    return digits.isdigit() and (digits == "0" or digits[0] != "0") and text != "-0"


BOUNDS = [
    {"minimum": 3, "maximum": 250},
    {"minimum": -40, "maximum": 7},
    {"minimum": -300, "maximum": -12},
    {"minimum": 0},
    {"minimum": 17},
    {"minimum": -5},
    {"maximum": 0},
    {"maximum": 99},
    {"maximum": -100},
    {"exclusiveMinimum": 9, "exclusiveMaximum": 100},
    {"minimum": 2.5, "maximum": 12.9},
    {"exclusiveMinimum": -0.5, "exclusiveMaximum": 10.5},
    {"minimum": 5, "exclusiveMinimum": 7, "maximum": 50, "exclusiveMaximum": 20},  # the tighter of each pair
    {"minimum": 1000, "maximum": 1000},
]
TEXTS = [str(n) for n in range(-1100, 1101)] + ["-0", "007", "-05", "00", "0123"]


def _within(bounds: dict, value: int) -> bool:
    return (value >= bounds.get("minimum", value) and value <= bounds.get("maximum", value)
            and value > bounds.get("exclusiveMinimum", value - 1) and value < bounds.get("exclusiveMaximum", value + 1))


@pytest.mark.parametrize("bounds", BOUNDS, ids=lambda b: json.dumps(b))
def test_an_integer_is_taken_exactly_when_it_lies_within_the_bounds(bounds):
    schema = {"type": "integer", **bounds}
    for text in TEXTS:
        expected = _plain_integer_text(text) and _within(bounds, int(text))
        assert _complete(schema, text) == expected, (bounds, text)


@pytest.mark.parametrize("bounds", BOUNDS, ids=lambda b: json.dumps(b))
def test_no_way_into_a_bounded_integer_is_a_dead_end(bounds):
    """Random walks over the bytes the constraint allows always finish, and what they finish is in bounds
    (a digit taken that no digits to come could bring within the bounds would strand the answer)."""
    schema = _wrapped({"type": "integer", **bounds})
    alphabet = list(b"-0123456789}. e")
    rng = random.Random(7)
    for _ in range(150):
        constraint = SchemaConstraint(BYTES, compile_schema(schema))
        for byte in b'{"v":':
            constraint.advance(byte)
        data = bytearray(b'{"v":')
        while not constraint.complete:
            allowed = [b for b in alphabet if constraint.allows(b)]
            assert allowed, f"stuck after {bytes(data)!r}"
            # lean towards ending so the walks stay short, yet reach long numbers too
            byte = ord("}") if ord("}") in allowed and rng.random() < 0.3 else rng.choice(allowed)
            constraint.advance(byte)
            data.append(byte)
            assert len(data) < 60, bytes(data)
        assert _within(bounds, json.loads(bytes(data))["v"]), bytes(data)


def test_a_bound_past_sixteen_digits_sets_the_length():
    big = 10 ** 20
    assert _complete({"type": "integer", "minimum": big}, str(big))
    assert _complete({"type": "integer", "minimum": big}, str(big * 9 + 7))  # the bound's 21 digits at most
    assert not _complete({"type": "integer", "minimum": big}, str(big * 10))
    assert not _complete({"type": "integer", "minimum": big}, str(big - 1))
    assert _complete({"type": "integer", "maximum": -big}, str(-big))
    assert not _complete({"type": "integer", "maximum": -big}, "-1" + "0" * 19)


def test_plain_numbers_keep_to_llama_cpps_digit_caps():
    """llama.cpp's schema grammar: integral-part [0] | [1-9] [0-9]{0,15}, decimal-part [0-9]{1,16}, the
    exponent an integral-part; a model cannot stall in digits."""
    assert _complete({"type": "integer"}, "9" * 16)
    assert not _complete({"type": "integer"}, "9" * 17)
    assert _complete({"type": "integer"}, "-0")  # JSON's -0 stays a plain integer's
    assert _complete({"type": "number"}, "-" + "1" * 16 + "." + "2" * 16 + "e" + "3" * 16)
    for text in ("1" * 17, "1." + "2" * 17, "1e" + "3" * 17, "1e05", "1E+00"):
        assert not _complete({"type": "number"}, text), text
    for text in ("1e0", "1E+5", "0.5e-7", "-0.0"):
        assert _complete({"type": "number"}, text), text


@pytest.mark.parametrize(("bounds", "texts"), [
    ({"minLength": 2, "maxLength": 3}, ['""', '"a"', '"ab"', '"abc"', '"abcd"', '"\\n\\t"', '"\\u00e9x"', '"é漢"',
                                         '"😀x"', '"\\ud83d\\ude00"', '"\\ud83d\\ude00!"', '"a\\"b\\\\"', '"ééé"',
                                         '"éééé"']),
    ({"minLength": 1}, ['""', '" "', '"\\/"', '"' + "x" * 50 + '"']),
    ({"maxLength": 0}, ['""', '"a"', '"\\u0000"']),
])
def test_a_string_is_taken_exactly_when_its_length_in_characters_is_within_bounds(bounds, texts):
    """Length in characters (JSON Schema 2020-12 validation 6.3.1: code points), an escape one character
    and a \\u surrogate pair one."""
    schema = {"type": "string", **bounds}
    for text in texts:
        length = len(json.loads(text))
        expected = bounds.get("minLength", 0) <= length <= bounds.get("maxLength", length)
        assert _complete(schema, text) == expected, (bounds, text)


def test_a_string_at_its_longest_may_only_close():
    constraint = SchemaConstraint(BYTES, compile_schema(_wrapped({"type": "string", "maxLength": 2})))
    for byte in b'{"v":"a\\u00e9':
        constraint.advance(byte)
    assert [b for b in range(256) if constraint.allows(b)] == [ord('"')]


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "string", "minLength": -1}, r"minLength must be a non-negative integer, got -1"),
    ({"type": "string", "maxLength": 1.5}, r"maxLength must be a non-negative integer, got 1.5"),
    ({"type": "string", "minLength": 4, "maxLength": 3}, "maxLength 3 is below minLength 4"),
    ({"type": "integer", "minimum": "3"}, r"minimum must be a finite number, got \"3\""),
    ({"type": "integer", "maximum": True}, "maximum must be a finite number, got true"),
    ({"type": "integer", "maximum": float("inf")}, "maximum must be a finite number"),
    ({"type": "integer", "minimum": 2.5, "maximum": 2.9}, "no integer lies within its bounds"),
    ({"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 4}, "no integer lies within its bounds"),
    ({"type": "string", "minimum": 0}, "keyword 'minimum' constrains number / integer values only"),
    ({"type": "integer", "minLength": 0}, "keyword 'minLength' constrains string values only"),
])
def test_unusable_bounds_are_refused_by_name(schema, message):
    with pytest.raises(SchemaError, match=message):
        compile_schema(_wrapped(schema))


BOUNDED = {"type": "object", "properties": {
    "n": {"type": "integer", "minimum": 3, "maximum": 7},
    "code": {"type": "string", "minLength": 2, "maxLength": 4},
    "ids": {"type": "array", "items": {"type": "integer", "exclusiveMinimum": -3, "maximum": 12}, "maxItems": 3}},
    "required": ["n", "code", "ids"]}


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


def generated_answer(runtime, schema: dict, temperature: float, seed: int | None):
    """The tiny bundle's answer under ``schema``, read as JSON (it must complete)."""
    from edgesdk.runtime.generate import SamplingConfig, generate

    tokenizer = runtime.tokenizer
    constraint = SchemaConstraint(tokenizer.token_bytes(), compile_schema(schema))
    tokens, stats = generate(runtime.backend, tokenizer.prompt_ids("Give me JSON", raw=False),
                             SamplingConfig(max_new_tokens=200, temperature=temperature, seed=seed),
                             tokenizer.eos_token_ids, constraint=constraint)
    text = b"".join(tokenizer.token_bytes()[t] for t in tokens)
    assert stats.stop_reason == "complete", text
    return json.loads(text)


@pytest.mark.parametrize(("temperature", "seed"), [(0.0, None), (1.0, 3), (1.5, 4)])
def test_generated_answers_keep_within_the_bounds(runtime, temperature, seed):
    answer = generated_answer(runtime, BOUNDED, temperature, seed)
    assert 3 <= answer["n"] <= 7, answer
    assert 2 <= len(answer["code"]) <= 4, answer
    assert len(answer["ids"]) <= 3, answer
    assert all(-3 < n <= 12 for n in answer["ids"]), answer
