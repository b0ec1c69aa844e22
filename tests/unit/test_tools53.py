"""An earlier assistant turn's tool calls reach the prompt with their ``id``, after their arguments, and a tool result
names its tool under ``tool``, as llama.cpp's polyfills write them (minja's ``chat_template::apply``:
``polyfill_tool_calls``, ``polyfill_tool_responses``): a result's ``tool_call_id`` then names a call the model has
read. The ids stay the server's: the answer's schema holds none, and a call as the history shows it is, up to its id,
what the schema lets the model write, which then closes the call."""

from __future__ import annotations

import json

import pytest

from edgesdk.runtime.json_schema import SchemaConstraint
from edgesdk.serve.api import parse_chat_request
from edgesdk.serve.tools import call_text, parse_tools

BYTES = [bytes([b]) for b in range(256)]
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}}}}}
# two calls of one tool, answered in the other order: only the ids say which result answers which call
CALLS = [{"id": "call_a", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Oslo"}'}},
         {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Lima"}'}}]
CHAT = [{"role": "user", "content": "Time in Oslo and Lima?"},
        {"role": "assistant", "content": None, "tool_calls": CALLS},
        {"role": "tool", "tool_call_id": "call_b", "content": "03:00"},
        {"role": "tool", "tool_call_id": "call_a", "content": "09:00"}]


def _lines(prompt: str, key: str) -> list[dict]:
    """The JSON objects of the prompt's lines that start with ``{"KEY": ``."""
    start = json.dumps({key: 0})[:-2]
    return [json.loads(line[:line.rindex("}") + 1]) for line in prompt.split("\n") if line.startswith(start)]


def test_the_chat_route_s_prompt_shows_the_call_each_result_answers(served):
    status, body = served.post("/apply-template", {"messages": CHAT})
    assert status == 200, body
    calls = {call["tool_call"]["id"]: call["tool_call"] for call in _lines(body["prompt"], "tool_call")}
    assert calls == {"call_a": {"name": "get_time", "arguments": {"city": "Oslo"}, "id": "call_a"},
                     "call_b": {"name": "get_time", "arguments": {"city": "Lima"}, "id": "call_b"}}
    results = [line["tool_response"] for line in _lines(body["prompt"], "tool_response")]
    assert results == [{"tool": "get_time", "content": "03:00", "tool_call_id": "call_b"},
                       {"tool": "get_time", "content": "09:00", "tool_call_id": "call_a"}]
    assert calls[results[0]["tool_call_id"]]["arguments"] == {"city": "Lima"}  # 03:00 is Lima's time


def test_parallel_calls_carry_their_ids_in_the_list_form(served):
    status, body = served.post("/apply-template", {"messages": CHAT, "tools": [CLOCK], "parallel_tool_calls": True})
    assert status == 200, body
    (listed,) = _lines(body["prompt"], "tool_calls")
    assert [(call["arguments"]["city"], call["id"]) for call in listed["tool_calls"]] == [("Oslo", "call_a"),
                                                                                          ("Lima", "call_b")]


def test_a_result_of_no_known_tool_names_none():
    """minja writes ``tool`` only where the message names its tool; ``"name": null`` was written here."""
    request = parse_chat_request({"messages": [CHAT[0], {"role": "tool", "tool_call_id": "call_z", "content": "1"}]})
    assert json.loads(request.messages[1]["content"]) == {"tool_response": {"content": "1", "tool_call_id": "call_z"}}


def test_a_call_without_a_string_id_is_written_without_one():
    for call in ({"function": {"name": "get_time", "arguments": "{}"}}, {**CALLS[0], "id": None}):
        assert json.loads(call_text([call], "messages[1].tool_calls"))["tool_call"].keys() == {"name", "arguments"}


@pytest.mark.parametrize("parallel", [False, True])
def test_the_answer_s_constraint_takes_an_earlier_call_up_to_its_id_and_closes_it(parallel):
    """The model that writes a call as its history shows it is held to it up to the id, then made to close the
    call: the id is the server's (each answer's call gets a new one), never the model's."""
    tools = parse_tools({"tools": [CLOCK], "parallel_tool_calls": parallel})
    text = call_text(CALLS[:1], "messages[1].tool_calls", parallel)
    head, tail = text.split(', "id": ')
    assert json.loads(tail.rstrip("}]")) == "call_a"  # the id is the call's last key
    constraint = SchemaConstraint(BYTES, tools.schema)
    for byte in head.encode():
        assert constraint.allows(byte), head
        constraint.advance(byte)
    assert not constraint.allows(ord(","))  # no key after the arguments
    for byte in ("}]}" if parallel else "}}").encode():
        assert constraint.allows(byte)
        constraint.advance(byte)
    assert constraint.complete
