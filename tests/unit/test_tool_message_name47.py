"""A ``tool`` message's own ``name`` names the tool where no earlier call's id does (llama.cpp's
``common_chat_msgs_parse_oaicompat`` reads it as the message's tool_name)."""

from __future__ import annotations

import json

from edgesdk.serve.api import parse_chat_request


def tool_response(body: dict) -> dict:
    request = parse_chat_request(body)
    turn = next(message for message in request.messages if "tool_response" in message["content"])
    return json.loads(turn["content"])["tool_response"]


def test_a_tool_message_without_a_known_call_id_is_named_by_its_own_name():
    body = {"messages": [{"role": "user", "content": "weather?"},
                         {"role": "tool", "name": "get_weather", "content": "20C"}]}
    assert tool_response(body) == {"tool": "get_weather", "content": "20C"}


def test_the_call_it_answers_names_it_before_its_own_name():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    body = {"messages": [{"role": "user", "content": "weather?"},
                         {"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "call_1", "name": "other", "content": "20C"}]}
    assert tool_response(body)["tool"] == "get_weather"
    body["messages"][2].pop("name")
    assert tool_response(body)["tool"] == "get_weather"
