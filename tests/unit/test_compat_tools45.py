"""Several tool calls in one answer on the Anthropic and Ollama routes, on a real server over a tiny bundle.

* Anthropic's Messages API: with ``tool_choice.disable_parallel_tool_use`` false the chat request the route builds
  asks for the list form (the chat route's ``parallel_tool_calls``, edgesdk/serve/tools.py); true or absent, one call,
  as llama-server's Messages route answers (edgesdk/serve/anthropic.py ``_parallel`` says why). Each call is its own
  ``tool_use`` block with its own id and input, whole and streamed (its own ``content_block_start`` /
  ``input_json_delta`` / ``content_block_stop`` under its own index), and an assistant turn of several ``tool_use``
  blocks reads back as the one list the model answers in.
* Ollama's /api/chat: one call, numbered by ``function.index`` (tools/tools.go, ``Parser.Add``), given out in the
  streamed object where it is whole, as Ollama's ChatHandler gives a call out where its parser finds it
  (server/routes.go); an assistant turn of several calls reads back a line each, in the one-call form.

The tiny model answers greedily with the same call over and over; sampled (temperature 1, top_k 40) it closes the
list after a few calls, so the tests look over a few tries for an answer of several calls. Ollama's /api/chat has
no tool_choice, and the tiny model prefers the text answer; at temperature 2 some seeds call.
"""

from __future__ import annotations

import json

import pytest

from edgesdk.serve import anthropic
from edgesdk.serve.api import ApiError
from edgesdk.serve.ollama import parse_chat
from tests.unit.test_openai_client37 import runtime, server  # noqa: F401 (fixtures: 2,048 tokens of context)
from tests.unit.test_serve_reasoning import _message_events as _events

TRIES = range(24)
TICK = {"name": "tick", "description": "A clock's tick", "input_schema": {"type": "object", "properties": {}}}
PING = {"name": "ping", "input_schema": {"type": "object", "properties": {}}}
USER = [{"role": "user", "content": "What time is it in Oslo?"}]
SEVERAL = {"type": "any", "disable_parallel_tool_use": False}


def _anthropic(**fields) -> dict:
    return {"max_tokens": 600, "messages": USER, "tools": [TICK, PING], "temperature": 1.0, "top_k": 40, **fields}


# ------------------------------------------------------------------------------------------------ Anthropic


@pytest.mark.parametrize("kind", [{"type": "auto"}, {"type": "any"}, {"type": "tool", "name": "tick"}, None])
def test_anthropic_parallel_tool_use_is_on_where_not_disabled_is_said(kind):
    choice = {} if kind is None else {"tool_choice": kind}
    assert not anthropic.parse_messages_request(_anthropic(**choice)).tools.parallel
    if kind is not None:
        one = anthropic.parse_messages_request(_anthropic(tool_choice={**kind, "disable_parallel_tool_use": True}))
        assert not one.tools.parallel
        assert '{"tool_call": ' in one.messages[0]["content"]  # the instructions ask for one call
        several = anthropic.parse_messages_request(_anthropic(tool_choice={**kind, "disable_parallel_tool_use": False}))
        assert several.tools.parallel
        assert '{"tool_calls": [' in several.messages[0]["content"]


def test_anthropic_disable_parallel_tool_use_must_be_a_boolean():
    with pytest.raises(ApiError) as refused:
        anthropic.parse_messages_request(_anthropic(tool_choice={"type": "any", "disable_parallel_tool_use": "yes"}))
    assert (refused.value.status, refused.value.param) == (400, "tool_choice.disable_parallel_tool_use")
    assert 'got "yes"' in refused.value.message


def test_anthropic_several_calls_are_each_their_own_tool_use_block_with_its_own_input():
    request = anthropic.parse_messages_request(_anthropic(tool_choice=SEVERAL))
    text = '{"tool_calls": [{"name": "ping", "arguments": {"n": 1}}, {"name": "tick", "arguments": {"n": [2]}}]}'
    blocks, finish = anthropic.content_blocks(request, text, "stop")
    assert finish == "tool_calls"
    assert [(block["type"], block["name"], block["input"]) for block in blocks] == \
        [("tool_use", "ping", {"n": 1}), ("tool_use", "tick", {"n": [2]})]
    assert len({block["id"] for block in blocks}) == 2
    # cut by max_tokens inside the second call: the first whole, the second as far as its JSON goes
    blocks, finish = anthropic.content_blocks(request, text[:-4], "length")
    assert finish == "length"
    assert [(block["name"], block["input"]) for block in blocks] == [("ping", {"n": 1}), ("tick", {"n": [2]})]
    blocks, _ = anthropic.content_blocks(request, text[:-12], "length")
    assert [(block["name"], block["input"]) for block in blocks] == [("ping", {"n": 1}), ("tick", {})]


def test_anthropic_a_turn_of_several_tool_uses_reads_back_as_one_list_of_calls():
    uses = [{"type": "tool_use", "id": "toolu_a", "name": "tick", "input": {}},
            {"type": "tool_use", "id": "toolu_b", "name": "ping", "input": {"host": "x"}}]
    results = [{"type": "tool_result", "tool_use_id": "toolu_a", "content": "12:00"},
               {"type": "tool_result", "tool_use_id": "toolu_b", "content": [{"type": "text", "text": "pong"}]}]
    messages = [*USER, {"role": "assistant", "content": uses}, {"role": "user", "content": results}]
    request = anthropic.parse_messages_request(_anthropic(messages=messages, tool_choice={
        "type": "auto", "disable_parallel_tool_use": False}))
    (turn,) = [message for message in request.messages if message["role"] == "assistant"]
    assert json.loads(turn["content"]) == {"tool_calls": [{"name": "tick", "arguments": {}, "id": "toolu_a"},
                                                          {"name": "ping", "arguments": {"host": "x"}, "id": "toolu_b"}]}
    answered = [json.loads(message["content"]) for message in request.messages[2:]]
    assert answered[1:] == [{"tool_response": {"tool": "tick", "content": "12:00", "tool_call_id": "toolu_a"}},
                            {"tool_response": {"tool": "ping", "content": "pong", "tool_call_id": "toolu_b"}}]
    # disable_parallel_tool_use: the calls as the one-call form the answer then takes, a line each
    one = anthropic.parse_messages_request(_anthropic(messages=messages, tool_choice={
        "type": "auto", "disable_parallel_tool_use": True}))
    (turn,) = [message for message in one.messages if message["role"] == "assistant"]
    assert [json.loads(line) for line in turn["content"].split("\n")] == [
        {"tool_call": {"name": "tick", "arguments": {}, "id": "toolu_a"}},
        {"tool_call": {"name": "ping", "arguments": {"host": "x"}, "id": "toolu_b"}}]


def test_anthropic_an_answer_of_several_calls_whole(server):  # noqa: F811
    for _ in TRIES:
        status, message = server.post("/v1/messages", _anthropic(tool_choice=SEVERAL))
        assert status == 200, message
        if message["stop_reason"] == "tool_use" and len(message["content"]) > 1:
            break
    else:
        pytest.fail(f"no try of {len(TRIES)} gave an answer of several tool_use blocks")
    blocks = message["content"]
    assert all(block["type"] == "tool_use" and block["name"] in ("tick", "ping") for block in blocks)
    assert all(block["input"] == {} and block["id"].startswith("toolu_") for block in blocks)
    assert len({block["id"] for block in blocks}) == len(blocks)


def test_anthropic_an_answer_of_several_calls_streams_each_as_its_own_block(server):  # noqa: F811
    for _ in TRIES:
        events = _events(server, _anthropic(tool_choice=SEVERAL))
        started = [data for name, data in events if name == "content_block_start"]
        if events[-2][1]["delta"]["stop_reason"] == "tool_use" and len(started) > 1:
            break
    else:
        pytest.fail(f"no try of {len(TRIES)} streamed several tool_use blocks")
    assert [data["index"] for data in started] == list(range(len(started)))
    assert all(data["content_block"]["type"] == "tool_use" and data["content_block"]["input"] == {}
               for data in started)
    assert len({data["content_block"]["id"] for data in started}) == len(started)
    # each block opens, takes its input's pieces under its own index, and closes before the next opens
    order = [(name, data["index"]) for name, data in events if name.startswith("content_block")]
    opened = None
    for name, index in order:
        if name == "content_block_start":
            assert opened is None
            opened = index
        elif name == "content_block_delta":
            assert index == opened
        else:
            assert index == opened
            opened = None
    assert opened is None
    for block in started:
        pieces = [data["delta"]["partial_json"] for name, data in events
                  if name == "content_block_delta" and data["index"] == block["index"]]
        assert all(data["delta"]["type"] == "input_json_delta" for name, data in events
                   if name == "content_block_delta")
        assert json.loads("".join(pieces)) == {}


def test_anthropic_disable_parallel_tool_use_gives_one_block(server):  # noqa: F811
    for _ in range(6):
        status, message = server.post("/v1/messages", _anthropic(tool_choice={
            "type": "any", "disable_parallel_tool_use": True}))
        assert status == 200, message
        assert len(message["content"]) == 1
        assert message["content"][0]["type"] == "tool_use"


# ------------------------------------------------------------------------------------------------ Ollama

OLLAMA_TOOLS = [{"type": "function", "function": {"name": tool["name"], "parameters": tool["input_schema"]}}
                for tool in (TICK, PING)]


def _ollama(seed: int, **fields) -> dict:
    return {"model": "tiny-host", "messages": USER, "tools": OLLAMA_TOOLS, "stream": False,
            "options": {"temperature": 2.0, "seed": seed, "num_predict": 600}, **fields}


@pytest.fixture(scope="module")
def ollama_call(server):  # noqa: F811
    """(the request body, its whole answer) of a seed whose answer makes a call."""
    for seed in TRIES:
        body = _ollama(seed)
        status, whole = server.post("/api/chat", body)
        assert status == 200, whole
        if whole["message"].get("tool_calls") and whole["done_reason"] == "stop":
            return body, whole
    pytest.fail(f"no seed of {list(TRIES)} gave an answer with a call on /api/chat")


def test_ollama_an_answer_makes_one_call(ollama_call):
    _, whole = ollama_call
    (call,) = whole["message"]["tool_calls"]
    assert whole["message"]["content"] == ""
    assert call["function"]["index"] == 0
    assert call["function"]["name"] in ("tick", "ping")
    assert call["function"]["arguments"] == {}


def test_ollama_streams_the_call_once_whole_in_its_own_object(server, ollama_call):  # noqa: F811
    body, whole = ollama_call
    status, headers, payload = server.request("POST", "/api/chat", {**body, "stream": True})
    assert status == 200, payload
    lines = [json.loads(line) for line in payload.decode().splitlines()]
    assert lines[-1]["done"]
    assert not lines[-1]["message"].get("tool_calls")
    carrying = [line for line in lines if line["message"].get("tool_calls")]
    # as Ollama's ChatHandler gives out a call in the object where its parser finds it, before the last one
    assert len(carrying) == 1
    assert not carrying[0]["done"]
    assert [{**call, "id": None} for call in carrying[0]["message"]["tool_calls"]] == \
        [{**call, "id": None} for call in whole["message"]["tool_calls"]]


def test_ollama_earlier_turns_of_several_calls_read_back_a_line_each():
    calls = [{"function": {"name": "tick", "arguments": {}}}, {"function": {"name": "ping", "arguments": {"h": 1}}}]
    messages = [*USER, {"role": "assistant", "content": "", "tool_calls": calls},
                {"role": "tool", "tool_name": "tick", "content": "12:00"},
                {"role": "tool", "tool_name": "ping", "content": "pong"}]
    asked = parse_chat(_ollama(0, messages=messages), "tiny-host")
    (turn,) = [message for message in asked.request.messages if message["role"] == "assistant"]
    assert [json.loads(line) for line in turn["content"].split("\n")] == [
        {"tool_call": {"name": "tick", "arguments": {}, "id": "call_1_0"}},
        {"tool_call": {"name": "ping", "arguments": {"h": 1}, "id": "call_1_1"}}]
    results = [json.loads(message["content"]) for message in asked.request.messages[-2:]]
    # each with the id the server gave the call it answers (the client sent none)
    assert results == [{"tool_response": {"tool": "tick", "content": "12:00", "tool_call_id": "call_1_0"}},
                       {"tool_response": {"tool": "ping", "content": "pong", "tool_call_id": "call_1_1"}}]
