"""Tool descriptions the prompt cannot hold, and a 'tools' that is no array, refused naming the field each route
was sent (edgesdk/serve/tools.py, edgesdk/serve/anthropic.py, edgesdk/serve/responses.py)."""

from __future__ import annotations

import json

import pytest

from edgesdk.serve import anthropic, responses
from edgesdk.serve.api import ApiError, parse_chat_request
from tests.unit.test_tools import server  # noqa: F401 (a fixture: room for the tools' description)

HI = [{"role": "user", "content": "hi"}]
LONE = "a\ud800"  # a lone surrogate, as the JSON escape "\ud800" without its pair gives
DEEP = {"type": "object", "properties": {"city": {"type": "string", "description": LONE}}}


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"messages": HI, "tools": [{"type": "function", "function": {
        "name": "w", "description": LONE}}]}, "tools[0].function.description"),
    ("/v1/chat/completions", {"messages": HI, "tools": [{"type": "function", "function": {
        "name": "w", "parameters": DEEP}}]}, "tools[0].function.parameters"),
    ("/v1/messages", {"max_tokens": 2, "messages": HI, "tools": [{"name": "w", "description": LONE,
                                                                  "input_schema": {"type": "object"}}]},
     "tools[0].description"),
    ("/v1/messages", {"max_tokens": 2, "messages": HI, "tools": [{"name": "w", "input_schema": DEEP}]},
     "tools[0].input_schema"),
    ("/v1/responses", {"input": "hi", "tools": [{"type": "function", "name": "w", "description": LONE}]},
     "tools[0].description"),
])
def test_a_tool_description_that_is_not_utf8_is_refused_naming_the_tool(server, path, body, param):  # noqa: F811
    # the tools' description is a system message the server writes: the refusal names the tool, not that message
    status, _, payload = server.request("POST", path, raw=json.dumps({**body, "max_tokens": 2}
                                                                       if path.endswith("completions") else body).encode())
    assert status == 400, payload
    answer = json.loads(payload)
    error = answer["error"]
    message = error["message"]
    assert message.startswith(f"{param} is not valid UTF-8"), message
    assert "messages[0]" not in message
    if "param" in error:
        assert error["param"] == param


def test_the_parsers_name_the_tool_field_of_their_own_api():
    with pytest.raises(ApiError) as chat:
        parse_chat_request({"messages": HI, "tools": [{"type": "function", "function": {
            "name": "w", "description": LONE}}]})
    assert chat.value.param == "tools[0].function.description"
    with pytest.raises(ApiError) as messages:
        anthropic.parse_messages_request({"max_tokens": 2, "messages": HI, "tools": [{"name": "w", "input_schema": DEEP}]})
    assert messages.value.param == "tools[0].input_schema"
    with pytest.raises(ApiError) as responded:
        responses.parse_responses_request({"input": "hi", "tools": [{"type": "function", "name": "w",
                                                                     "description": LONE}]})
    assert responded.value.param == "tools[0].description"


@pytest.mark.parametrize("tools", [{}, "", False, 0])
def test_anthropic_tools_that_are_no_array_are_refused_not_read_as_none(tools):
    # the chat and Responses routes refuse them: read as no tools, the answer would be text without a word
    with pytest.raises(ApiError) as refused:
        anthropic.parse_messages_request({"max_tokens": 2, "messages": HI, "tools": tools})
    assert refused.value.param == "tools"
    assert "must be an array" in refused.value.message


def test_anthropic_tools_empty_or_null_are_no_tools():
    for tools in ([], None):
        assert anthropic.parse_messages_request({"max_tokens": 2, "messages": HI, "tools": tools}).tools is None
