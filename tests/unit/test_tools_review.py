"""Tool calls on unusual requests: stop strings, logprobs, malformed earlier turns, parameters behind a $ref."""

from __future__ import annotations

import json

import pytest

from edgesdk.runtime.json_schema import SchemaConstraint
from edgesdk.serve.api import ApiError, parse_chat_request
from edgesdk.serve.tools import ToolError, answer_message, parse_tools
from tests._utils.chat_stream import accumulated_message
from tests.unit.test_tools import LIGHT, PING, server  # noqa: F401 (the module-scoped server fixture)


def test_an_answer_cut_by_a_stop_string_is_text_not_a_server_error(server):  # noqa: F811
    # Only ping may be called, so its name is always written, and the stop string cuts the JSON there.
    body = {"messages": [{"role": "user", "content": "ping"}], "tools": [PING], "tool_choice": "required",
            "stop": ["ping"]}
    status, answer = server.post("/v1/chat/completions", body)
    assert status == 200, answer
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert "tool_calls" not in choice["message"]
    # the JSON written before the stop string is the server's envelope, not an answer: empty, as llama-server's
    # partial parse (a stop string's answer is partial there too) gives nothing for it
    assert choice["message"]["content"] == ""

    events = server.stream("/v1/chat/completions", body)
    assert all("error" not in event for event in events[:-1]), events
    deltas = [event["choices"][0] for event in events[:-1]]
    assert deltas[1]["delta"] == {"content": choice["message"]["content"]}
    assert deltas[-1]["finish_reason"] == "stop"


def test_answer_message_reads_a_complete_answer_and_keeps_a_cut_one_as_text():
    assert answer_message('{"response": "h\u00e9"}', "stop") == ({"content": "h\u00e9"}, "stop")
    assert answer_message('{"tool_call": {"name": "', "stop") == ({"content": ""}, "stop")
    fields, finish = answer_message('{"tool_call": {"name": "ping", "arguments": {}}}', "stop")
    assert (fields["content"], finish, fields["tool_calls"][0]["function"]["name"]) == (None, "tool_calls", "ping")


@pytest.mark.parametrize(("messages", "param"), [
    ([{"role": "assistant", "content": None, "tool_calls": 5}], "messages[0].tool_calls"),
    ([{"role": "assistant", "content": None, "tool_calls": [
        {"id": ["call_1"], "type": "function", "function": {"name": "ping", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "pong"}], None),
    ([{"role": "user", "content": "ping"}, {"role": "tool", "tool_call_id": ["call_1"], "content": "pong"}],
     "messages[1].tool_call_id"),
])
def test_malformed_earlier_calls_are_refused_by_name_not_a_server_error(messages, param):
    if param is None:  # a call id that is no string answers nothing: the tool message names no function
        request = parse_chat_request({"messages": messages})
        assert json.loads(request.messages[1]["content"]) == {"tool_response": {"content": "pong", "tool_call_id": "call_1"}}
        return
    with pytest.raises(ApiError) as refused:
        parse_chat_request({"messages": messages})
    assert (refused.value.status, refused.value.param) == (400, param)


def test_parameters_whose_root_refers_to_an_array_are_refused_and_to_an_object_taken():
    listed = {"type": "function", "function": {"name": "f", "parameters": {
        "$ref": "#/$defs/items", "$defs": {"items": {"type": "array", "items": {"type": "string"}}}}}}
    with pytest.raises(ToolError, match="must describe an object") as refused:
        parse_tools({"tools": [listed]})
    assert refused.value.param == "tools[0].function.parameters"
    model = {"type": "function", "function": {"name": "f", "parameters": {
        "$ref": "#/definitions/Outer", "definitions": {
            "Outer": {"$ref": "#/definitions/Inner"},
            "Inner": {"type": "object", "properties": {"x": {"type": "string"}}}}}}}
    tools = parse_tools({"tools": [model]})
    constraint = SchemaConstraint([bytes([b]) for b in range(256)], tools.schema)
    for byte in b'{"tool_call": {"name": "f", "arguments": {"x": "y"}}}':
        assert constraint.allows(byte)
        constraint.advance(byte)
    assert constraint.complete


def test_a_streamed_tool_answer_carries_its_logprobs_as_a_whole_one_does(server):  # noqa: F811
    body = {"messages": [{"role": "user", "content": "Lamp"}], "tools": [PING, LIGHT], "tool_choice": "required",
            "logprobs": True, "top_logprobs": 2, "stream_options": {"include_usage": True}}
    status, whole = server.post("/v1/chat/completions", body)
    assert status == 200, whole
    (made,) = whole["choices"][0]["message"]["tool_calls"]
    # a call's content is null, so are its logprobs: the tokens are the hidden JSON's, which is no message's
    assert whole["choices"][0]["logprobs"] == {"content": None, "refusal": None}

    events = server.stream("/v1/chat/completions", body)
    entries = [entry for event in events[:-1] for choice in event["choices"]
               for entry in ((choice.get("logprobs") or {}).get("content") or [])]
    assert entries == []  # streamed alike: none of the JSON's tokens go out
    (call,) = accumulated_message([choice["delta"] for event in events[:-1] for choice in event["choices"]])[
        "tool_calls"]  # the call's arguments come in pieces, as llama-server streams them
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == (
        made["function"]["name"], json.loads(made["function"]["arguments"]))
    assert events[-2]["choices"] == []  # include_usage: the usage chunk still comes last
    # and counts the JSON's tokens, as the whole answer's usage does
    assert events[-2]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]


def _accepts(tools, text: str) -> bool:
    constraint = SchemaConstraint([bytes([b]) for b in range(256)], tools.schema)
    for byte in text.encode():
        if not constraint.allows(byte):
            return False
        constraint.advance(byte)
    return constraint.complete


@pytest.mark.parametrize(("parameters", "good", "bad"), [
    # a definitions table that holds nothing (compile_schema takes it) was merged as a mapping: TypeError
    ({"type": "object", "properties": {"a": {"type": "string"}}, "$defs": None}, {"a": "x"}, {"a": 1}),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "definitions": []}, {"a": "x"}, {"a": 1}),
    # one name in both tables: two definitions, as compile_schema reads them (the $defs one won for both)
    ({"type": "object", "properties": {"a": {"$ref": "#/definitions/X"}, "b": {"$ref": "#/$defs/X"}},
      "required": ["a", "b"], "definitions": {"X": {"type": "string"}}, "$defs": {"X": {"type": "integer"}}},
     {"a": "x", "b": 1}, {"a": 1, "b": 1}),
    # a const that looks like a ref is data: the answer writes it as given
    ({"type": "object", "properties": {"a": {"const": {"$ref": "#/$defs/X"}}, "b": {"$ref": "#/$defs/X"}},
      "required": ["a"], "$defs": {"X": {"type": "string"}}},
     {"a": {"$ref": "#/$defs/X"}}, {"a": {"$ref": "#/$defs/tool0.X"}}),
    # a property named like a data keyword is still a schema whose ref is renamed
    ({"type": "object", "properties": {"enum": {"$ref": "#/$defs/X"}}, "required": ["enum"],
      "$defs": {"X": {"type": "boolean"}}}, {"enum": True}, {"enum": "x"}),
])
def test_each_tools_definitions_keep_the_meaning_compile_schema_gives_them(parameters, good, bad):
    tools = parse_tools({"tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}]})
    for arguments, taken in ((good, True), (bad, False)):  # compact: a const is written so
        assert _accepts(tools, json.dumps({"tool_call": {"name": "f", "arguments": arguments}},
                                          separators=(",", ":"))) is taken, arguments


@pytest.mark.parametrize(("extra", "instance", "other"), [
    ({"json_schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}},  # llama-server's
     {"n": 3}, {"m": 3}),
    ({"response_format": {"type": "json_object"}}, {"any": [1, {"x": None}]}, [1]),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}}}}, {"ok": True}, {"ok": 1}),
])
def test_tools_beside_a_schema_name_the_field_that_gave_it(extra, instance, other):
    """Tools beside a response format are taken (OpenAI takes both; llama.cpp's generic format puts the schema in
    the ``response`` option): the answer is a call, or ``{"response": <an instance>}``, no longer text."""
    request = parse_chat_request({"messages": [{"role": "user", "content": "x"}], "tools": [PING], **extra})
    assert request.tools.structured
    assert _accepts(request.tools, json.dumps({"response": instance}))
    assert not _accepts(request.tools, json.dumps({"response": other}))
    assert not _accepts(request.tools, '{"response": "text"}')
    assert _accepts(request.tools, '{"tool_call": {"name": "ping", "arguments": {}}}')
