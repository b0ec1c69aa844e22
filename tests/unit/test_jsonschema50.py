"""Review 50 of the JSON schema constraint (edgesdk/runtime/json_schema.py) against JSON Schema 2020-12 and
llama.cpp's converter (common/json-schema-to-grammar.cpp), with tool schemas as MCP servers and OpenAPI-derived
SDKs write them:

* a ``required`` key that ``properties`` leaves out, with ``additionalProperties`` absent, was refused, so one such
  tool failed the whole request (llama.cpp's converter takes the schema); the key is written, with any value, as
  JSON Schema's default (additionalProperties true) admits it;
* a string's or a number's keywords beside an ``enum`` / ``const`` (Stripe's ``"maxLength": 5000`` on its enums,
  ``minimum`` beside an integer enum) were refused; the values are filtered by them, as every keyword applies."""

from __future__ import annotations

import json

import pytest

from edgesdk.runtime.json_schema import SchemaError, compile_schema, lenient_schema
from tests.unit.test_json_schema_allof40 import _takes

# ------------------------------------------------------------ a required key that properties does not list


def test_a_required_key_missing_from_properties_is_written_with_any_value():
    # JSON Schema 2020-12 core, section 10.3.2.3: additionalProperties absent is true, so {"path": "a", "mode": 1}
    # is valid; it was refused ("$.required names ['mode'], which are not among its properties")
    schema = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path", "mode"]}
    compile_schema(schema)
    for text in ('{"path": "a", "mode": 1}', '{"path":"a","mode":{"x":[true, null]}}', '{"path": "a", "mode": "r"}'):
        assert _takes(schema, text), text
    # still required, still no other keys (an absent additionalProperties beside properties writes none)
    for text in ('{"path": "a"}', '{"mode": 1}', '{"path": "a", "mode": 1, "z": 2}', "{}"):
        assert not _takes(schema, text), text


def test_a_tool_whose_required_names_a_missing_property_compiles_after_lenient_reading():
    # edgesdk/serve/tools.py compiles lenient_schema(parameters): the whole chat request was a 400 for this tool
    tool = {"type": "object", "properties": {"query": {"type": "string", "description": "what to find"}},
            "required": ["query", "limit"]}
    constraint, _ = lenient_schema(tool)
    compile_schema(constraint)
    assert _takes(constraint, '{"query": "x", "limit": 5}')


def test_an_allof_that_requires_a_key_no_component_lists_writes_it():
    schema = {"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}}, {"required": ["b"]}]}
    assert _takes(schema, '{"b": 1}')
    assert _takes(schema, '{"a": "x", "b": [1]}')
    assert not _takes(schema, '{"a": "x"}')


def test_a_required_key_that_additional_properties_false_forbids_is_still_refused_by_name():
    with pytest.raises(SchemaError) as caught:
        compile_schema({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"],
                        "additionalProperties": False})
    assert "$.required names ['b']" in caught.value.problem
    assert "additionalProperties false forbids" in caught.value.problem


# ------------------------------------------------------------ keywords beside an enum or const


def _items(schema: dict) -> dict:
    return {"type": "array", "items": schema}


@pytest.mark.parametrize(("schema", "inside", "outside"), [
    # Stripe's OpenAPI writes maxLength 5000 on its string enums
    ({"type": "string", "enum": ["automatic", "manual"], "maxLength": 5000}, ['"automatic"', '"manual"'], ['"x"']),
    ({"type": "string", "enum": ["ab", "abcd"], "maxLength": 3}, ['"ab"'], ['"abcd"']),
    # minLength applies to strings only: the number passes it (JSON Schema 2020-12 validation, section 6.3)
    ({"enum": ["ab", "abcd", 5], "minLength": 3}, ['"abcd"', "5"], ['"ab"']),
    ({"type": "integer", "enum": [0, 1, 2, 3], "minimum": 1, "exclusiveMaximum": 3}, ["1", "2"], ["0", "3"]),
    ({"enum": [0.1, 0.3, 0.25, 1], "multipleOf": 0.1}, ["0.1", "0.3", "1"], ["0.25"]),
    ({"const": "x1", "pattern": "^x[0-9]$"}, ['"x1"'], ['"x2"']),
    ({"type": "string", "format": "date", "enum": ["2024-01-01", "2023-02-30"]}, ['"2024-01-01"'], ['"2023-02-30"']),
    ({"type": "integer", "format": "int32", "enum": [1, 2147483648]}, ["1"], ["2147483648"]),
    ({"enum": [1e300, 5], "maximum": 10}, ["5"], [json.dumps(1e300)]),
])
def test_an_enums_values_are_filtered_by_the_keywords_beside_it(schema, inside, outside):
    # each was refused: "keyword 'maxLength' beside enum is not supported by the JSON schema constraint here"
    wrapped = _items(schema)
    for text in inside:
        assert _takes(wrapped, f"[{text}]"), text
    for text in outside:
        assert not _takes(wrapped, f"[{text}]"), text


def test_a_tool_with_a_bounded_enum_compiles_after_lenient_reading():
    tool = {"type": "object", "properties": {"capture_method": {"type": "string", "enum": ["automatic", "manual"],
                                                                "maxLength": 5000},
                                             "count": {"type": "integer", "enum": [10, 20, 50], "minimum": 1}},
            "required": ["capture_method"]}
    constraint, _ = lenient_schema(tool)
    assert _takes(constraint, '{"capture_method": "manual", "count": 20}')


def test_an_enum_that_the_keywords_beside_it_leave_empty_is_refused_by_name():
    with pytest.raises(SchemaError) as caught:
        compile_schema(_items({"type": "integer", "enum": [1, 2], "minimum": 5}))
    assert "no value of its enum is also of its type 'integer' and within its minimum 5" in caught.value.problem
    assert "minimum" in caught.value.fix


@pytest.mark.parametrize(("schema", "message"), [
    ({"enum": [1], "multipleOf": 0}, "multipleOf must be a number greater than 0"),
    ({"enum": ["a"], "minLength": -1}, "minLength must be a non-negative integer"),
    ({"enum": ["a"], "format": "color"}, 'format "color" is not supported'),
    ({"enum": [["a"]], "items": {"type": "string"}}, "keyword 'items' beside enum is not supported"),
])
def test_a_broken_or_unfollowed_keyword_beside_an_enum_is_still_refused_by_name(schema, message):
    with pytest.raises(SchemaError) as caught:
        compile_schema(_items(schema))
    assert message in caught.value.problem
