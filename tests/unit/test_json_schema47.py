"""The JSON schema constraint (edgesdk/runtime/json_schema.py, edgesdk/runtime/json_pattern.py) on valid or
invalid input that it once crashed on or took silently: bounds written as JSON integers past a double's range,
pattern counts past the grammar's limits, and a quantifier after a quantifier (an ECMA-262 syntax error)."""

from __future__ import annotations

import json

import pytest

from edgesdk.runtime.json_schema import SchemaError, compile_schema
from tests.unit.test_json_schema_allof40 import _takes

BYTES = [bytes([b]) for b in range(256)]  # a "tokenizer" whose token i is byte i
HUGE = 10 ** 400  # a JSON integer (RFC 8259 sets numbers no range) that no double holds



def _items(schema: dict) -> dict:
    return {"type": "array", "items": schema}


# ------------------------------------------------------------------ integers past a double's range


@pytest.mark.parametrize(("schema", "inside", "outside"), [
    (_items({"type": "integer", "minimum": HUGE}), f"[{HUGE}]", "[12]"),
    (_items({"type": "integer", "maximum": HUGE}), "[12]", f"[{HUGE + 1}]"),
    (_items({"type": "integer", "exclusiveMinimum": -HUGE, "maximum": 0}), "[-7]", f"[-{HUGE}]"),
    (_items({"type": "number", "maximum": HUGE}), "[1.5]", None),
    (_items({"type": "integer", "multipleOf": HUGE}), "[0]", "[7]"),  # (16 digits at most: 0 its one multiple)
    (_items({"allOf": [{"enum": [HUGE, 1]}, {"enum": [HUGE, 2]}]}), f"[{HUGE}]", "[1]"),
])
def test_a_bound_or_value_written_as_an_integer_past_a_double_is_taken(schema, inside, outside):
    # json.loads reads such a bound as an int of any size; math.isfinite(int) converts it to a float and raised
    # OverflowError (a crash of compile_schema, a 500 from the server) rather than take the valid schema
    schema = json.loads(json.dumps(schema))  # as a client sends it
    assert _takes(schema, inside)
    if outside is not None:
        assert not _takes(schema, outside)


def test_a_schema_text_with_such_a_bound_compiles():
    text = '{"type": "array", "items": {"type": "integer", "minimum": 1%s}}' % ("0" * 400)
    compiled = compile_schema(text)
    assert compiled.root.items.minimum == HUGE


def test_a_number_bound_past_the_written_numbers_is_refused_by_name():
    with pytest.raises(SchemaError, match="no number of at most 16 digits"):
        compile_schema(_items({"type": "number", "minimum": HUGE}))


# ------------------------------------------------------------------ pattern counts past the grammar's limits


@pytest.mark.parametrize(("pattern", "problem"), [
    ("^a{100000}$", "the count 100000 in {100000} is past the 10000 repetitions followed here"),
    ("^[a-z]{2,20000}$", "the count 20000 in {2,20000} is past the 10000 repetitions followed here"),
    ("^" + "(?:" * 300 + "a" + ")" * 300 + "$", "is too large to follow: its grammar groups are nested more than"),
])
def test_a_pattern_past_the_grammars_limits_is_a_schema_error_naming_the_pattern(pattern, problem):
    # the grammar written for the pattern was refused by the GBNF parser with a GrammarError about "grammar line
    # 1, column 27", which compile_schema let through (the server answered 500, `edgesdk run` a traceback)
    with pytest.raises(SchemaError) as caught:
        compile_schema(_items({"type": "string", "pattern": pattern}))
    assert caught.value.problem.startswith("$.items.pattern: pattern ")
    assert problem in caught.value.problem
    assert "grammar line" not in caught.value.problem
    assert caught.value.fix


def test_a_count_at_the_limit_is_followed():
    schema = _items({"type": "string", "pattern": "^a{10000}$"})
    assert _takes(schema, '["' + "a" * 10000 + '"]')
    assert not _takes(schema, '["' + "a" * 9999 + '"]')


# ------------------------------------------------------------------ a quantifier after a quantifier


@pytest.mark.parametrize("pattern", ["^x{2}{3}$", "^a???$", "^a{1,2}?{3}$", "^a*?+$", "^(ab)+??$"])
def test_a_quantifier_after_a_quantifier_is_refused(pattern):
    # ECMA-262 22.2.1 (Term :: Atom Quantifier, the Quantifier's lazy "?" its own): a SyntaxError, "Nothing to
    # repeat", in JavaScript, and "multiple repeat" in Python's re; "x{2}{3}" was read as (x{2}){3}
    with pytest.raises(SchemaError, match="a quantifier follows a quantifier"):
        compile_schema(_items({"type": "string", "pattern": pattern}))


@pytest.mark.parametrize(("pattern", "text", "taken"), [
    ("^a{2}?$", "aa", True),  # a lazy count
    ("^a??b$", "b", True),
    ("^a{2}{$", "aa{", True),  # a "{" that opens no count is the character (ECMA-262 Annex B.1.2)
    ("^(x{2}){3}$", "xxxxxx", True),
    ("^(x{2}){3}$", "xxxxx", False),
])
def test_one_quantifier_and_its_lazy_form_are_followed(pattern, text, taken):
    assert _takes(_items({"type": "string", "pattern": pattern}), json.dumps([text])) is taken


# ------------------------------------------------------------------ a leap second at the end of a UTC day only


@pytest.mark.parametrize(("fmt", "value", "taken"), [
    # the JSON Schema Test Suite, optional/format/time.json and date-time.json (RFC 3339 section 5.7, appendix D)
    ("time", "23:59:60Z", True),
    ("time", "23:59:60.25+00:00", True),
    ("time", "23:59:60-00:00", True),
    ("time", "22:59:60Z", False),  # "invalid leap second, Zulu (wrong hour)"
    ("time", "23:58:60Z", False),  # "invalid leap second, Zulu (wrong minute)"
    ("time", "12:34:60+05:30", False),  # 07:04:60 UTC
    ("date-time", "1998-12-31T23:59:60Z", True),
    ("date-time", "1998-12-31T23:58:60Z", False),  # "an invalid date-time with leap second on a wrong minute, UTC"
    ("date-time", "1998-12-31T22:59:60Z", False),
    ("time", "12:34:59.123456789+05:30", True),
    ("time", "00:00:00z", True),
])
def test_a_leap_second_is_written_only_at_the_end_of_a_utc_day(fmt, value, taken):
    # the time format took ":60" after any hour and minute, so "12:34:60Z", which the format refuses, was written
    assert _takes(_items({"type": "string", "format": fmt}), json.dumps([value])) is taken


# ------------------------------------------------------------------ a union wider than the cap on live parses


def _tool_calls(count: int) -> dict:
    """The shape edgesdk/serve/tools.py gives a call of one of ``count`` tools: an anyOf of one object a tool."""
    calls = [{"type": "object", "properties": {"name": {"const": f"tool_{i}"}, "arguments": {
        "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}, "required": ["name", "arguments"]}
        for i in range(count)]
    return {"type": "object", "properties": {"tool_call": {"anyOf": calls}}, "required": ["tool_call"]}


@pytest.mark.parametrize("index", [0, 63, 64, 69, 149])
def test_every_option_of_a_wide_union_of_objects_can_be_written(index):
    # after the "{" each object of the anyOf is a live parse until the const name tells them apart; past the 64
    # kept (MAX_WAYS) the last were dropped without a word, so tool_64 ... of 70 tools could never be called
    schema = _tool_calls(150)
    assert _takes(schema, json.dumps({"tool_call": {"name": f"tool_{index}", "arguments": {"q": "x"}}},
                                     separators=(",", ":")))
    assert not _takes(schema, json.dumps({"tool_call": {"name": "tool_150", "arguments": {"q": "x"}}},
                                         separators=(",", ":")))


def test_the_last_of_seventy_keyed_objects_can_be_written():
    options = [{"type": "object", "properties": {f"k{i}": {"type": "integer"}}, "required": [f"k{i}"]}
               for i in range(70)]
    assert _takes({"anyOf": options}, '{"k69": 1}')
    assert _takes({"type": "array", "items": {"oneOf": options}}, '[{"k0": 1}, {"k69": 2}]')


# ------------------------------------------------------------------ a group that is no ECMA-262 group


@pytest.mark.parametrize(("pattern", "group"), [("(?i)^[a-z]+$", "'(?i)'"), ("^(?P<year>[0-9]{4})$", "'(?P<'"),
                                                ("^a(?x)$", "'(?x)'")])
def test_inline_flags_and_python_named_groups_are_refused_as_what_they_are(pattern, group):
    # they were refused as "lookarounds ((?=, (?!, (?<=, (?<!) are not supported", which they are not
    with pytest.raises(SchemaError) as caught:
        compile_schema(_items({"type": "string", "pattern": pattern}))
    assert f"the group {group}... is not ECMA-262 syntax" in caught.value.problem
    assert "lookaround" not in caught.value.problem
    assert "(?:...)" in caught.value.fix


@pytest.mark.parametrize("pattern", ["^a(?=b)", "^a(?!b)", "(?<=a)b", "(?<!a)b"])
def test_lookarounds_are_still_refused_by_name(pattern):
    with pytest.raises(SchemaError, match="lookarounds"):
        compile_schema(_items({"type": "string", "pattern": pattern}))


# ------------------------------------------------------------------ a pattern's minLength past the length walk


@pytest.mark.parametrize(("string", "where"), [
    ({"pattern": "^[a-z]+$", "minLength": 10_001}, "pattern '^[a-z]+$'"),
    ({"pattern": "^(ab|c)*$", "minLength": 30_000}, "pattern '^(ab|c)*$'"),
    ({"format": "date-time", "minLength": 20_000}, "format 'date-time'"),
])
def test_a_minlength_past_the_length_walk_beside_a_pattern_is_refused_at_once(string, where):
    # the length walk (json_pattern.PatternLengths.least) took one layer of states a character: a minLength of
    # 10**6 held compile_schema for seconds and one of 10**9 until memory ran out (not run here: it would stall)
    with pytest.raises(SchemaError) as caught:
        compile_schema(_items({"type": "string", **string}))
    assert caught.value.problem == (f"$.items: minLength {string['minLength']} beside its {where} is past the 10,000 "
                                    "characters followed there (llama.cpp's grammar refuses any minLength past 2,000)")
    assert caught.value.fix.startswith("lower minLength to at most 10,000")


def test_a_minlength_at_the_limit_beside_a_pattern_and_one_without_a_pattern_are_followed():
    assert not _takes(_items({"type": "string", "pattern": "^[a-z]+$", "minLength": 10_000}), '["ab"]')
    assert _takes(_items({"type": "string", "pattern": "^[a-z]+$", "minLength": 10_000}),
                  '["' + "a" * 10_000 + '"]')
    assert not _takes(_items({"type": "string", "minLength": 10 ** 9}), '["ab"]')  # a count: no walk
