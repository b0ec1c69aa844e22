"""``tool_choice`` refused for its own form before the missing tools are blamed; tool parameters whose root is an
object by a type list, a union of objects or an allOf are taken as the object they describe."""

from __future__ import annotations

import pytest

from edgesdk.serve.api import ApiError, parse_chat_request
from edgesdk.serve.tools import ToolError, parse_tools
from tests.unit.test_ollama49 import _accepts

USER = [{"role": "user", "content": "hi"}]
ARGS_A = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": False}
ARGS_B = {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"], "additionalProperties": False}


def _tool(parameters: dict) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


def _call(arguments: str) -> str:
    return f'{{"tool_call": {{"name": "f", "arguments": {arguments}}}}}'


@pytest.mark.parametrize("choice", ["requierd", {"type": "function"}, {"type": "function", "function": {}},
                                    {"type": "function", "function": {"name": 7}}, 3])
def test_a_malformed_tool_choice_without_tools_is_named_malformed_not_as_wanting_tools(choice):
    for tools in (None, []):
        with pytest.raises(ToolError) as refused:
            parse_tools({"tools": tools, "tool_choice": choice})
        assert refused.value.param == "tool_choice"
        assert "must be \"auto\", \"required\", \"none\"" in refused.value.message
        assert "needs 'tools'" not in refused.value.message


def test_a_function_choice_without_a_name_is_refused_by_its_form_not_as_a_tool_not_offered():
    with pytest.raises(ToolError) as refused:
        parse_tools({"tools": [_tool(ARGS_A)], "tool_choice": {"type": "function", "function": {}}})
    assert "does not offer" not in refused.value.message
    assert "must be" in refused.value.message


def test_a_well_formed_choice_without_tools_still_asks_for_tools():
    for choice in ("required", {"type": "function", "function": {"name": "f"}}):
        with pytest.raises(ToolError, match="needs 'tools'"):
            parse_tools({"tool_choice": choice})
    assert parse_tools({"tool_choice": "none"}) is None
    assert parse_tools({"tool_choice": "auto"}) is None


def test_the_chat_route_names_a_misspelt_tool_choice():
    with pytest.raises(ApiError) as refused:
        parse_chat_request({"messages": USER, "tool_choice": "requierd"})
    assert refused.value.param == "tool_choice"
    assert "got \"requierd\"" in refused.value.message


@pytest.mark.parametrize("parameters", [
    {**ARGS_A, "type": ["object"]},  # a type list of object alone
    {"anyOf": [ARGS_A, ARGS_B]},  # a union of objects at the root (zod's, Pydantic's root unions)
    {"oneOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}], "$defs": {"A": ARGS_A, "B": ARGS_B}},
    {"allOf": [{"$ref": "#/$defs/A"}], "$defs": {"A": ARGS_A}},  # Pydantic v1's root reference
])
def test_parameters_whose_root_is_an_object_by_list_union_or_allof_are_taken(parameters):
    tools = parse_tools({"tools": [_tool(parameters)], "tool_choice": "required"})
    assert _accepts(tools.schema, _call('{"a": "x"}'))
    for arguments in ('5', '"x"', '[1]', '{"a": 1}'):
        assert not _accepts(tools.schema, _call(arguments)), arguments


@pytest.mark.parametrize("parameters", [
    {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
     "anyOf": [{"required": ["a"]}, {"required": ["b"]}]},  # 'a or b required'
    {"type": "object", "properties": {"a": {"type": "string"}}, "oneOf": [{"required": ["a"]}, {}]},
])
def test_an_object_root_keeps_its_type_when_its_union_options_name_none(parameters):
    tools = parse_tools({"tools": [_tool(parameters)], "tool_choice": "required"})
    assert _accepts(tools.schema, _call('{"a": "x"}'))
    for arguments in ('5', '"x"', '[1]'):
        assert not _accepts(tools.schema, _call(arguments)), arguments


@pytest.mark.parametrize(("parameters", "got"), [
    ({"type": "array", "items": {"type": "string"}}, "root is array"),
    ({"anyOf": [ARGS_A, {"type": "array"}]}, "root is array or object"),
    ({"required": ["a"]}, "root names no type"),
    ({"anyOf": [{"required": ["a"]}, {"required": ["b"]}]}, "root names no type"),
    ({"type": "array", "anyOf": [{"required": ["a"]}, {}]}, "root is array"),
])
def test_parameters_that_may_be_no_object_are_refused_saying_what_their_root_is(parameters, got):
    with pytest.raises(ToolError, match="must describe an object") as refused:
        parse_tools({"tools": [_tool(parameters)]})
    assert refused.value.param == "tools[0].function.parameters"
    assert got in refused.value.message
    assert '"type": "object"' in refused.value.message
