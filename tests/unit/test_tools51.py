"""Tool calling as llama-server's chat path does it (tools51): earlier turns' calls whose arguments are not JSON."""

from __future__ import annotations

import json

from edgesdk.serve.api import parse_chat_request
from edgesdk.serve.tools import answer_message, call_text

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}


def test_an_answer_cut_inside_its_arguments_can_be_sent_back():
    """An answer cut by max_tokens inside a call's arguments comes back with those arguments as written (not JSON),
    as llama-server returns a partial call; the client's next request carries that message back, and llama-server
    renders it (minja's polyfill_tool_calls keeps arguments it cannot parse as the string). It was refused with a
    400 ("is not JSON text"), so an agent loop could not go on after a call cut short."""
    fields, finish_reason = answer_message('{"tool_call": {"name": "get_weather", "arguments": {"city": "Par',
                                           "length")
    assert finish_reason == "length"
    (call,) = fields["tool_calls"]
    assert call["function"]["arguments"] == '{"city": "Par'
    body = {"messages": [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", **fields},
                         {"role": "tool", "tool_call_id": call["id"], "content": "12 C"}],
            "tools": [WEATHER]}
    request = parse_chat_request(body)
    turn = next(message for message in request.messages if message["role"] == "assistant")
    assert json.loads(turn["content"]) == {"tool_call": {"name": "get_weather", "arguments": '{"city": "Par',
                                                         "id": call["id"]}}


def test_arguments_that_are_not_json_are_kept_as_their_string():
    """"" (a client's call with no arguments) and text that is no JSON value are the model's string as written;
    JSON text is read as its value, as before."""
    for arguments in ("", "{oops", "city=Paris"):
        text = call_text([{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": arguments}}],
                         "messages[1].tool_calls")
        assert json.loads(text) == {"tool_call": {"name": "f", "arguments": arguments, "id": "call_1"}}
    text = call_text([{"function": {"name": "f", "arguments": '{"n": 2}'}}], "m", parallel=True)
    assert json.loads(text) == {"tool_calls": [{"name": "f", "arguments": {"n": 2}}]}


def test_arguments_with_an_integer_past_python_s_digit_limit_do_not_fail_the_request():
    """Python reads no integer of more than 4,300 digits (a ValueError that is not a JSONDecodeError): such
    arguments failed the request with a 500 and a traceback; they are kept as their text."""
    arguments = '{"n": ' + "7" * 5000 + "}"
    request = parse_chat_request({"messages": [
        {"role": "user", "content": "count"},
        {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                                              "function": {"name": "f", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]})
    turn = next(message for message in request.messages if message["role"] == "assistant")
    assert json.loads(turn["content"]) == {"tool_call": {"name": "f", "arguments": arguments, "id": "call_1"}}
