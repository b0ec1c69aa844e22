"""Review 47 of tool calling (edgesdk/serve/tools.py): a named tool_choice of a function whose name is one of
tool_choice's modes, and a ``tools`` field that is no array."""

from __future__ import annotations

import json

import pytest

from edgesdk.serve.tools import ToolError, parse_tools
from tests.unit.test_tools import _accepts

OTHER = {"type": "function", "function": {"name": "other"}}


@pytest.mark.parametrize("name", ["none", "auto", "required"])
def test_a_named_choice_forces_a_call_of_a_function_named_like_a_mode(name):
    """OpenAI's rule for a function's name allows "none", "auto" and "required"; ``{"type": "function",
    "function": {"name": ...}}`` names the function, so the answer must be a call of it (before: "none" offered
    no tools at all, "auto" let the model answer in text, "required" let it call any tool)."""
    tool = {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}
    tools = parse_tools({"tools": [tool, OTHER], "tool_choice": {"type": "function", "function": {"name": name}}})
    assert tools is not None
    assert tools.choice == name
    call = json.dumps({"tool_call": {"name": name, "arguments": {"q": "x"}}})
    assert _accepts(tools, call)
    assert not _accepts(tools, '{"response": "Hello!"}')
    assert not _accepts(tools, '{"tool_call": {"name": "other", "arguments": {}}}')
    assert '"other"' not in tools.instructions
    # the modes themselves still mean what they mean beside such a tool
    assert parse_tools({"tools": [tool, OTHER], "tool_choice": "none"}) is None
    auto = parse_tools({"tools": [tool, OTHER], "tool_choice": "auto"})
    assert auto.choice == "auto"
    assert _accepts(auto, '{"response": "Hello!"}')
    assert _accepts(auto, '{"tool_call": {"name": "other", "arguments": {}}}')


@pytest.mark.parametrize("tools", [{}, "", False, 0])
def test_tools_that_is_no_array_is_refused_even_when_empty(tools):
    """``tools`` must be an array (OpenAI's schema; llama-server refuses one that is not); an empty object, string
    or false was read as no tools, and the request answered without them."""
    with pytest.raises(ToolError) as raised:
        parse_tools({"tools": tools})
    assert raised.value.param == "tools"
    assert "must be an array" in raised.value.message
    assert type(tools).__name__ in raised.value.message


@pytest.mark.parametrize("tools", [None, []])
def test_null_or_an_empty_array_is_no_tools(tools):
    assert parse_tools({"tools": tools}) is None
    assert parse_tools({"tools": tools, "tool_choice": "none"}) is None
