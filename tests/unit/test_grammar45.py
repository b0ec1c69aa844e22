"""Review 45 of constrained sampling (edgesdk/runtime/json_schema.py, gbnf.py, json_pattern.py) against llama.cpp's
GBNF (grammars/README.md, src/llama-grammar.cpp) and its JSON-schema converter (common/json-schema-to-grammar.cpp,
examples/json_schema_to_grammar.py): schemas it takes that were refused or mistranslated here."""

from __future__ import annotations

import pytest

from edgesdk.runtime.json_schema import SchemaError, compile_schema
from tests.unit.test_json_schema import _feed


def _takes(schema: dict, text: str) -> bool:
    constraint = _feed(schema, text)
    return constraint is not None and constraint.complete


# ----------------------------------------------------------------------- {"type": "object"}: any object

@pytest.mark.parametrize("text", ['{"a":1}', '{"k":[1,{"x":null}],"b":"s"}', "{}"])
def test_an_object_with_neither_properties_nor_additional_properties_is_any_object(text):
    """JSON Schema and llama.cpp's converter (visit: ``schema_type == 'object'`` -> the ``object`` primitive) read
    ``{"type": "object"}`` as any object; it was read as ``{}`` only, so a free-form ``"metadata": {"type": "object"}``
    property could hold nothing."""
    schema = {"type": "object", "properties": {"meta": {"type": "object"}}, "required": ["meta"]}
    assert _takes(schema, '{"meta":' + text + "}")
    assert _takes({"type": "object"}, text)


def test_an_object_with_properties_still_reads_an_absent_additional_properties_as_false():
    """As llama.cpp's converter does (``'properties' in schema`` -> its object rule with no further keys)."""
    assert not _takes({"type": "object", "properties": {}}, '{"a":1}')
    assert not _takes({"type": "object", "properties": {"a": {"type": "integer"}}}, '{"a":1,"b":2}')


def test_a_required_key_that_properties_does_not_list_takes_the_additional_properties_schema():
    """JSON Schema 2020-12: ``required`` names keys that must be present whatever lists them; one not in
    ``properties`` has a value of ``additionalProperties``. It was refused even where further keys are allowed."""
    schema = {"type": "object", "required": ["a"]}
    assert _takes(schema, '{"a":[1]}')
    assert _takes(schema, '{"a":1,"b":2}')
    assert not _takes(schema, "{}")
    assert not _takes(schema, '{"b":2}')
    assert not _takes(schema, '{"a":1,"a":2}')
    typed = {"type": "object", "properties": {"b": {"type": "integer"}}, "additionalProperties": {"type": "string"},
             "required": ["a"]}
    assert _takes(typed, '{"b":1,"a":"x"}')
    assert _takes(typed, '{"a":"x","c":"y"}')
    assert not _takes(typed, '{"a":1}')
    with pytest.raises(SchemaError, match=r"required names \['b'\], which are not among its properties"):
        compile_schema({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"],
                        "additionalProperties": False})


# --------------------------------------------------------------- untyped prefixItems / additionalProperties

def test_untyped_prefix_items_and_additional_properties_are_read_as_array_and_object():
    """llama.cpp's converter takes ``{"prefixItems": [...]}`` as an array and ``{"additionalProperties": X}`` as
    an object without a ``type``; both were refused with a message that listed the keyword as supported."""
    assert _takes({"prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False}, '[1,"a"]')
    schema = {"type": "object", "properties": {"m": {"additionalProperties": {"type": "integer"}}}, "required": ["m"]}
    assert _takes(schema, '{"m":{"x":1,"y":2}}')
    assert not _takes(schema, '{"m":{"x":"1"}}')


# ---------------------------------------------------------------------- OpenAPI formats of numbers

def test_openapi_int32_and_int64_formats_bound_the_integer():
    """OpenAPI-derived tool schemas carry ``"format": "int32"`` etc.; llama.cpp's converter takes them (it writes
    a plain integer). They were refused as an unsupported keyword; int32 / int64 are followed as their ranges."""
    schema = {"type": "object", "properties": {"n": {"type": "integer", "format": "int32"},
                                               "x": {"type": "number", "format": "double"}}, "required": ["n", "x"]}
    assert _takes(schema, '{"n":2147483647,"x":1.5e3}')
    assert _takes(schema, '{"n":-2147483648,"x":1}')
    assert not _takes(schema, '{"n":2147483648,"x":1}')
    wide = {"type": "object", "properties": {"n": {"type": "integer", "format": "int64", "minimum": 0}},
            "required": ["n"]}
    assert _takes(wide, '{"n":9223372036854775807}')
    assert not _takes(wide, '{"n":9223372036854775808}')
    assert not _takes(wide, '{"n":-1}')


def test_a_string_format_on_a_number_is_refused_by_name():
    with pytest.raises(SchemaError, match=r'format "date" is not supported on integer'):
        compile_schema({"type": "object", "properties": {"n": {"type": "integer", "format": "date"}}})
    with pytest.raises(SchemaError, match=r"no integer lies within its bounds \(minimum 3000000000.0, format int32"):
        compile_schema({"type": "object", "properties": {"n": {"type": "integer", "format": "int32",
                                                               "minimum": 3e9}}})
    # a string's format beside a type list with a string in it is the string's
    assert _takes({"type": "array", "items": {"type": ["integer", "string"], "format": "date"}}, '[1,"2024-02-29"]')


# ------------------------------------------------------------------ draft 2019-09 / draft-07 tuples

def test_an_items_array_is_a_tuple_with_additional_items_after_it():
    """pydantic v1 writes ``Tuple[int, str]`` as ``{"items": [{...}, {...}], "minItems": 2, "maxItems": 2}`` and
    zod-to-json-schema writes tuples so (draft-07, ``additionalItems`` for the rest); llama.cpp's converter takes the
    array as the tuple. It was refused."""
    pair = {"type": "object", "properties": {"t": {"type": "array", "items": [{"type": "integer"}, {"type": "string"}],
                                                   "minItems": 2, "maxItems": 2}}, "required": ["t"]}
    assert _takes(pair, '{"t":[1,"a"]}')
    assert not _takes(pair, '{"t":[1,2]}')
    assert not _takes(pair, '{"t":[1]}')
    assert not _takes(pair, '{"t":[1,"a",3]}')
    rest = {"type": "array", "items": [{"type": "integer"}], "additionalItems": {"type": "string"}}
    assert _takes(rest, '[1,"a","b"]')
    assert _takes(rest, "[]")
    assert not _takes(rest, "[1,2]")
    closed = {"type": "array", "items": [{"type": "integer"}], "additionalItems": False}
    assert _takes(closed, "[1]")
    assert not _takes(closed, "[1,2]")
    with pytest.raises(SchemaError, match="minItems 2 asks for more items than its 1 items, and additionalItems is"):
        compile_schema({"type": "array", "items": [{"type": "integer"}], "additionalItems": False, "minItems": 2})
    with pytest.raises(SchemaError, match="prefixItems beside an array items"):
        compile_schema({"type": "array", "items": [{"type": "integer"}], "prefixItems": []})


# ------------------------------------------------------------------------- crashes on bad schemas

@pytest.mark.parametrize(("pattern", "message"), [
    ("[b-", "a character class is not closed"),  # an IndexError escaped the compile (a server's 500)
    (".[a-", "a character class is not closed"),
])
def test_a_pattern_that_ends_inside_a_class_range_is_refused_by_name(pattern, message):
    with pytest.raises(SchemaError, match=message):
        compile_schema({"type": "object", "properties": {"a": {"type": "string", "pattern": pattern}}})


@pytest.mark.parametrize(("schema", "message"), [
    # a null minLength / minItems compiled, then each answer's first string or array raised a TypeError
    ({"type": "object", "properties": {"a": {"type": "string", "minLength": None}}},
     r"\$.properties.a.minLength must be a non-negative integer, got None"),
    ({"type": "array", "minItems": None}, r"\$.minItems must be a non-negative integer, got None"),
    # a pattern that is no string: a TypeError (unhashable) escaped the compile
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": {}}}},
     r"\$.properties.a.pattern: a pattern must be a string"),
    ({"type": "object", "properties": {"a": {"type": ["string", "integer"], "pattern": ["a"]}}},
     r"\$.properties.a.pattern: a pattern must be a string"),
])
def test_a_keyword_of_the_wrong_type_is_refused_when_compiled(schema, message):
    with pytest.raises(SchemaError, match=message):
        compile_schema(schema)


# ------------------------------------------------------------- pattern anchors in top-level alternatives

def _pattern_takes(pattern: str, text: str) -> bool:
    from edgesdk.runtime.grammar import GrammarMatcher
    from edgesdk.runtime.json_pattern import string_matcher

    matcher = string_matcher(pattern)
    state = matcher.feed(matcher.start(), text.encode())
    return state is not None and GrammarMatcher.accepts(state)


@pytest.mark.parametrize(("pattern", "text", "matches"), [
    # "empty or a code": a common way to write an optional format; refused ("$ inside the pattern")
    ("^$|^[A-Z]{2}$", "", True), ("^$|^[A-Z]{2}$", "DE", True), ("^$|^[A-Z]{2}$", "D", False),
    ("^$|^[A-Z]{2}$", "DEU", False),
    # ECMA-262: ^a|b$ is "starts with a" or "ends with b"; it was read as ^(a|b)$, so "ax" and "xb" were refused
    ("^a|b$", "ax", True), ("^a|b$", "xb", True), ("^a|b$", "xa", False), ("^a|b$", "bx", False),
    ("^(a|b)$", "ax", False),
    ("x$|^y", "zx", True), ("x$|^y", "yz", True), ("x$|^y", "xz", False),
    (r"a\$", "za$z", True),  # an escaped $ is a character, not an anchor
    # "]" and "}" alone are characters (ECMA-262 Annex B.1.2, Python's re too); "]" was refused as unmatched
    ("^a]$", "a]", True), ("^[0-9]+]$", "12]", True),
])
def test_anchors_apply_to_each_top_level_alternative(pattern, text, matches):
    import re

    assert (re.search(pattern, text) is not None) is matches  # the oracle agrees with the expectation
    assert _pattern_takes(pattern, text) is matches


def test_an_anchor_inside_a_group_is_still_refused_by_name():
    with pytest.raises(SchemaError, match=r"\^ inside the pattern"):
        compile_schema({"type": "object", "properties": {"a": {"type": "string", "pattern": "(^a)"}}})
    with pytest.raises(SchemaError, match=r"\$ inside the pattern"):
        compile_schema({"type": "object", "properties": {"a": {"type": "string", "pattern": "a$b"}}})


def test_a_schema_with_an_empty_or_code_pattern_constrains_the_answer():
    schema = {"type": "object", "properties": {"c": {"type": "string", "pattern": "^$|^[A-Z]{2}$"}}, "required": ["c"]}
    assert _takes(schema, '{"c":""}')
    assert _takes(schema, '{"c":"FR"}')
    assert not _takes(schema, '{"c":"F"}')
    assert not _takes(schema, '{"c":"fr"}')
