"""A count written as a float with no fraction (``"maxLength": 2.0``) is the integer JSON Schema reads it as; an
OpenAPI 3.0 nullable reference (``allOf`` beside ``nullable: true``) admits null in a tool's lenient schema."""

import pytest

from edgesdk.runtime.json_schema import SchemaError, compile_schema, lenient_schema
from tests.unit.test_json_schema57 import _accepts


def test_integral_float_counts_are_followed_as_integers():
    # 2020-12's meta-schema types counts as nonNegativeInteger, and 2.0 is an integer there (python-jsonschema
    # and llama.cpp's converter take it); Python's json.dumps writes a float count so
    schema = {"type": "array", "items": {"type": "string", "minLength": 1.0, "maxLength": 2.0},
              "minItems": 1.0, "maxItems": 2.0}
    assert _accepts(schema, '["ab","c"]')
    for text in ('[]', '["abc"]', '[""]', '["a","b","c"]'):
        assert not _accepts(schema, text)


def test_integral_float_counts_meet_in_an_allof():
    schema = {"type": "object", "properties": {"a": {"allOf": [{"type": "string", "maxLength": 3.0},
                                                               {"maxLength": 2}]}}, "required": ["a"]}
    assert _accepts(schema, '{"a":"ab"}')
    assert not _accepts(schema, '{"a":"abc"}')


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "string", "maxLength": 1.5}, r"\$.maxLength must be a non-negative integer, got 1.5"),
    ({"type": "array", "minItems": -1.0}, r"\$.minItems must be a non-negative integer, got -1.0"),
    ({"allOf": [{"type": "array", "maxItems": True}, {"maxItems": 2}]}, r"maxItems must be a non-negative integer"),
])
def test_counts_that_are_no_integer_are_still_refused_by_name(schema, message):
    with pytest.raises(SchemaError, match=message):
        compile_schema(schema)


def test_lenient_schema_reads_an_openapi_nullable_reference_as_admitting_null():
    # OpenAPI 3.0 allows no sibling beside $ref, so its writers mark a nullable reference with an allOf
    schema = {"type": "object", "properties": {"owner": {"allOf": [{"$ref": "#/$defs/User"}], "nullable": True}},
              "required": ["owner"],
              "$defs": {"User": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}}}
    lenient, dropped = lenient_schema(schema)
    assert dropped == ()
    assert _accepts(lenient, '{"owner":null}')
    assert _accepts(lenient, '{"owner":{"id":1}}')
    assert not _accepts(lenient, '{"owner":1}')


def test_a_ref_into_a_nullable_allof_still_points_at_its_schema():
    schema = {"type": "object", "properties": {"a": {"allOf": [{"type": "integer"}], "nullable": True},
                                               "b": {"$ref": "#/properties/a/allOf/0"}}, "required": ["a", "b"]}
    lenient, _ = lenient_schema(schema)
    assert _accepts(lenient, '{"a":null,"b":2}')
    assert not _accepts(lenient, '{"a":null,"b":null}')
