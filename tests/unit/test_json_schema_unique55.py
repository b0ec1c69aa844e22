"""uniqueItems in a tool's parameters (lenient_schema) and beside prefixItems (compile_schema)."""

import pytest

from edgesdk.runtime.json_schema import SchemaConstraint, SchemaError, compile_schema, lenient_schema
from edgesdk.serve.tools import _function

BYTES = [bytes([i]) for i in range(256)]

# zod-to-json-schema's z.set(z.object({name: z.string()}))
SET_OF_OBJECTS = {"type": "array", "uniqueItems": True,
                  "items": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
                            "additionalProperties": False}}
# pydantic's set[Annotated[str, Field(max_length=8)]]
SET_OF_SHORT_STRINGS = {"type": "array", "uniqueItems": True, "items": {"type": "string", "maxLength": 8}}


def _parameters(tags: dict, **extra) -> dict:
    return {"type": "object", "properties": {"tags": tags}, "required": ["tags"], **extra}


def _accepts(compiled, text: bytes) -> bool:
    constraint = SchemaConstraint(BYTES, compiled)
    for byte in text:
        if not constraint.allows(byte):
            return False
        constraint.advance(byte)
    return constraint.complete


@pytest.mark.parametrize(("tags", "what"), [(SET_OF_OBJECTS, "over objects"),
                                          (SET_OF_SHORT_STRINGS, "over strings with a pattern, format or maxLength")])
def test_tool_with_unique_items_the_compiler_cannot_follow_is_taken_and_names_the_drop(tags, what):
    tool = _function({"type": "function", "function": {"name": "tag", "parameters": _parameters(tags)}}, 0)
    assert f"$.properties.tags.uniqueItems ({what})" in tool["ignored"]
    constraint, dropped = lenient_schema(_parameters(tags))
    assert dropped == (f"$.properties.tags.uniqueItems ({what})",)
    assert "uniqueItems" not in constraint["properties"]["tags"]
    compiled = compile_schema(constraint)
    assert _accepts(compiled, b'{"tags": ["ab", "ab"]}' if tags is SET_OF_SHORT_STRINGS
                    else b'{"tags": [{"name": "a"}, {"name": "a"}]}')


def test_unique_items_over_objects_reached_through_a_ref_is_dropped():
    schema = _parameters({"type": "array", "uniqueItems": True, "items": {"$ref": "#/$defs/Tag"}},
                         **{"$defs": {"Tag": {"type": "object", "properties": {"name": {"type": "string"}}}}})
    constraint, dropped = lenient_schema(schema)
    assert dropped == ("$.properties.tags.uniqueItems (over objects)",)
    compile_schema(constraint)


def test_unique_array_itself_under_defs_is_judged_where_it_is_defined():
    schema = _parameters({"$ref": "#/$defs/Tags"}, **{"$defs": {"Tags": SET_OF_OBJECTS}})
    constraint, dropped = lenient_schema(schema)
    assert dropped == ("$.$defs.Tags.uniqueItems (over objects)",)
    compile_schema(constraint)


@pytest.mark.parametrize("items", [{"type": "integer"}, {"type": "string"}, {"enum": ["a", "b", "c"]},
                                   {"$ref": "#/$defs/Word"}])
def test_unique_items_over_scalars_is_kept_and_followed(items):
    schema = _parameters({"type": "array", "uniqueItems": True, "items": items},
                         **{"$defs": {"Word": {"type": "string"}}})
    constraint, dropped = lenient_schema(schema)
    assert dropped == ()
    assert constraint is schema  # nothing dropped: the schema itself
    compiled = compile_schema(constraint)
    duplicate = b'{"tags": [1, 1]}' if items == {"type": "integer"} else b'{"tags": ["a", "a"]}'
    assert not _accepts(compiled, duplicate)


def test_outer_unique_over_objects_dropped_inner_scalar_one_kept():
    inner = {"type": "array", "uniqueItems": True, "items": {"type": "integer"}}
    schema = _parameters({"type": "array", "uniqueItems": True,
                          "items": {"type": "object", "properties": {"ids": inner}}})
    constraint, dropped = lenient_schema(schema)
    assert dropped == ("$.properties.tags.uniqueItems (over objects)",)
    assert constraint["properties"]["tags"]["items"]["properties"]["ids"]["uniqueItems"] is True
    compiled = compile_schema(constraint)
    assert not _accepts(compiled, b'{"tags": [{"ids": [1, 1]}]}')
    assert _accepts(compiled, b'{"tags": [{"ids": [1]}, {"ids": [1]}]}')


def test_response_format_still_refuses_unique_items_over_objects_by_name():
    with pytest.raises(SchemaError, match=r"\$\.properties\.tags: uniqueItems over objects is not supported"):
        compile_schema(_parameters(SET_OF_OBJECTS))


def test_unique_items_beside_a_closed_tuple_is_refused_not_ignored():
    tuple_schema = {"type": "array", "prefixItems": [{"enum": [1, 2]}, {"enum": [1, 2]}], "items": False,
                    "uniqueItems": True}
    with pytest.raises(SchemaError, match=r"uniqueItems beside prefixItems is not supported"):
        compile_schema(tuple_schema)
    constraint, dropped = lenient_schema(_parameters(tuple_schema))
    assert dropped == ("$.properties.tags.uniqueItems (beside prefixItems)",)
    compile_schema(constraint)


def test_unique_items_beside_a_one_item_tuple_is_unique_already():
    one = {"type": "array", "prefixItems": [{"type": "object"}], "items": False, "uniqueItems": True}
    compile_schema(one)
    assert lenient_schema(_parameters(one))[1] == ()


def test_a_refused_definition_no_ref_reaches_does_not_keep_another_arrays_unique_items():
    schema = _parameters({"$ref": "#/$defs/Tags"}, **{"$defs": {
        "Empty": {"type": "integer", "minimum": 5, "maximum": 1},  # no value; reached by Unused only
        "Unused": {"type": "array", "uniqueItems": True, "items": {"$ref": "#/$defs/Empty"}},
        "Tags": SET_OF_OBJECTS}})
    constraint, dropped = lenient_schema(schema)
    assert dropped == ("$.$defs.Tags.uniqueItems (over objects)",)
    compile_schema(constraint)


def test_unique_items_over_a_ref_cycle_is_left_for_compile_schema_to_refuse():
    schema = _parameters({"type": "array", "uniqueItems": True, "items": {"$ref": "#/$defs/Loop"}},
                         **{"$defs": {"Loop": {"$ref": "#/$defs/Loop"}}})
    constraint, dropped = lenient_schema(schema)
    assert dropped == ()
    with pytest.raises(SchemaError, match="refers to itself"):
        compile_schema(constraint)
