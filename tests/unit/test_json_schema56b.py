"""An anyOf option is dropped only where the merge beside it leaves the option itself no value; the type of a
merge is settled before its object keywords are merged."""

import pytest

from edgesdk.runtime.json_schema import SchemaConstraint, SchemaError, compile_schema


def _accepts(schema: dict, text: str) -> bool:
    data = text.encode()
    constraint = SchemaConstraint([bytes([b]) for b in range(256)], compile_schema(schema))
    for byte in data:
        if not constraint.allows(byte):
            return False
        constraint.advance(byte)
    return constraint.complete


def test_an_option_whose_optional_property_is_empty_is_refused_not_dropped():
    schema = {"anyOf": [{"type": "object", "properties": {"a": {"type": "integer", "minimum": 5}}},
                        {"type": "array"}], "properties": {"a": {"maximum": 3}}}
    with pytest.raises(SchemaError, match=r"anyOf\[0\]\.properties\.a: no integer lies within its bounds"):
        compile_schema(schema)


def test_an_option_whose_items_are_empty_is_refused_not_dropped():
    schema = {"anyOf": [{"type": "array", "items": {"type": "integer", "minimum": 5}}, {"type": "object"}],
              "items": {"maximum": 3}}
    with pytest.raises(SchemaError, match=r"anyOf\[0\]\.items: no integer lies within its bounds"):
        compile_schema(schema)


def test_an_option_that_contradicts_itself_is_refused_by_its_own_path():
    schema = {"type": "object", "properties": {"v": {
        "anyOf": [{"type": "integer", "minimum": 5, "maximum": 3}, {"type": "string"}], "maxLength": 4}}}
    with pytest.raises(SchemaError, match=r"v\.anyOf\[0\]: no integer lies within its bounds"):
        compile_schema(schema)


def test_an_option_the_merge_empties_is_still_dropped():
    schema = {"type": "object", "properties": {"v": {"anyOf": [{"maximum": 3}, {"minimum": 10}], "minimum": 5,
                                                     "type": "integer"}}, "required": ["v"]}
    assert _accepts(schema, '{"v":12}')
    assert not _accepts(schema, '{"v":2}')


def test_an_option_whose_required_property_the_merge_empties_is_dropped():
    schema = {"type": "object", "properties": {"v": {
        "anyOf": [{"type": "object", "properties": {"a": {"type": "integer", "minimum": 5}}, "required": ["a"]},
                  {"type": "null"}], "properties": {"a": {"maximum": 3}}}}, "required": ["v"]}
    assert _accepts(schema, '{"v":null}')
    assert not _accepts(schema, '{"v":{"a":3}}')


def test_object_keywords_do_not_empty_a_null_option():
    schema = {"type": "object", "properties": {"v": {
        "anyOf": [{"type": "object"}, {"type": "null"}],
        "allOf": [{"properties": {"a": {"type": "string"}}},
                  {"properties": {"a": {"type": "integer"}}, "required": ["a"]}]}}, "required": ["v"]}
    assert _accepts(schema, '{"v":null}')
    assert not _accepts(schema, '{"v":{}}')


def test_an_optional_property_the_merge_leaves_out_is_no_further_key():
    schema = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": True},
                        {"properties": {"a": {"type": "string"}}}]}
    assert _accepts(schema, '{"b":1}')
    assert not _accepts(schema, '{"a":"x"}')
    assert not _accepts(schema, '{"a":1}')
