"""The schema ``true`` at the root is ``{}`` (any object); a ``$ref`` to the schema ``false`` is left out where the
schema ``false`` itself is (an anyOf option, a position, items, additionalProperties); an enum or const
option that a type beside its anyOf leaves no value is dropped as empty, not refused for the keywords beside it."""

import pytest

from edgesdk.runtime.json_schema import SchemaError, compile_schema
from tests.unit.test_json_schema57 import _accepts


@pytest.mark.parametrize("schema", [True, "true"])
def test_the_schema_true_at_the_root_is_any_object_as_the_empty_schema_is(schema):
    """JSON Schema 2020-12 core, section 4.3.2: true is {}, which the root reads as any object (llama-server's "{}
    for any JSON"); it was refused as "the JSON schema must be an object, got bool"."""
    compiled = compile_schema(schema)
    assert compiled.root.kind == "object"
    assert _accepts(True, '{"a":[1,{"b":null}]}')
    assert not _accepts(True, "[1]")


def test_the_schema_false_at_the_root_is_refused_as_false():
    with pytest.raises(SchemaError, match="the JSON schema is false, which no value satisfies") as caught:
        compile_schema(False)
    assert '{"type": "object"}' in caught.value.fix


NEVER = {"Never": False}


@pytest.mark.parametrize(("schema", "taken", "refused"), [
    # an anyOf option: left out
    ({"type": "object", "properties": {"a": {"anyOf": [{"$ref": "#/$defs/Never"}, {"type": "null"}]}},
      "required": ["a"], "$defs": NEVER}, ['{"a":null}'], ['{"a":1}', "{}"]),
    # items: the array is empty
    ({"type": "array", "items": {"$ref": "#/$defs/Never"}, "$defs": NEVER}, ["[]"], ["[1]", "[null]"]),
    # a position: the array ends before it
    ({"type": "array", "prefixItems": [{"type": "integer"}, {"$ref": "#/$defs/Never"}], "$defs": NEVER},
     ["[]", "[7]"], ["[7,8]", '["a"]']),
    # additionalProperties, through a ref to a ref, with an annotation beside it: no further key
    ({"type": "object", "properties": {"a": {"type": "integer"}},
      "additionalProperties": {"$ref": "#/$defs/Alias", "description": "none"},
      "$defs": {"Never": False, "Alias": {"$ref": "#/$defs/Never"}}}, ['{"a":1}', "{}"], ['{"a":1,"b":2}', '{"b":2}']),
])
def test_a_ref_to_the_schema_false_is_left_out_as_false_itself_is(schema, taken, refused):
    """Each was refused as "#/$defs/Never is the schema false, which no value satisfies, where a value must be
    written", where the schema false written in place is left out (JSON Schema 2020-12 core, section 4.3.2)."""
    for text in taken:
        assert _accepts(schema, text), text
    for text in refused:
        assert not _accepts(schema, text), text


def test_a_ref_that_points_at_nothing_is_still_refused_where_false_would_be_left_out():
    schema = {"type": "object", "properties": {"a": {"anyOf": [{"$ref": "#/$defs/Gone"}, {"type": "null"}]}},
              "$defs": NEVER}
    with pytest.raises(SchemaError, match="points at no definition"):
        compile_schema(schema)


@pytest.mark.parametrize("schema", [
    # keywords beside an anyOf apply to each option: {"const": null} under type object has no value
    {"type": "object", "properties": {"v": {"type": "object", "properties": {"a": {"type": "integer"}},
                                            "anyOf": [{"const": None}, {"required": ["a"]}]}}, "required": ["v"]},
    # the same through an allOf
    {"type": "object", "properties": {"v": {"allOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}}},
        {"anyOf": [{"enum": [1, 2]}, {"required": ["a"]}]}]}}, "required": ["v"]},
])
def test_an_enum_option_that_the_type_beside_it_empties_is_dropped_not_refused(schema):
    """The option was refused as "keyword 'properties' beside enum is not supported" before its values were
    filtered by the type beside them, which leaves none: an option with no value is dropped (as elsewhere in an
    intersection's spread), and the schema is the other option's."""
    assert _accepts(schema, '{"v":{"a":3}}')
    for text in ('{"v":null}', '{"v":1}', '{"v":{}}', '{"v":{"a":"x"}}'):
        assert not _accepts(schema, text), text


def test_an_enum_that_its_type_empties_says_so_rather_than_naming_a_keyword_beside_it():
    with pytest.raises(SchemaError, match="no value of its enum is also of its type 'object'"):
        compile_schema({"type": "object", "properties": {"v": {"type": "object", "enum": [None, 1],
                                                              "properties": {"a": {}}}}})


def test_an_enum_with_values_left_and_an_unfiltered_keyword_beside_it_is_still_refused():
    with pytest.raises(SchemaError, match="keyword 'properties' beside enum is not supported"):
        compile_schema({"type": "object", "properties": {"v": {"enum": [{"a": 1}, None],
                                                              "properties": {"a": {"type": "integer"}}}}})
