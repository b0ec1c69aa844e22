"""A JSON schema string's ``pattern`` and ``format`` (edgesdk/runtime/json_pattern.py through
edgesdk/runtime/json_schema.py): the strings taken are those Python's ``re`` finds a match in (for the
syntax both read alike), no way in is a dead end, and what cannot be followed is refused by name."""

from __future__ import annotations

import json
import random
import re

import pytest

from edgesdk.runtime.json_pattern import FORMATS
from edgesdk.runtime.json_schema import SchemaConstraint, SchemaError, compile_schema
from tests.unit.test_json_schema_bounds37 import generated_answer, runtime  # noqa: F401 (a fixture)

BYTES = [bytes([b]) for b in range(256)]  # a "tokenizer" whose token i is byte i


def _wrapped(schema: dict) -> dict:
    return {"type": "object", "properties": {"v": schema}, "required": ["v"]}


def _python(pattern: str) -> str:
    """The pattern in Python's spelling (its named groups are (?P<name>...))."""
    return pattern.replace("(?<", "(?P<")


def _complete(schema: dict, value: str) -> bool:
    constraint = SchemaConstraint(BYTES, compile_schema(_wrapped(schema)))
    for byte in b'{"v":"' + value.encode() + b'"}':
        if not constraint.allows(byte):
            return False
        constraint.advance(byte)
    return constraint.complete


PATTERNS = [
    r"^[A-Z]{3}-\d{2,4}$",
    r"^(ab|a)c?$",
    r"cat",
    r"^x",
    r"y$",
    r"^\$\d+(\.\d{2})?$",
    r"^[^aeiou\s]+$",
    r"^(?:[a-c]|\.)*z{0,2}$",
    r"^(?<word>\w+)\.\w+$",
    r"^a.c$",
    r"^[\d.-]+$",
    r"^(a|)+b$",
    r"^\x41\u00e9\t?$",
    r"^[a-z]+?!$",
    r"^é+[😀-😂]$",
    r"^\{\d\}$",
]
CANDIDATES = ["", "ABC-12", "ABC-1234", "ABC-12345", "AB-12", "abc-12", "ac", "abc", "ab", "a", "c", "abcc",
              "a cat!", "cat", "ca t", "x", "xy", "yx", "y", "$12", "$12.50", "$12.5", "12", "bcd", "bad", "b d",
              "abcz", ".z", "abc..zz", "zzz", "hello.py", "hello.", ".py", "abc", "a c", "a\u00e9c", "1.5-2", "1,5",
              "aab", "b", "Aé", "Aéé", "abc!", "!", "éé😀", "é😃", "{1}", "{12}", "A\u00e9"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_string_is_taken_exactly_when_the_pattern_finds_a_match_in_it(pattern):
    for value in CANDIDATES:
        assert _complete({"type": "string", "pattern": pattern}, value) == bool(re.search(_python(pattern), value, re.ASCII)), \
            (pattern, value)


@pytest.mark.parametrize("pattern", PATTERNS + [FORMATS[name] for name in FORMATS])
def test_no_way_into_a_pattern_is_a_dead_end(pattern):
    """Random walks over the bytes the constraint allows never find no byte to go on with, and what they
    close matches the pattern."""
    alphabet = sorted(set(b'"ABCXYZabcxyz019-.:$!{}TZ+ \\') | set("é😀".encode()))
    rng = random.Random(11)
    for _ in range(60):
        constraint = SchemaConstraint(BYTES, compile_schema(_wrapped({"type": "string", "pattern": pattern})))
        data = bytearray()
        for byte in b'{"v":"':
            constraint.advance(byte)
        while not constraint.complete and len(data) < 120:  # an unanchored pattern may take long to meet
            allowed = [b for b in alphabet if constraint.allows(b)] or \
                [b for b in range(256) if constraint.allows(b)]
            assert allowed, f"stuck after {bytes(data)!r}"
            byte = ord('"') if ord('"') in allowed and rng.random() < 0.25 else \
                ord("}") if ord("}") in allowed and len(allowed) == 1 else rng.choice(allowed)
            constraint.advance(byte)
            data.append(byte)
        if not constraint.complete:
            continue
        value = json.loads(b'"' + bytes(data).rsplit(b'"', 1)[0] + b'"')
        assert re.search(_python(pattern), value, re.ASCII), (pattern, value)


@pytest.mark.parametrize(("fmt", "good", "bad"), [
    ("date", ["2024-02-29", "1999-12-31", "0001-01-01"], ["2024-13-01", "2024-00-10", "2024-1-01", "24-01-01",
                                                          "2024-01-32", "2024-01-01T"]),
    ("time", ["23:59:60Z", "00:00:00+05:30", "12:30:45.123456789-01:00", "08:15:00z"],
     ["24:00:00Z", "12:60:00Z", "12:00:00", "12:00:00.Z", "12:00:00.1234567890Z", "12:00Z"]),
    ("date-time", ["2024-05-01T12:00:00Z", "2024-05-01t12:00:00.5+01:00"], ["2024-05-01 12:00:00Z", "2024-05-01T12:00Z"]),
    ("uuid", ["123e4567-e89b-12d3-a456-426614174000", "00000000-0000-0000-0000-00000000ABCD"],
     ["123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400", "g23e4567-e89b-12d3-a456-426614174000"]),
])
def test_formats_take_their_rfc_forms(fmt, good, bad):
    for value in good:
        assert _complete({"type": "string", "format": fmt}, value), (fmt, value)
    for value in bad:
        assert not _complete({"type": "string", "format": fmt}, value), (fmt, value)


def test_a_pattern_string_is_written_without_escapes():
    """What the pattern reads is what is written: a JSON escape is never taken inside a pattern's string,
    and a character a JSON string holds only escaped leaves its set."""
    assert not _complete({"type": "string", "pattern": "^a.b$"}, "a\\nb")
    assert not _complete({"type": "string", "pattern": "^a.b$"}, "a\\u0041b")
    assert _complete({"type": "string", "pattern": '^[a"\\\\]$'}, "a")
    constraint = SchemaConstraint(BYTES, compile_schema(_wrapped({"type": "string", "pattern": '^[a"\\\\]$'})))
    for byte in b'{"v":"':
        constraint.advance(byte)
    assert [b for b in range(256) if constraint.allows(b)] == [ord("a")]


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "string", "pattern": "^a(?=b)"}, r"\$.properties.v.pattern: .*lookarounds"),
    ({"type": "string", "pattern": "(?<!a)b"}, "lookarounds"),
    ({"type": "string", "pattern": r"^(a)\1$"}, "back-references"),
    ({"type": "string", "pattern": r"\bword"}, "word boundaries"),
    ({"type": "string", "pattern": "^a^b$"}, r"inside the pattern \(anchors are taken only at the ends"),
    ({"type": "string", "pattern": "^(ab$"}, "a group is not closed"),
    ({"type": "string", "pattern": "^ab)$"}, "an unmatched \\)"),
    ({"type": "string", "pattern": "^[ab$"}, "a character class is not closed"),
    ({"type": "string", "pattern": "^*a$"}, r"\* repeats nothing"),
    ({"type": "string", "pattern": "^a{3,2}$"}, "runs backwards"),
    ({"type": "string", "pattern": "^[z-a]$"}, "runs backwards"),
    ({"type": "string", "pattern": '^"$'}, "holds only escaped"),
    ({"type": "string", "pattern": "^[]$"}, "holds only escaped"),
    ({"type": "string", "pattern": "^\\q$"}, "unknown escape"),
    ({"type": "string", "pattern": 5}, "a pattern must be a string"),
    ({"type": "string", "format": "json-pointer"}, r"format \"json-pointer\" is not supported \(supported: date, time"),
    ({"type": "string", "format": "date", "pattern": "^2"}, "pattern and format together"),
])
def test_patterns_and_formats_it_cannot_follow_are_refused_by_name(schema, message):
    with pytest.raises(SchemaError, match=message):
        compile_schema(_wrapped(schema))


def test_braces_without_ascii_counts_are_literal_characters():
    """``{`` opens a repetition only before ASCII digits (as ECMA-262's Annex B reads ``{`` otherwise); a
    superscript digit, which str.isdigit takes and int() does not, is a character like any other."""
    assert _complete({"type": "string", "pattern": "^a{²}$"}, "a{²}")
    assert not _complete({"type": "string", "pattern": "^a{²}$"}, "aa")
    assert _complete({"type": "string", "pattern": "^a{2}$"}, "aa")


PLATE = {"type": "object", "properties": {"plate": {"type": "string", "pattern": r"^[A-Z]{3}-\d{2}$"},
                                          "day": {"type": "string", "format": "date"}},
         "required": ["plate", "day"]}


@pytest.mark.parametrize(("temperature", "seed"), [(0.0, None), (1.0, 5)])
def test_generated_strings_follow_their_pattern_and_format(runtime, temperature, seed):  # noqa: F811 (the fixture)
    answer = generated_answer(runtime, PLATE, temperature, seed)
    assert re.fullmatch(r"[A-Z]{3}-\d{2}", answer["plate"]), answer
    assert re.fullmatch(FORMATS["date"][1:-1], answer["day"]), answer
