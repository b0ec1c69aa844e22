"""Local ``$ref`` JSON pointers beyond ``#/$defs/NAME`` (edgesdk/runtime/json_schema.py ``resolve_ref`` and
``hoist_refs``, edgesdk/serve/tools.py): ``#/properties/...`` (zod-to-json-schema's ref to a reused schema), ``#``
(a recursive root), nested ``$defs``, array indexes, RFC 6901's ``~0`` / ``~1`` and percent-encoding, as
llama.cpp's converter (examples/json_schema_to_grammar.py, ``resolve_refs``) follows any local pointer; and the
same refs in a tool's parameters, which keep their meaning when nested into the answer's schema."""

from __future__ import annotations

import json

import pytest

from edgesdk.runtime.json_schema import SchemaConstraint, SchemaError, compile_schema
from edgesdk.serve.tools import ToolError, parse_tools
from tests.unit.test_tools import server  # noqa: F401 (the module-scoped server fixture)

BYTES = [bytes([b]) for b in range(256)]  # a "tokenizer" whose token i is byte i

ADDRESS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
           "additionalProperties": False}
# zod-to-json-schema (its default $refStrategy "root") writes a schema used twice as a ref to its first place
ZOD = {"type": "object", "properties": {"home": ADDRESS, "work": {"$ref": "#/properties/home"}},
       "required": ["home", "work"], "additionalProperties": False}
# "#": the whole schema, a tree of nodes
TREE = {"type": "object", "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["v"], "additionalProperties": False}
ESCAPED = {"type": "object", "$defs": {"a/b": {"type": "integer"}, "c~d": {"type": "boolean"}, "e f": {"const": "x"},
                                       "50%": {"type": "null"}, "~1": {"type": "string"}},
           "properties": {"slash": {"$ref": "#/$defs/a~1b"}, "tilde": {"$ref": "#/$defs/c~0d"},
                          "space": {"$ref": "#/$defs/e%20f"}, "percent": {"$ref": "#/$defs/50%25"},
                          "both": {"$ref": "#/$defs/~01"}},
           "additionalProperties": False}
NESTED = {"type": "object", "$defs": {"outer": {"$defs": {"inner": {"type": "integer"}}, "type": "string"}},
          "properties": {"n": {"$ref": "#/$defs/outer/$defs/inner"}, "s": {"$ref": "#/$defs/outer"}},
          "additionalProperties": False}
INDEXED = {"type": "object", "properties": {"p": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                                            "q": {"$ref": "#/properties/p/anyOf/0"}},
           "additionalProperties": False}


def _accepts(schema, text: str) -> bool:
    constraint = SchemaConstraint(BYTES, schema if not isinstance(schema, dict) else compile_schema(schema))
    for byte in text.encode():
        if not constraint.allows(byte):
            return False
        constraint.advance(byte)
    return constraint.complete


@pytest.mark.parametrize(("schema", "good", "bad"), [
    (ZOD, ['{"home": {"city": "Oslo"}, "work": {"city": "Bergen"}}'],
     ['{"home": {"city": "Oslo"}, "work": {"town": "Bergen"}}', '{"home": {"city": "Oslo"}, "work": 1}',
      '{"home": {"city": "Oslo"}, "work": {}}']),
    (TREE, ['{"v": 1}', '{"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}, {"v": 4}]}'],
     ['{"v": 1, "kids": [{"v": "x"}]}', '{"v": 1, "kids": [{}]}', '{"v": 1, "kids": [1]}']),
    (ESCAPED, ['{"slash": 1, "tilde": true, "space": "x", "percent": null, "both": "s"}'],
     ['{"slash": true}', '{"tilde": 1}', '{"space": "y"}', '{"percent": 0}', '{"both": 1}']),
    (NESTED, ['{"n": 3, "s": "t"}'], ['{"n": "t"}', '{"s": 3}']),
    (INDEXED, ['{"p": null, "q": 2}'], ['{"q": null}']),
], ids=["properties", "root", "escapes", "nested-defs", "array-index"])
def test_each_local_pointer_constrains_the_answer(schema, good, bad):
    for text in good:
        assert _accepts(schema, text), text
    for text in bad:
        assert not _accepts(schema, text), text


def test_one_pointer_spelled_two_ways_is_one_definition():
    schema = {"type": "object", "$defs": {"A": {"type": "integer"}},
              "properties": {"x": {"$ref": "#/$defs/A"}, "y": {"$ref": "#/%24defs/A"}}}
    compiled = compile_schema(schema)
    assert list(compiled.definitions) == ["#/$defs/A"]
    assert _accepts(compiled, '{"x": 1, "y": 2}')
    assert not _accepts(compiled, '{"y": "2"}')


@pytest.mark.parametrize(("ref", "words"), [
    ("https://example.com/address.json", "only local definitions and other local references"),
    ("address.json#/properties/home", "only local definitions and other local references"),
    ("#home", "plain-name fragment"),
    ("#/properties/home~2", "holds no 'home~2'"),
    ("#/properties/home~1city", "holds no 'home/city'"),
    ("#/properties/office", "holds no 'office'"),
    ("#/properties/home/properties/city/type/x", "holds no 'x'"),
    ("#/$defs/missing", "points at no definition"),
    ("#/required/5", "holds no '5'"),
    ("#/required/01", "holds no '01'"),
])
def test_refs_that_point_nowhere_or_outside_are_refused_by_name(ref, words):
    schema = {**ZOD, "properties": {**ZOD["properties"], "work": {"$ref": ref}}}
    with pytest.raises(SchemaError, match="\\$ref") as caught:
        compile_schema(schema)
    assert words in caught.value.problem
    with pytest.raises(ToolError, match="tools\\[0\\].function.parameters") as caught:
        parse_tools({"tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]})
    assert words in caught.value.message


def test_a_recursive_root_that_never_ends_is_refused():
    with pytest.raises(SchemaError, match="#"):
        compile_schema({"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]})


# ------------------------------------------------------------------------------------- in a tool's parameters

MOVE = {"type": "function", "function": {"name": "move", "parameters": ZOD}}
GROW = {"type": "function", "function": {"name": "grow", "parameters": TREE}}
PERCENT = {"type": "function", "function": {"name": "pct", "parameters": ESCAPED}}
NEST = {"type": "function", "function": {"name": "nest", "parameters": NESTED}}


def _call(name: str, arguments: str) -> str:
    return f'{{"tool_call": {{"name": "{name}", "arguments": {arguments}}}}}'


def test_tool_parameters_keep_their_refs_meaning_inside_the_answers_schema():
    tools = parse_tools({"tools": [MOVE, GROW, PERCENT, NEST], "tool_choice": "required"})
    assert _accepts(tools.schema, _call("move", '{"home": {"city": "Oslo"}, "work": {"city": "Bergen"}}'))
    assert not _accepts(tools.schema, _call("move", '{"home": {"city": "Oslo"}, "work": {"town": "Bergen"}}'))
    assert _accepts(tools.schema, _call("grow", '{"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]}'))
    # "#" is the tool's parameters, not the answer's schema: a call nested in kids is no node
    assert not _accepts(tools.schema, _call("grow", '{"v": 1, "kids": [' + _call("grow", '{"v": 2}') + "]}"))
    assert not _accepts(tools.schema, _call("grow", '{"v": 1, "kids": [{"v": "x"}]}'))
    assert _accepts(tools.schema, _call("pct", '{"slash": 1, "tilde": false, "space": "x", "percent": null}'))
    assert not _accepts(tools.schema, _call("pct", '{"slash": false}'))
    assert _accepts(tools.schema, _call("nest", '{"n": 1, "s": "t"}'))
    assert not _accepts(tools.schema, _call("nest", '{"n": "t"}'))


def test_parameters_behind_a_pointer_ref_are_an_object():
    parameters = {"$ref": "#/%24defs/Args", "$defs": {"Args": {"type": "object", "properties": {"on": {
        "$ref": "#/$defs/Args/properties/off"}, "off": {"type": "boolean"}}}}}
    tools = parse_tools({"tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}],
                        "tool_choice": "required"})
    assert _accepts(tools.schema, _call("f", '{"on": true, "off": false}'))
    assert not _accepts(tools.schema, _call("f", '{"on": 1}'))
    listed = {"type": "function", "function": {"name": "g", "parameters": {"$ref": "#/$defs/L", "$defs": {
        "L": {"type": "array", "items": {"type": "integer"}}}}}}
    with pytest.raises(ToolError, match="must describe an object"):
        parse_tools({"tools": [listed]})


def test_a_response_format_with_a_root_ref_beside_tools_means_its_own_root():
    response = {"type": "object", "properties": {"n": {"type": "integer"}, "more": {"$ref": "#"}}, "required": ["n"],
                "additionalProperties": False}
    tools = parse_tools({"tools": [GROW]}, response)
    assert _accepts(tools.schema, '{"response": {"n": 1, "more": {"n": 2}}}')
    assert not _accepts(tools.schema, '{"response": {"n": 1, "more": {"v": 2}}}')  # not grow's "#"
    assert not _accepts(tools.schema, '{"response": {"n": 1, "more": {"response": {"n": 2}}}}')


# ------------------------------------------------------------------------------------- through the server

# on is required, same refers to it (#/properties/on), next is the whole parameters again (#)
SWITCH = {"type": "function", "function": {"name": "switch", "description": "Switch lamps in a chain", "parameters": {
    "type": "object", "properties": {"on": {"type": "boolean"}, "same": {"$ref": "#/properties/on"},
                                     "next": {"$ref": "#"}},
    "required": ["on", "same"], "additionalProperties": False}}}


def _valid_switch(arguments) -> bool:
    """The test's own check of SWITCH's parameters."""
    return (isinstance(arguments, dict) and set(arguments) <= {"on", "same", "next"} and {"on", "same"} <= set(arguments)
            and isinstance(arguments["on"], bool) and isinstance(arguments["same"], bool)
            and ("next" not in arguments or _valid_switch(arguments["next"])))


def test_a_tool_with_pointer_refs_is_called_through_the_server(server):  # noqa: F811
    body = {"messages": [{"role": "user", "content": "Switch the lamps"}], "tools": [SWITCH],
            "tool_choice": "required"}
    status, answer = server.post("/v1/chat/completions", body)
    assert status == 200, answer
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "switch"
    arguments = json.loads(call["function"]["arguments"])
    assert _valid_switch(arguments), arguments
