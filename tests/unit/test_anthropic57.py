"""serve's Anthropic Messages API (edgesdk/serve/anthropic.py): refusals that name the field at fault: a tool
result's block by its own index, a content block that is no block object, and ``disable_parallel_tool_use`` of
the wrong type whether or not the request has tools."""

from __future__ import annotations

import pytest

from edgesdk.serve.anthropic import parse_messages_request
from edgesdk.serve.api import ApiError

MESSAGES = [{"role": "user", "content": "Weather?"}]
TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def _refused(body: dict) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_messages_request({"max_tokens": 8, **body})
    assert caught.value.status == 400
    return caught.value


def _result(content: list) -> list:
    return [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": content}]}]


def test_a_tool_result_s_bad_block_is_named_by_its_index():
    """Before, both were named ``messages[0].content[0].content``: a text not UTF-8 at "character 0" of the second
    block read as the first block's."""
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    error = _refused({"messages": _result([{"type": "text", "text": "18 C"}, image])})
    assert error.param == "messages[0].content[0].content[1]"
    assert error.message.startswith("messages[0].content[0].content[1] must be a text block")
    error = _refused({"messages": _result([{"type": "text", "text": "18 C"}, {"type": "text", "text": "\ud800"}])})
    assert error.param == "messages[0].content[0].content[1].text"
    assert "U+D800" in error.message


@pytest.mark.parametrize("block", ["hello", {"text": "hello"}])
def test_a_content_block_without_its_type_is_named_as_such(block):
    """Before: 'messages[0].content[0] is a 'hello' block', as if "hello" were a block type."""
    error = _refused({"messages": [{"role": "user", "content": [block]}]})
    assert error.param == "messages[0].content[0]"
    assert "must be a content block object" in error.message
    assert "block in a user turn" not in error.message


@pytest.mark.parametrize("tools", [None, [], [TOOL]])
def test_disable_parallel_tool_use_must_be_a_boolean_with_tools_or_without(tools):
    """Before, "true" (a string) was refused with tools and taken without them."""
    body = {"messages": MESSAGES, "tool_choice": {"type": "auto", "disable_parallel_tool_use": "true"}}
    error = _refused(body if tools is None else {**body, "tools": tools})
    assert error.param == "tool_choice.disable_parallel_tool_use"
    assert "'true'" in error.message or '"true"' in error.message


def test_a_tool_result_of_text_blocks_is_still_their_text():
    asked = [{"role": "user", "content": "Weather?"},
             {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}]}]
    request = parse_messages_request({"max_tokens": 8, "messages": [*asked, *_result(
        [{"type": "text", "text": "18 "}, {"type": "text", "text": "C"}])]})
    assert "18 C" in request.messages[-1]["content"]
