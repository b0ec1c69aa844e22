"""``allOf`` of several schemas, and keywords beside an ``anyOf`` / ``oneOf``, in the JSON schema constraint
(edgesdk/runtime/json_schema.py): the forms OpenAPI inheritance (``allOf: [{$ref: Base}, {...}]``), zod's
intersections and "one of these properties is required" write. Every instance of a small set that the schema
validates (a JSON Schema check written here, allOf included) is taken, every other refused; what cannot be
followed is refused by name; an answer generated on the tiny bundle validates. Also pydantic's ``uuid1`` ...
``uuid8`` formats."""

from __future__ import annotations

import itertools
import json
import random
import uuid

import pytest
from pydantic import TypeAdapter, types

from edgesdk.runtime.json_schema import SchemaConstraint, SchemaError, compile_schema
from tests.unit.test_json_schema_extras37 import _walk

BYTES = [bytes([b]) for b in range(256)]  # a "tokenizer" whose token i is byte i


def _takes(schema: dict, text: str) -> bool:
    """The constraint takes ``text`` whole and ends there."""
    constraint = SchemaConstraint(BYTES, compile_schema(schema))
    for byte in text.encode():
        if not constraint.allows(byte):
            return False
        constraint.advance(byte)
    return constraint.complete


def _is(value, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and value.is_integer()
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, {"string": str, "boolean": bool, "null": type(None), "object": dict, "array": list}[kind])


def _valid(value, schema, root: dict) -> bool:
    """JSON Schema 2020-12 validation for the keywords these tests use (every keyword applies; an absent
    additionalProperties allows any further key; oneOf is exactly one)."""
    if schema is True or schema == {}:
        return True
    if schema is False:
        return False
    checks = []
    if "$ref" in schema:
        checks.append(_valid(value, root["$defs"][schema["$ref"].split("/")[-1]], root))
    checks.append(all(_valid(value, each, root) for each in schema.get("allOf", [])))
    if "anyOf" in schema:
        checks.append(any(_valid(value, each, root) for each in schema["anyOf"]))
    if "oneOf" in schema:
        checks.append(sum(_valid(value, each, root) for each in schema["oneOf"]) == 1)
    if "const" in schema:
        checks.append(json.dumps(value) == json.dumps(schema["const"]))
    if "enum" in schema:
        checks.append(any(json.dumps(value) == json.dumps(each) for each in schema["enum"]))
    if "type" in schema:
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        checks.append(any(_is(value, kind) for kind in kinds))
    if isinstance(value, str):
        checks.append(schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value)))
    if _is(value, "number"):
        checks.append(schema.get("minimum", value) <= value <= schema.get("maximum", value))
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        checks.append(all(name in value for name in schema.get("required", [])))
        for key, each in value.items():
            checks.append(_valid(each, properties[key], root) if key in properties else
                          _valid(each, schema.get("additionalProperties", True), root))
    if isinstance(value, list):
        checks.append(all(_valid(each, schema.get("items", True), root) for each in value))
    return all(checks)


def _instances(pool: dict):
    """Every object with some of ``pool``'s keys, in the pool's order, each with one of its values."""
    for choice in itertools.product(*([None, *values] for values in pool.values())):
        yield {key: value for key, value in zip(pool, choice, strict=True) if value is not None}


BASE = {"type": "object", "title": "Base", "properties": {"id": {"type": "integer", "minimum": 0},
                                                           "name": {"type": "string", "maxLength": 3}},
        "required": ["id"]}
# name -> (schema, pool of keys and values in the order the constraint writes them); a key that no schema of
# the way taken lists is never written (an absent additionalProperties reads as false here): WRITTEN says
# which keys an instance may hold where options list different ones
SCHEMAS = {
    # OpenAPI's inheritance: the base's properties first, then the extension's
    "openapi": ({"$defs": {"Base": BASE},
                 "allOf": [{"$ref": "#/$defs/Base"},
                           {"type": "object", "properties": {"age": {"type": "integer", "maximum": 150}},
                            "required": ["age"]}]},
                {"id": [-1, 0, 7], "name": ["", "abcd"], "age": [3, 151, "3"]}),
    # zod's z.intersection(z.object({a}), z.object({b})), the additionalProperties false it strips
    "zod": ({"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                       {"type": "object", "properties": {"b": {"type": "number"}}, "required": ["b"]}]},
            {"a": ["x", 1], "b": [1.5, "1.5", None]}),
    # at least one of email and phone: required lists in an anyOf beside the properties
    "one_of_required": ({"type": "object", "properties": {"email": {"type": "string"}, "phone": {"type": "string"}},
                         "anyOf": [{"required": ["email"]}, {"required": ["phone"]}]},
                        {"email": ["e", 5], "phone": ["p", False]}),
    # a property every component narrows: a number at least 0 and an integer at most 10
    "narrowed": ({"allOf": [{"type": "object", "properties": {"n": {"type": "number", "minimum": 0}}},
                            {"properties": {"n": {"type": "integer", "maximum": 10}, "k": {"enum": ["r", "g", "b"]}},
                             "required": ["n"]},
                            {"properties": {"k": {"enum": ["g", "b", "y"]}}}]},
                 {"n": [-1, 0, 2.5, 10, 11], "k": ["r", "g", "y"]}),
    # a discriminated union under a base: the kind's const picks the option, a const that matches none is refused
    "discriminated": ({"type": "object", "properties": {"kind": {"type": "string"}, "id": {"type": "integer"}},
                       "required": ["kind", "id"],
                       "oneOf": [{"properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
                                  "required": ["lives"]},
                                 {"properties": {"kind": {"const": "dog"}, "bark": {"type": "boolean"}}}],
                       "discriminator": {"propertyName": "kind"}},
                      {"kind": ["cat", "dog", "cow"], "id": [1], "lives": [9, True], "bark": [True]}),
    # one component's additionalProperties: false lists what the other gives; its maxLength narrows "a"
    "closed": ({"allOf": [{"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "boolean"}},
                           "additionalProperties": False},
                          {"properties": {"a": {"type": "string", "maxLength": 2}}, "required": ["a"]}]},
               {"a": ["ab", "abc"], "b": [True, 0]}),
    # a property one component lists is, to another, an additional one: it must satisfy that one's schema
    "additional": ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
                               "additionalProperties": {"type": "integer", "minimum": 5}},
                              {"properties": {"b": {"type": "integer"}}}]},
                   {"a": [1], "b": [4, 5], "z": [5, 4]}),
}


WRITTEN = {"discriminated": lambda value: set(value) <= {"kind", "id", {"cat": "lives", "dog": "bark"}.get(
    value.get("kind"), "id")}}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_valid_instance_is_taken_and_no_other(name):
    schema, pool = SCHEMAS[name]
    written = WRITTEN.get(name, lambda value: True)
    taken = valid = 0
    for value in _instances(pool):
        text = json.dumps(value, separators=(",", ":"))
        is_valid, is_taken = _valid(value, schema, schema) and written(value), _takes(schema, text)
        assert is_taken == is_valid, f"{name}: {text} {'taken' if is_taken else 'refused'}, valid: {is_valid}"
        taken, valid = taken + is_taken, valid + is_valid
    assert taken > 0
    assert valid > 0


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_random_walks_over_the_allowed_bytes_end_in_instances(name):
    """Beyond the pool: whatever bytes the constraint allows, a value it completes validates."""
    schema, _ = SCHEMAS[name]
    rng = random.Random(name)
    values = [_walk(schema, rng, limit=300) for _ in range(25)]
    done = [value for value in values if value is not None]
    assert done
    for value in done:
        assert _valid(value, schema, schema), value


def test_pretty_printed_and_recursive_answers():
    node = {"type": "object", "properties": {"v": {"type": "integer"},
                                             "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
            "required": ["v"]}
    schema = {"$defs": {"Node": node},
              "allOf": [{"$ref": "#/$defs/Node"}, {"properties": {"label": {"type": "string"}}, "required": ["label"]}]}
    assert _takes(schema, '{\n  "v": 1,\n  "kids": [{"v": 2, "kids": []}],\n  "label": "x"\n}')
    assert not _takes(schema, '{"v":1,"kids":[{"v":2}]}')  # the root's label is required
    assert not _takes(schema, '{"v":1,"kids":[{"v":2,"label":"x"}],"label":"x"}')  # a kid is a Node: no label


def test_an_optional_property_no_value_satisfies_is_never_written():
    schema = {"allOf": [{"type": "object", "properties": {"k": {"const": "a"}, "n": {"type": "integer"}}},
                        {"properties": {"k": {"const": "b"}}}]}
    assert _takes(schema, '{"n":1}')
    assert not _takes(schema, '{"k":"a","n":1}')
    assert not _takes(schema, '{"k":"b"}')


def test_keys_beyond_the_properties_are_written_only_where_a_component_allows_them():
    schema, _ = SCHEMAS["openapi"]
    assert not _takes(schema, '{"id":1,"age":2,"extra":0}')  # no component says additionalProperties
    opened = {"allOf": [schema["allOf"][1], {"properties": {"age": {}}, "additionalProperties": {"type": "string"}}]}
    assert _takes(opened, '{"age":2,"extra":"x"}')
    assert not _takes(opened, '{"age":2,"extra":0}')


def test_a_single_allof_beside_a_type_is_that_schema():
    """pydantic v1 and OpenAPI write a model field as ``{"allOf": [{"$ref": ...}], "type": "object"}``-like
    schemas; the type beside the allOf was refused as a keyword not supported."""
    schema = {"$defs": {"Base": BASE}, "type": "object",
              "properties": {"b": {"allOf": [{"$ref": "#/$defs/Base"}], "type": "object", "default": {"id": 0}}},
              "required": ["b"]}
    assert _takes(schema, '{"b":{"id":3,"name":"x"}}')
    assert not _takes(schema, '{"b":{"name":"x"}}')


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "object", "properties": {"a": {"allOf": [{"type": "string"}, {"type": "integer"}]}}},
     r"\$.properties.a: an allOf of 2 schemas with no value in common: \$.properties.a.allOf\[0\] has type "
     r"'string' and \$.properties.a.allOf\[1\] type 'integer'"),
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "string", "pattern": "^x$"}}},
                {"properties": {"a": {"type": "string", "pattern": "^y$"}}}]},
     r"\$.allOf\[0\].properties.a and \$.allOf\[1\].properties.a both give 'pattern'.*a string of both patterns"),
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False},
                {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
     r"\$.allOf\[1\] requires 'b', which \$.allOf\[0\] does not list and its additionalProperties false forbids"),
    ({"allOf": [{"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"]},
                {"anyOf": [{"properties": {"k": {"const": "b"}}}, {"properties": {"k": {"const": "c"}}}]}]},
     r"no value of \$.allOf\[0\].properties.k.const is in \$.allOf\[1\].anyOf\[0\].properties.k.const"),
    ({"$defs": {"T": {"allOf": [{"$ref": "#/$defs/T"}, {"type": "object"}]}}, "$ref": "#/$defs/T"},
     r"\$ref '#/\$defs/T' is intersected \(allOf\) with another schema inside its own definition"),
    ({"type": "object", "allOf": [{"anyOf": [{"required": []}, {"properties": {}}]} for _ in range(5)]},
     r"spreads into 32 options, more than the 16"),
    ({"allOf": [{"type": "object"}, {"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 2}}},
                {"properties": {"a": {"multipleOf": 0.3}}}]},
     r"both give 'multipleOf', as 2 and 0.3; a multiple of both that is not one of the two is not supported"),
    ({"type": "object", "allOf": [{"properties": {"a": {"type": "string"}}, "additionalProperties": False},
                                  {"required": ["b"]}]},
     r"\$.required names \['b'\], which are not among its properties"),
    ({"type": "object", "properties": {"t": {"allOf": [{"type": "array", "prefixItems": [{"type": "string"}]},
                                                        {"items": {"type": "integer"}}]}}},
     r"\$.properties.t.allOf\[0\] gives prefixItems and \$.properties.t.allOf\[1\] items for every position"),
    ({"type": "object", "allOf": [{"properties": {"a": {"type": "string"}}}, {"not": {"required": ["a"]}}]},
     r"\$: keyword 'not' is not supported"),
])
def test_what_cannot_be_followed_is_refused_by_name(schema, message):
    with pytest.raises(SchemaError, match=message) as refused:
        compile_schema(schema)
    assert refused.value.fix


def test_bounds_and_factors_of_two_components_combine():
    schema = {"type": "object", "properties": {"n": {"allOf": [
        {"type": "integer", "minimum": 2, "maximum": 40, "multipleOf": 4},
        {"minimum": 5, "maximum": 50, "multipleOf": 6}]}}, "required": ["n"]}
    taken = [n for n in range(-2, 60) if _takes(schema, f'{{"n":{n}}}')]
    assert taken == [12, 24, 36]  # multiples of 12 within 5 ... 40


# ------------------------------------------------------------------------------------- pydantic's uuidN


def _uuid_text(version: str, variant: str) -> str:
    digits = uuid.UUID(int=random.Random(version + variant).getrandbits(128)).hex
    return f"{digits[:8]}-{digits[8:12]}-{version}{digits[13:16]}-{variant}{digits[17:20]}-{digits[20:]}"


@pytest.mark.parametrize("version", range(1, 9))
def test_uuid_versions_are_written_as_pydantic_checks_them(version):
    """pydantic writes ``format: uuidN`` for UUID1, UUID3 ... UUID8 and checks the version digit and the
    RFC 9562 variant (Python's uuid.UUID(...).version); the format was refused."""
    schema = {"type": "object", "properties": {"u": {"type": "string", "format": f"uuid{version}"}},
              "required": ["u"]}
    adapter = TypeAdapter(getattr(types, f"UUID{version}")) if hasattr(types, f"UUID{version}") else None
    if adapter is not None:
        assert adapter.json_schema() == schema["properties"]["u"]
    for variant in "89abAB":
        text = _uuid_text(str(version), variant)
        assert _takes(schema, json.dumps({"u": text}))
        assert uuid.UUID(text).version == version
        if adapter is not None:
            adapter.validate_python(text)
    for wrong in (_uuid_text(str(version % 8 + 1), "8"), _uuid_text(str(version), "c"), _uuid_text(str(version), "7")):
        assert uuid.UUID(wrong).version != version
        assert not _takes(schema, json.dumps({"u": wrong}))
    with pytest.raises(SchemaError, match="format \"uuid9\" is not supported"):
        compile_schema({"type": "object", "properties": {"u": {"type": "string", "format": "uuid9"}}})


# ------------------------------------------------------------------------------------- on a tiny bundle

# A finite language: at most 8 gaps of 21 whitespace bytes and 25 other bytes, so the answer closes within
# 200 tokens (every token is at least one byte); the tiny bundle's context is 256.
FINITE = {"$defs": {"Base": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9}},
                             "required": ["id"]}},
          "allOf": [{"$ref": "#/$defs/Base"},
                    {"anyOf": [{"properties": {"size": {"enum": ["s", "m"]}}, "required": ["size"]},
                               {"properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}]}]}


def test_a_greedy_answer_on_the_tiny_bundle_validates(runtime):
    from edgesdk.runtime.generate import SamplingConfig, generate

    tokenizer = runtime.tokenizer
    constraint = SchemaConstraint(tokenizer.token_bytes(), compile_schema(FINITE))
    tokens, stats = generate(runtime.backend, tokenizer.prompt_ids("Give me JSON", raw=False),
                             SamplingConfig(max_new_tokens=200, temperature=0.0),
                             tokenizer.eos_token_ids, constraint=constraint)
    text = b"".join(tokenizer.token_bytes()[t] for t in tokens)
    assert stats.stop_reason == "complete", text
    value = json.loads(text)
    assert _valid(value, FINITE, FINITE), value
    assert list(value)[0] == "id"


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"enum": [["ab"], ["abcd"]], "minItems": 1}}, "required": ["a"]},
    {"type": "object", "properties": {"a": {"allOf": [{"type": "array", "items": {"type": "string"}},
                                                      {"const": ["a"]}]}}},
])
def test_a_keyword_beside_an_enum_is_refused_as_such_not_as_unsupported(schema):
    """'minItems' / 'items' are supported on their own; beside an enum or const (also one an allOf merged) the
    refusal said they were not supported at all, and its fix listed them as supported. (A string's or a number's
    keywords beside one filter its values instead: tests/unit/test_jsonschema50.py.)"""
    with pytest.raises(SchemaError, match=r"keyword '(minItems|items)' beside enum is not supported") as caught:
        compile_schema(schema)
    assert "keep only the enum values that satisfy" in caught.value.fix
