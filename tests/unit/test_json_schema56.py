"""The JSON schema constraint (edgesdk/runtime/json_schema.py, edgesdk/runtime/json_pattern.py): keywords beside an
anyOf / oneOf that the intersection spreads over its options, and what a pattern's escapes spell."""

from __future__ import annotations

import json

import pytest

from edgesdk.runtime.json_schema import SchemaError, compile_schema
from tests.unit.test_json_schema_bounds37 import _complete

# ------------------------------------------------------------ an option that the keywords beside it leave empty

EMPTIED_OPTIONS = [
    # (schema, a valid instance through the option that is left, an instance only the emptied option would take)
    ({"allOf": [{"anyOf": [{"type": "integer", "maximum": 3}, {"type": "integer", "minimum": 10}]},
                {"minimum": 5}]}, "12", "2"),
    ({"anyOf": [{"type": "number", "maximum": 3}, {"type": "string"}], "minimum": 5}, '"x"', "2.5"),
    ({"anyOf": [{"type": "string", "format": "date"}, {"type": "string", "format": "uuid"}], "maxLength": 10},
     '"2024-02-29"', '"123e4567-e89b-12d3-a456-426614174000"'),
    ({"anyOf": [{"enum": ["a", "bb"]}, {"type": "integer"}], "minLength": 3}, "7", '"bb"'),
    ({"anyOf": [{"type": "array", "maxItems": 2}, {"type": "boolean"}], "minItems": 3}, "true", "[1]"),
    ({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "null"}], "minLength": 3}, "null", '"ab"'),
]


@pytest.mark.parametrize(("schema", "valid", "emptied"), EMPTIED_OPTIONS)
def test_an_option_left_empty_by_the_keywords_beside_the_anyof_is_dropped(schema, valid, emptied):
    """JSON Schema applies the keywords beside an anyOf to every option; an option they leave with no value adds
    nothing, and the others still admit values. The whole schema was refused ("no integer lies within its bounds
    (minimum 5, maximum 3)", "no string of its format 'uuid' has a length within ..."), for a schema that the
    instances above satisfy."""
    assert _complete(schema, valid)
    assert not _complete(schema, emptied)


def test_an_intersection_that_leaves_every_option_empty_is_refused_with_the_first_reason():
    schema = {"anyOf": [{"type": "integer", "maximum": 3}, {"type": "string", "maxLength": 1}], "minimum": 5,
              "minLength": 2}
    with pytest.raises(SchemaError, match=r"anyOf\[0\]: no integer lies within its bounds \(minimum 5, maximum 3\)"):
        compile_schema({"type": "object", "properties": {"v": schema}})


def test_a_contradiction_written_in_one_schema_is_still_refused():
    with pytest.raises(SchemaError, match=r"\$\.properties\.v: no integer lies within its bounds"):
        compile_schema({"type": "object", "properties": {"v": {"type": "integer", "minimum": 5, "maximum": 3}}})
    with pytest.raises(SchemaError, match=r"\$\.properties\.v: maxLength 2 is below minLength 3"):
        compile_schema({"type": "object", "properties": {"v": {"type": "string", "minLength": 3, "maxLength": 2}}})


def test_a_length_refusal_without_maxlength_names_no_maxlength():
    """The message named "minLength 11 and maxLength None" for a schema that gives no maxLength."""
    with pytest.raises(SchemaError) as caught:
        compile_schema({"type": "object", "properties": {"v": {"type": "string", "format": "date", "minLength": 11}}})
    assert "within minLength 11" in str(caught.value)
    assert "None" not in str(caught.value)


# ------------------------------------------------------------ a keyword of one type spread over options of others

SPREAD = [
    ({"anyOf": [{"type": "string"}, {"type": "null"}], "maxLength": 5}, ["null", '"abcde"'], ['"abcdef"']),
    ({"anyOf": [{"type": "integer"}, {"type": "null"}], "minimum": 5}, ["null", "7"], ["4"]),
    ({"oneOf": [{"type": "integer"}, {"type": "string"}], "minimum": 5, "pattern": "^a"}, ["5", '"ab"'],
     ["4", '"ba"']),
    ({"anyOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"type": "boolean"}],
      "required": ["a"]}, ['{"a":1}', "false"], ["{}"]),
    ({"anyOf": [{"type": "string"}, {"type": "null"}], "format": "date"}, ["null", '"2024-02-29"'], ['"x"']),
    ({"anyOf": [{"type": "string"}, {"type": "integer"}], "format": "date"}, ["5", '"2024-02-29"'], ['"x"']),
    ({"anyOf": [{"type": "string"}, {"type": "integer"}], "format": "int32"}, ['"x"', "5"], [str(2 ** 31)]),
]


@pytest.mark.parametrize(("schema", "valid", "invalid"), SPREAD)
def test_a_keyword_beside_an_anyof_binds_only_the_options_of_its_type(schema, valid, invalid):
    """``maxLength`` beside ``anyOf: [string, null]`` bounds the string and says nothing of null (JSON Schema 2020-12
    validation, section 6: each keyword applies to values of its type); the null option was refused as "keyword
    'maxLength' is not supported by the JSON schema constraint here", a keyword the same message lists as supported."""
    for text in valid:
        assert _complete(schema, text), text
    for text in invalid:
        assert not _complete(schema, text), text


def test_a_keyword_of_another_type_written_beside_a_type_is_refused_by_what_it_is():
    """Written by hand beside a type it cannot constrain, the keyword is still refused, by a message that says why
    rather than calling a supported keyword unsupported."""
    with pytest.raises(SchemaError) as caught:
        compile_schema({"type": "object", "properties": {"v": {"type": "null", "maxLength": 5}}})
    message = str(caught.value)
    assert "'maxLength' constrains string values only" in message
    assert '"null"' in message
    assert "not supported" not in message
    assert json.dumps(["null", "string"]) in message


# ------------------------------------------------------------ a pattern's \\u surrogate pairs

EMOJI = {"type": "string", "pattern": "^\\uD83D\\uDE00$"}
EMOJI_RANGE = {"type": "string", "pattern": "^[\\uD83D\\uDE00-\\uD83D\\uDE4F]+$"}  # U+1F600 ... U+1F64F


def test_a_surrogate_pair_escape_in_a_pattern_is_the_character_it_spells():
    """ECMA-262 reads ``\\uD83D\\uDE00`` as U+1F600 (with the ``u`` flag one code point, without it the two UTF-16
    code units of that character): a string of it matches. The pattern was refused as one that "needs a character a
    JSON string holds only escaped (a quote, a backslash or a control character)", which it does not."""
    assert _complete(EMOJI, json.dumps("\U0001F600", ensure_ascii=False))
    assert not _complete(EMOJI, json.dumps("\U0001F601", ensure_ascii=False))
    assert _complete(EMOJI_RANGE, json.dumps("\U0001F600\U0001F64F", ensure_ascii=False))
    assert not _complete(EMOJI_RANGE, json.dumps("\U0001F680", ensure_ascii=False))
    assert not _complete(EMOJI_RANGE, '"a"')


def test_a_surrogate_pair_in_a_pattern_beside_an_enum_keeps_the_value_it_matches():
    schema = {"enum": ["\U0001F600", "x"], "pattern": "^\\uD83D\\uDE00$"}
    assert _complete(schema, json.dumps("\U0001F600", ensure_ascii=False))
    assert not _complete(schema, '"x"')


def test_half_a_surrogate_pair_alone_is_refused_by_what_it_is():
    with pytest.raises(SchemaError, match="half of a UTF-16 surrogate pair"):
        compile_schema({"type": "object", "properties": {"v": {"type": "string", "pattern": "^a\\uD83D$"}}})
