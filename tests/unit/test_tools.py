"""Tool calls in llama.cpp's generic form (edgesdk/serve/tools.py): parsing, the answer's schema, earlier turns,
and calls through the server on a tiny bundle."""

from __future__ import annotations

import json

import pytest

from edgesdk.runtime.json_schema import SchemaConstraint
from edgesdk.serve.tools import (
    ToolError,
    call_text,
    parse_tools,
    read_answer,
    tool_result_text,
    with_instructions,
)
from tests._utils.chat_stream import accumulated_message

BYTES = [bytes([b]) for b in range(256)]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                   "unit": {"$ref": "#/$defs/unit"}},
                   "required": ["city"], "$defs": {"unit": {"enum": ["celsius", "fahrenheit"]}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"$ref": "#/$defs/unit"}}, "required": ["zone"],
    "$defs": {"unit": {"enum": ["utc", "local"]}}}}}  # the same $defs name as WEATHER's, another meaning
PING = {"type": "function", "function": {"name": "ping"}}


def _accepts(tools, text: str) -> bool:
    constraint = SchemaConstraint(BYTES, tools.schema)
    for byte in text.encode():
        if not constraint.allows(byte):
            return False
        constraint.advance(byte)
    return constraint.complete


def test_auto_offers_calls_of_every_tool_or_a_text_answer():
    tools = parse_tools({"tools": [WEATHER, TIME, PING]})
    assert (tools.names, tools.choice) == (("get_weather", "get_time", "ping"), "auto")
    assert _accepts(tools, '{"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}}')
    assert _accepts(tools, '{"tool_call": {"name": "get_time", "arguments": {"zone": "utc"}}}')
    assert _accepts(tools, '{"tool_call": {"name": "ping", "arguments": {}}}')
    assert _accepts(tools, '{"response": "Hello!"}')
    # each tool's $defs stay its own: WEATHER's unit is not TIME's
    assert not _accepts(tools, '{"tool_call": {"name": "get_time", "arguments": {"zone": "celsius"}}}')
    assert not _accepts(tools, '{"tool_call": {"name": "get_weather", "arguments": {"unit": "celsius"}}}')
    assert not _accepts(tools, '{"tool_call": {"name": "nope", "arguments": {}}}')
    assert "get_weather" in tools.instructions
    assert '{"response"' in tools.instructions


def test_required_and_named_choices_leave_only_calls():
    required = parse_tools({"tools": [WEATHER, PING], "tool_choice": "required"})
    assert not _accepts(required, '{"response": "Hello!"}')
    assert _accepts(required, '{"tool_call": {"name": "ping", "arguments": {}}}')
    named = parse_tools({"tools": [WEATHER, PING], "tool_choice": {"type": "function", "function": {"name": "ping"}}})
    assert named.choice == "ping"
    assert _accepts(named, '{"tool_call": {"name": "ping", "arguments": {}}}')
    assert not _accepts(named, '{"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}')
    assert "get_weather" not in named.instructions
    assert parse_tools({"tools": [WEATHER], "tool_choice": "none"}) is None
    for empty in ({}, None):  # what clients send for a function without arguments, as absent parameters
        bare = parse_tools({"tools": [{"type": "function", "function": {"name": "ping", "parameters": empty,
                                                                          "description": None}}]})
        assert _accepts(bare, '{"tool_call": {"name": "ping", "arguments": {}}}')
    assert parse_tools({"tool_choice": "auto"}) is None


@pytest.mark.parametrize(("body", "param", "message"), [
    ({"tools": {"type": "function"}}, "tools", "must be an array"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]", "calls functions only"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name", "1-128 letters"),
    ({"tools": [PING, PING]}, "tools", r"\['ping'\] more than once"),
    # a keyword that only narrows the arguments ("not", ...) is dropped for the constraint (test_toolschema48.py);
    # OpenAPI 3.0's boolean nullable is read as null's type (test_toolschema48.py); one that is no boolean is
    # malformed, and refused by name
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "nullable": "yes"}}}}}]},
     "tools[0].function.parameters", "keyword 'nullable'"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "tools[0].function.parameters", "must describe an object"),
    ({"tools": [PING], "tool_choice": {"type": "function", "function": {"name": "pong"}}}, "tool_choice",
     "does not offer"),
    ({"tools": [PING], "tool_choice": "always"}, "tool_choice", "must be"),
    ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
])
def test_bad_tools_are_refused_naming_the_field(body, param, message):
    with pytest.raises(ToolError, match=message) as refused:
        parse_tools(body)
    assert refused.value.param == param


def test_earlier_turns_and_instructions_render_as_text():
    tools = parse_tools({"tools": [WEATHER]})
    messages = with_instructions([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], tools)
    assert messages[0]["content"].startswith("Be brief.\n\nYou can call these tools")
    assert with_instructions([{"role": "user", "content": "hi"}], tools)[0] == {"role": "system",
                                                                                "content": tools.instructions}
    text = call_text([{"id": "call_1", "type": "function",
                       "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}], "messages[1].tool_calls")
    assert json.loads(text) == {"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "call_1"}}
    # what the model is shown is what it may write, but for the call's id after its arguments (the server's)
    assert _accepts(tools, text.replace(', "id": "call_1"', ""))
    assert json.loads(tool_result_text("get_weather", "12 C")) == {"tool_response": {"tool": "get_weather",
                                                                                     "content": "12 C"}}
    # arguments that are not JSON text are the model's string as written (llama-server's minja keeps them so)
    assert json.loads(call_text([{"function": {"name": "f", "arguments": "{oops"}}], "messages[1].tool_calls")) == {
        "tool_call": {"name": "f", "arguments": "{oops"}}


def test_answers_become_content_or_tool_calls():
    content, calls = read_answer('{"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}', True)
    assert content is None
    assert calls[0]["type"] == "function"
    assert calls[0]["id"].startswith("call_")
    assert calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert read_answer('{"response": "Hi"}', True) == ("Hi", None)
    assert read_answer('{"tool_call": {"na', False) == ('{"tool_call": {"na', None)  # cut by max_tokens


# ------------------------------------------------------------------------------------- through the server

# Finite calls: {"tool_call":{"name":"set_light","arguments":{"on":false}}} is 58 bytes with 17 gaps of at most 21
# whitespace bytes, so a random model's answer closes within 415 tokens (each at least one byte).
LIGHT = {"type": "function", "function": {"name": "set_light", "description": "Switch the lamp",
                                          "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}},
                                                         "required": ["on"]}}}
ROOM = 420


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A tiny model with room for the tools' description in its prompt (2,048 tokens of context)."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.runtime.session import open_runtime
    from edgesdk.serve.completion import ServeDefaults
    from tests._utils.tiny import save_tiny_model_dir
    from tests.unit.test_serve import Served

    root = tmp_path_factory.mktemp("tools")
    model = save_tiny_model_dir(root / "model", hidden=64, heads=4, kv_heads=2, max_positions=2048)
    bundle = build(BuildConfig(target="host", model=str(model), out=root / "b", export=ExportConfig(max_context=2048),
                               progress=False))
    served = Served(open_runtime(bundle.path, threads=1), ServeDefaults(max_tokens=ROOM))
    yield served
    served.close()


def test_a_required_call_comes_back_as_tool_calls(server):
    body = {"messages": [{"role": "user", "content": "Turn the lamp on"}], "tools": [PING, LIGHT],
            "tool_choice": "required"}
    status, answer = server.post("/v1/chat/completions", body)
    assert status == 200, answer
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function"
    assert call["function"]["name"] in ("ping", "set_light")
    arguments = json.loads(call["function"]["arguments"])
    assert arguments == {} if call["function"]["name"] == "ping" else set(arguments) == {"on"}

    events = server.stream("/v1/chat/completions", body)
    deltas = [event["choices"][0] for event in events[:-1]]
    assert deltas[0]["delta"] == {"role": "assistant", "content": None}  # llama-server: null before a call
    assert deltas[1]["delta"]["tool_calls"][0]["index"] == 0
    (streamed,) = accumulated_message([choice["delta"] for choice in deltas])["tool_calls"]  # arguments in pieces
    assert streamed["function"] == call["function"]  # greedy: the same call
    assert deltas[-1]["finish_reason"] == "tool_calls"


def test_a_named_function_is_the_one_called(server):
    status, answer = server.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Lamp off"}], "tools": [PING, LIGHT],
        "tool_choice": {"type": "function", "function": {"name": "set_light"}}})
    assert status == 200, answer
    assert answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "set_light"


def test_auto_answers_with_text_or_a_call(server):
    status, answer = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                          "tools": [PING], "temperature": 1.0, "seed": 3})
    assert status == 200, answer
    choice = answer["choices"][0]
    if choice["finish_reason"] == "tool_calls":
        assert choice["message"]["tool_calls"][0]["function"]["name"] == "ping"
    elif choice["finish_reason"] == "stop":
        assert isinstance(choice["message"]["content"], str)  # the {"response": ...} text, unwrapped
    else:  # cut by max_tokens: the JSON written so far, as text
        assert choice["message"]["content"].lstrip().startswith("{")


def test_a_conversation_with_earlier_calls_and_their_results(server):
    from edgesdk.serve.api import parse_chat_request

    messages = [{"role": "user", "content": "Lamp on"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_7", "type": "function", "function": {"name": "set_light", "arguments": '{"on": true}'}}]},
                {"role": "tool", "tool_call_id": "call_7", "content": "done"}]
    request = parse_chat_request({"messages": messages, "tools": [LIGHT]})
    assert request.messages[0]["role"] == "system"
    assert json.loads(request.messages[2]["content"]) == {"tool_call": {"name": "set_light", "arguments": {"on": True},
                                                                        "id": "call_7"}}
    assert request.messages[3] == {"role": "user", "content": tool_result_text("set_light", "done", "call_7")}
    status, answer = server.post("/v1/chat/completions", {"messages": messages, "tools": [LIGHT], "max_tokens": 4})
    assert status == 200, answer


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"prompt": "x", "tools": [PING]}, "tools"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "function_call": "auto"},
     "function_call"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [PING],
                              "grammar": 'root ::= "x"'}, "grammar"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "tool_calls": []}, ], "tools": [PING],
                              "tool_choice": "sometimes"}, "tool_choice"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "tool_calls": [{"id": "a"}]}]},
     "messages[0].tool_calls"),
    # a call's arguments that are not JSON text are kept as their string (test_tools51.py)
])
def test_tool_requests_the_server_cannot_honour_are_refused(server, path, body, param):
    status, answer = server.post(path, body)
    assert (status, answer["error"]["param"]) == (400, param), answer
