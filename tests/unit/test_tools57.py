"""Tool calls at their edges: a tool's name is the whole of its text (no trailing newline slips past the rule), and
an earlier call's arguments holding ``NaN`` reach the prompt as the text written, as llama.cpp keeps arguments its
JSON parser refuses, and so do arguments holding a number past a double, which read would be written back as
``Infinity``."""

from __future__ import annotations

import json

import pytest

from edgesdk.serve.tools import ToolError, call_text, parse_tools


def _tool(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {
        "a": {"type": "number"}}}}}


@pytest.mark.parametrize("name", ["get_time\n", "get_time\n\n", "\nget_time"])
def test_a_tool_name_with_a_newline_is_refused_naming_it(name):
    with pytest.raises(ToolError) as caught:
        parse_tools({"tools": [_tool(name)]})
    assert caught.value.param == "tools[0].function.name"
    assert json.dumps(name) in caught.value.message


def test_a_tool_name_of_128_characters_is_still_taken():
    assert parse_tools({"tools": [_tool("a" * 128)]}).names == ("a" * 128,)


@pytest.mark.parametrize("arguments", ['{"a": NaN}', '{"a": Infinity}', '{"a": [1, -Infinity]}',
                                       '{"a": 1e400}', '{"a": -1e999}', '{"a": [1, {"b": 1e400}]}'])
def test_replayed_arguments_holding_nan_or_a_number_past_a_double_reach_the_prompt_as_written(arguments):
    text = call_text([{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": arguments}}],
                     "messages[1].tool_calls")
    assert json.loads(text, parse_constant=pytest.fail) == {
        "tool_call": {"name": "f", "arguments": arguments, "id": "call_1"}}


def test_replayed_json_arguments_are_still_read_as_their_value():
    text = call_text([{"type": "function", "function": {"name": "f", "arguments": '{"a": 1.5}'}}], "m")
    assert json.loads(text) == {"tool_call": {"name": "f", "arguments": {"a": 1.5}}}


def test_a_description_that_is_no_string_is_refused_showing_the_value():
    tool = {"type": "function", "function": {"name": "f", "description": ["Gets", "the time"]}}
    with pytest.raises(ToolError) as caught:
        parse_tools({"tools": [tool]})
    assert caught.value.param == "tools[0].function.description"
    assert '["Gets", "the time"]' in caught.value.message


def test_a_tool_named_twice_is_refused_saying_what_to_do():
    with pytest.raises(ToolError) as caught:
        parse_tools({"tools": [_tool("f"), _tool("f")]})
    assert "['f'] more than once" in caught.value.message
    assert "its own name" in caught.value.message
