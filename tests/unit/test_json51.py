"""Review 51 of the JSON schema constraint (edgesdk/runtime/json_schema.py, json_pattern.py) against JSON Schema
2020-12 and llama.cpp's converter (common/json-schema-to-grammar.cpp):

* an ``enum`` / ``const`` value holding a quote, a backslash or a control character was checked against the
  ``pattern`` beside it with the answer's own matcher, which reads only the characters a JSON string holds
  unescaped: a value that matches was dropped (and a schema whose every value was dropped, or whose pattern needs
  such a character, refused), though the answer writes it escaped and a validator reads it as it is;
* the spacing between tokens allowed one newline only, where llama.cpp's SPACE_RULE (``| " " | "\\n"{1,2}
  [ \\t]{0,20}``), which the module's docstring names as the one followed, allows a blank line too;
* ``prefixItems`` written as one schema (``{"type": "array", "prefixItems": {"type": "string"}}``) was refused, where
  llama.cpp's converter (its test "string array") reads it as every item's schema;
* the schema ``false`` (2020-12 core, section 4.3.2) as a property's schema, an anyOf / oneOf option or a
  prefixItems position was refused as "a schema must be an object or true" with the fix "fix the schema"; it is
  followed now (the property never written, the option left out, the array ended before the position).

``oneOf`` stays followed as ``anyOf``, as llama.cpp's converter follows it (one union rule for either); the module's
docstring now says that an answer matching two of its options is written."""

from __future__ import annotations

import json

import pytest

from edgesdk.runtime.json_schema import MAX_INDENT, SchemaError, compile_schema
from tests.unit.test_json_schema_allof40 import _takes

# ------------------------------------------------------------ a literal's escaped characters and its pattern


@pytest.mark.parametrize(("value", "pattern"), [
    ('a"b', "^.{3}$"),  # a quote: the pattern's "." reads it
    ("C:\\dir", "^C:\\\\"),  # a backslash the pattern names (escaped in the regular expression)
    ("line\nbreak", "\\s"),  # a newline, which \s reads
    ("tab\there", "^tab\\there$"),
])
def test_an_enum_value_with_a_character_written_escaped_is_kept_where_it_matches_the_pattern(value, pattern):
    # JSON Schema 2020-12 validation, section 6.3.3: the value (as parsed) must match the pattern; it was refused
    # ("no value of its enum is also ... within its pattern", or "needs a character a JSON string holds only escaped")
    schema = {"type": "object", "properties": {"v": {"type": "string", "enum": [value, "zz"], "pattern": pattern}},
              "required": ["v"]}
    compile_schema(schema)
    assert _takes(schema, json.dumps({"v": value}))
    assert not _takes(schema, '{"v":"zz"}')  # still filtered: "zz" does not match
    const = {"type": "object", "properties": {"v": {"const": value, "pattern": pattern}}, "required": ["v"]}
    assert _takes(const, json.dumps({"v": value}))


def test_an_enum_value_with_an_escaped_character_that_does_not_match_is_still_left_out():
    schema = {"type": "object", "properties": {"v": {"enum": ['a"b', "abc"], "pattern": "^[a-c]+$"}},
              "required": ["v"]}
    assert _takes(schema, '{"v":"abc"}')
    assert not _takes(schema, '{"v":"a\\"b"}')
    with pytest.raises(SchemaError) as caught:
        compile_schema({"type": "object", "properties": {"v": {"const": 'a"b', "pattern": "^[a-c]+$"}}})
    assert "no value of its const is also" in caught.value.problem


def test_a_pattern_and_a_format_beside_an_enum_both_filter_it():
    schema = {"type": "object", "properties": {"v": {"enum": ["2024-01-02", "2024-13-02", "2023-01-02"],
                                                     "format": "date", "pattern": "^2024"}}, "required": ["v"]}
    assert _takes(schema, '{"v":"2024-01-02"}')
    assert not _takes(schema, '{"v":"2024-13-02"}')  # no such month
    assert not _takes(schema, '{"v":"2023-01-02"}')  # not the pattern


def test_a_pattern_beside_an_enum_that_matches_no_string_is_refused_naming_the_fix():
    with pytest.raises(SchemaError) as caught:
        compile_schema({"type": "object", "properties": {"v": {"enum": ["a"], "pattern": "x[]"}}})
    assert caught.value.problem == "$.properties.v.pattern: pattern 'x[]' matches no string (an empty class [] that " \
        "cannot be skipped)"
    assert caught.value.fix == "drop the [] from the pattern, or make it optional with ?"

def test_a_pattern_beside_an_enum_that_is_not_a_string_is_refused_by_name():
    with pytest.raises(SchemaError) as caught:
        compile_schema({"type": "object", "properties": {"v": {"enum": ["a"], "pattern": 5}}})
    assert "$.properties.v.pattern: a pattern must be a string" in caught.value.problem


def test_a_string_property_with_such_a_pattern_and_no_enum_is_still_refused_by_name():
    # the answer writes a pattern's string unescaped (json_pattern's docstring): without values to check, a
    # pattern that needs an escaped character cannot be followed
    with pytest.raises(SchemaError) as caught:
        compile_schema({"type": "object", "properties": {"v": {"type": "string", "pattern": '^"$'}}})
    assert "needs a character a JSON string holds only escaped" in caught.value.problem


# ------------------------------------------------------------ spacing: llama.cpp's "\n"{1,2} [ \t]{0,20}

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


def test_a_blank_line_between_tokens_is_taken_as_llama_cpp_s_space_rule_takes_it():
    assert _takes(PERSON, '{\n\n  "name": "a",\n\n  "age": 1\n\n}')
    assert _takes(PERSON, '{"name":"a","age":1\n\n\t}')  # after a number, as after any other token
    assert _takes(PERSON, '{\n\n' + " " * MAX_INDENT + '"name":"a","age":1}')


@pytest.mark.parametrize("gap", ["\n\n\n", "\n \n", " \n\n", "\n\n" + " " * (MAX_INDENT + 1), "\r\n"])
def test_spacing_past_llama_cpp_s_space_rule_is_still_refused(gap):
    assert not _takes(PERSON, "{" + gap + '"name":"a","age":1}')
    assert not _takes(PERSON, '{"name":"a","age":1' + gap + "}")


def test_no_blank_line_comes_before_the_answer_s_value():
    assert not _takes(PERSON, '\n\n{"name":"a","age":1}')


# ------------------------------------------------------------ prefixItems written as one schema (llama.cpp's reading)


def test_prefix_items_as_one_schema_is_every_item_s_as_llama_cpp_reads_it():
    # llama.cpp's tests/test-json-schema-to-grammar.cpp, "string array": root ::= "[" space (string ("," space
    # string)*)? "]" space; it was refused ("$.prefixItems must be an array of schemas")
    schema = {"type": "array", "prefixItems": {"type": "string"}}
    for text in ("[]", '["a"]', '["a","b","c"]'):
        assert _takes(schema, text), text
    for text in ("[1]", '["a",2]'):
        assert not _takes(schema, text), text
    bounded = {"prefixItems": {"type": "integer"}, "minItems": 1, "maxItems": 2}  # no type: an array's keywords
    assert _takes(bounded, "[1,2]")
    assert not _takes(bounded, "[]")
    assert not _takes(bounded, "[1,2,3]")
    nested = {"type": "object", "properties": {"tags": {"type": "array", "prefixItems": {"enum": ["x", "y"]}}},
              "required": ["tags"]}
    assert _takes(nested, '{"tags":["x","y","x"]}')
    assert not _takes(nested, '{"tags":["z"]}')


def test_prefix_items_as_one_schema_beside_items_is_refused_by_name():
    # llama.cpp reads items there and ignores prefixItems, which would drop the constraint it asks for
    with pytest.raises(SchemaError) as caught:
        compile_schema({"type": "array", "items": {}, "prefixItems": {"type": "string"}})
    assert "$.prefixItems is one schema" in caught.value.problem
    assert "beside items" in caught.value.problem
    assert '"prefixItems": [{...}, ...]' in caught.value.fix


def test_prefix_items_that_is_no_schema_names_the_fix():
    with pytest.raises(SchemaError) as caught:
        compile_schema({"type": "array", "prefixItems": "string"})
    assert caught.value.problem == '$.prefixItems must be an array of schemas, one per position, got "string"'
    assert '"prefixItems": [{"type": "string"}, ...]' in caught.value.fix


def test_a_tool_s_prefix_items_schema_is_read_leniently_inside():
    from edgesdk.runtime.json_schema import lenient_schema

    tool = {"type": "object", "properties": {"a": {"type": "array", "prefixItems": {"type": "string", "not": {}}}}}
    lenient, dropped = lenient_schema(tool)
    assert dropped == ("$.properties.a.prefixItems.not",)
    assert _takes(lenient, '{"a":["x"]}')


# ------------------------------------------------------------ a false schema (JSON Schema 2020-12 core, section 4.3.2)


def test_a_property_whose_schema_is_false_is_never_written():
    # it was refused ("$.properties.a: a schema must be an object or true, got false"), a valid schema
    schema = {"type": "object", "properties": {"a": False, "b": {"type": "integer"}}}
    assert _takes(schema, '{"b":1}')
    assert _takes(schema, "{}")
    assert not _takes(schema, '{"a":1}')
    extra = {"type": "object", "properties": {"a": False, "b": {"type": "integer"}},
             "additionalProperties": {"type": "string"}}
    assert _takes(extra, '{"b":1,"c":"x"}')
    assert not _takes(extra, '{"a":"x"}')  # not as a further key either
    assert not _takes(extra, '{"b":1,"a":"x"}')


def test_a_required_property_whose_schema_is_false_is_refused_by_name():
    with pytest.raises(SchemaError) as caught:
        compile_schema({"type": "object", "properties": {"a": False}, "required": ["a"]})
    assert caught.value.problem.startswith("$.properties.a is the schema false")
    assert caught.value.fix == "drop 'a' from required, or give it a schema"


@pytest.mark.parametrize("combiner", ["anyOf", "oneOf"])
def test_an_option_that_is_false_is_left_out(combiner):
    schema = {"type": "object", "properties": {"a": {combiner: [False, {"type": "integer"}]}}, "required": ["a"]}
    assert _takes(schema, '{"a":1}')
    assert not _takes(schema, '{"a":"x"}')
    with pytest.raises(SchemaError) as caught:
        compile_schema({"type": "object", "properties": {"a": {combiner: [False, False]}}})
    assert caught.value.problem == f"$.properties.a.{combiner}: every option is the schema false, so no value " \
        "satisfies it"


@pytest.mark.parametrize("keyword", ["prefixItems", "items"])
def test_a_position_that_is_false_ends_the_array_before_it(keyword):
    schema = {"type": "array", keyword: [{"type": "integer"}, False, {"type": "string"}]}
    assert _takes(schema, "[]")
    assert _takes(schema, "[1]")
    assert not _takes(schema, "[1,2]")
    assert not _takes(schema, '[1,"x"]')
    with pytest.raises(SchemaError) as caught:
        compile_schema({**schema, "minItems": 2})
    assert caught.value.problem == f"$: minItems 2 asks for more items than the 1 before {keyword}[1], the schema " \
        "false, which no item satisfies"


def test_a_property_whose_ref_is_false_is_left_out_as_false_itself_is():
    """An optional property whose schema is a $ref to false is never written, as a property false is; a required
    one leaves the object no value, refused by name."""
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/never"}, "b": {"type": "integer"}},
              "$defs": {"never": False}}
    assert _takes(schema, '{"b": 1}')
    assert not _takes(schema, '{"a": 1}')
    with pytest.raises(SchemaError) as caught:
        compile_schema({**schema, "required": ["a"]})
    assert caught.value.problem.startswith("$.properties.a is the schema false, which no value satisfies")
