"""A model's tool call nested deeper than Python's JSON reads or writes (``DEPTH`` arrays in one another, which
a parameter the tool's schema leaves free admits) on the Ollama and Anthropic routes, whose answers carry a call's
arguments as an object: Ollama's ``function.arguments``, Anthropic's ``tool_use`` block's ``input``. Reading them
raised a RecursionError once the answer ended: a 500 with a traceback, or a stream ended by an internal error.

Anthropic's stream carries the input as its JSON text (``input_json_delta``), so it is the call, as the chat route's
is; a whole answer, and Ollama's either way, cannot hold it and end with an error that names the tool, how deep its
arguments go and what to do instead."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from edgesdk.serve import anthropic
from edgesdk.serve.api import ApiError
from edgesdk.serve.completion import Completion
from edgesdk.serve.http_server import json_bytes
from edgesdk.serve.ollama import _ollama_calls
from tests.unit.test_openai_client37 import runtime, server  # noqa: F401 (fixtures: a real server, a tiny bundle)
from tests.unit.test_tools import _accepts
from tests.unit.test_tools62 import CALL, DEEP, DEPTH, FREE, NEAR, _streamed

ARGUMENTS = '{"a": ' + DEEP + "}"
TOOL = {"name": "f", "input_schema": FREE["function"]["parameters"]}
ANTHROPIC = {"max_tokens": 50, "messages": [{"role": "user", "content": "nest"}], "tools": [TOOL],
             "tool_choice": {"type": "any"}}
OLLAMA = {"model": "tiny-host", "messages": [{"role": "user", "content": "nest"}], "tools": [FREE]}


def _too_deep(error: ApiError) -> None:
    assert (error.status, error.code) == (500, "tool_call_too_deep")
    assert "'f'" in error.message or '"f"' in error.message
    assert f"nested {DEPTH + 1} arrays or objects deep (deeper than this server's JSON reads and writes)" in \
        error.message
    assert "hundred" not in error.message
    assert "give each of the tool's parameters a type" in error.message


def _answered(read: Callable[[], object]) -> tuple[object, str | None]:
    """What ``read`` gives, or None and the code of the ApiError it raises."""
    try:
        return read(), None
    except ApiError as error:
        return None, error.code


def _ollama_body(calls: list[dict]) -> bytes:
    """The streamed object Ollama's answer gives its calls in, written as the server writes it."""
    return json_bytes({"model": "m", "message": {"role": "assistant", "content": "", "tool_calls": calls},
                       "done": False})


# ------------------------------------------------------------------------------------------------ Anthropic


def _tool_stream(text: str, finish_reason: str) -> tuple[list, str, anthropic.ToolStream]:
    stream = anthropic.ToolStream(think_opened=False)
    events = [event for index in range(0, len(text), 7) for event in stream.push(text[index:index + 7])]
    closing, reason = stream.close(finish_reason)
    return events + closing, reason, stream


def _input_json(events: list, index: int) -> str:
    return "".join(data["delta"]["partial_json"] for name, data in events
                   if name == "content_block_delta" and data["index"] == index
                   and data["delta"]["type"] == "input_json_delta")


def test_anthropic_a_deep_call_streams_as_its_input_json():
    events, reason, stream = _tool_stream(CALL, "stop")
    assert reason == "tool_calls"
    assert _input_json(events, 0) == ARGUMENTS
    assert [name for name, _ in events][-1] == "content_block_stop"
    for _, data in events:  # each event the server writes
        json_bytes(data)
    assert stream.blocks[0]["input"] == {}  # the whole answer's block cannot hold it


def test_anthropic_deep_and_shallow_calls_of_the_list_form_stream_each_as_its_input():
    text = '{"tool_calls": [{"name": "f", "arguments": ' + ARGUMENTS + '}, {"name": "f", "arguments": {"a": 1}}]}'
    events, reason, stream = _tool_stream(text, "stop")
    assert reason == "tool_calls"
    assert (_input_json(events, 0), _input_json(events, 1)) == (ARGUMENTS, '{"a": 1}')
    assert stream.blocks[1]["input"] == {"a": 1}


@pytest.mark.parametrize("cut", [0, 2])
def test_anthropic_a_whole_answer_of_a_deep_call_is_an_error_naming_it(cut):
    """A whole call (``cut`` 0) and one cut short by max_tokens, whose input is read as far as its JSON goes."""
    request = anthropic.parse_messages_request(ANTHROPIC)
    with pytest.raises(ApiError) as caught:
        anthropic.content_blocks(request, CALL[:len(CALL) - cut], "length" if cut else "stop", False)
    _too_deep(caught.value)
    assert '"stream": true' in caught.value.message


def test_anthropic_a_call_near_python_s_depth_limit_is_its_input_or_the_error():
    request = anthropic.parse_messages_request(ANTHROPIC)
    for depth in NEAR:
        text = '{"tool_call": {"name": "f", "arguments": {"a": ' + "[" * depth + "]" * depth + "}}}"
        answer, refused = _answered(lambda text=text: anthropic.content_blocks(request, text, "stop", False))
        assert refused in (None, "tool_call_too_deep")
        if answer is not None:
            json_bytes({"type": "message", "content": answer[0]})


# ------------------------------------------------------------------------------------------------ Ollama


def test_ollama_a_deep_call_is_an_error_naming_it():
    fields, finish = _streamed(CALL, "stop")[1:]
    assert finish == "tool_calls"
    with pytest.raises(ApiError) as caught:
        _ollama_calls(fields, finish)
    _too_deep(caught.value)
    assert "/v1/chat/completions" in caught.value.message
    cut = _streamed(CALL[:-2], "length")[1]  # cut short by num_predict: its arguments as far as they go
    with pytest.raises(ApiError) as caught:
        _ollama_calls(cut, "length")
    _too_deep(caught.value)


def test_ollama_a_call_near_python_s_depth_limit_is_its_object_or_the_error():
    for depth in NEAR:
        arguments = '{"a": ' + "[" * depth + "]" * depth + "}"
        fields = {"tool_calls": [{"id": "call_1", "function": {"name": "f", "arguments": arguments}}]}
        calls, refused = _answered(lambda fields=fields: _ollama_calls(fields, "tool_calls"))
        assert refused in (None, "tool_call_too_deep")
        if calls is not None:
            assert json.loads(_ollama_body(calls))["message"]["tool_calls"][0]["function"]["arguments"] == \
                json.loads(arguments)


# ------------------------------------------------------------------------------------------------ a real server


@pytest.fixture
def deep_answer(server, monkeypatch):  # noqa: F811
    """The server's model answers the deep call (which the tools' schema admits), as its generation gives text."""
    assert _accepts(anthropic.parse_messages_request(ANTHROPIC).tools, CALL)

    def complete(request, on_text=None, on_start=None, **_):
        if on_start is not None:
            on_start()
        for index in range(0, len(CALL), 500):
            if on_text is not None:
                on_text(CALL[index:index + 500], None)
        return Completion(CALL, "stop", prompt_tokens=5, completion_tokens=len(CALL))

    monkeypatch.setattr(server.completer, "complete", complete)
    return server


def test_a_server_s_anthropic_answer_of_a_deep_call(deep_answer):
    status, body = deep_answer.post("/v1/messages", ANTHROPIC)
    assert status == 500
    assert body["type"] == "error"
    assert f"nested {DEPTH + 1} arrays or objects deep" in body["error"]["message"]
    status, _, payload = deep_answer.request("POST", "/v1/messages", {**ANTHROPIC, "stream": True})
    assert status == 200
    events = [(block.split("\n")[0][len("event: "):], json.loads(block.split("\n")[1][len("data: "):]))
              for block in payload.decode().split("\n\n") if block]
    assert "error" not in [name for name, _ in events]
    assert _input_json(events, 0) == ARGUMENTS
    assert [data["delta"]["stop_reason"] for name, data in events if name == "message_delta"] == ["tool_use"]


def test_a_server_s_ollama_answer_of_a_deep_call(deep_answer):
    status, body = deep_answer.post("/api/chat", {**OLLAMA, "stream": False})
    assert status == 500
    assert f"nested {DEPTH + 1} arrays or objects deep" in body["error"]
    status, _, payload = deep_answer.request("POST", "/api/chat", OLLAMA)
    assert status == 200
    lines = [json.loads(line) for line in payload.decode().splitlines()]
    assert f"nested {DEPTH + 1} arrays or objects deep" in lines[-1]["error"]
    assert not any(line.get("message", {}).get("tool_calls") for line in lines[:-1])
