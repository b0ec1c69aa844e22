"""A streamed answer under tools on /v1/chat/completions, chunk by chunk as llama-server writes it
(tools/server/server-task.cpp), and through the openai package's stream helper, which must build the message the
whole (not streamed) answer gives."""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")

from tests.unit.test_openai_client37 import (  # noqa: E402,F401 (fixtures: a tiny bundle served, the client)
    PING,
    TIME,
    USER,
    client,
    no_whitespace,
    runtime,
    server,
)


def _without_ids(message: dict) -> dict:
    """A message with its tool calls' ids (a fresh one per answer) and the stream helper's own additions (each
    call's ``index``, its parsed arguments) taken out."""
    calls = [{"type": call["type"], "name": call["function"]["name"], "arguments": call["function"]["arguments"]}
             for call in message.get("tool_calls") or []]
    return {**message, "tool_calls": calls}


def test_a_streamed_tool_call_s_chunks_are_llama_server_s(server, no_whitespace):  # noqa: F811 (the fixtures)
    body = {"messages": USER, "tools": [TIME, PING], "tool_choice": "required", "logit_bias": no_whitespace,
            "stream_options": {"include_usage": True}}
    status, whole = server.post("/v1/chat/completions", body)
    assert status == 200, whole
    (call,) = whole["choices"][0]["message"]["tool_calls"]

    events = server.stream("/v1/chat/completions", body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len({chunk["id"] for chunk in chunks}) == 1
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks[:-1]]
    # the first delta: the role, and content null (llama-server's {"role": "assistant", "content": null})
    assert deltas[0] == {"role": "assistant", "content": None}
    assert not any("role" in delta for delta in deltas[1:])
    calls = [piece for delta in deltas for piece in delta.get("tool_calls", [])]
    assert [piece["index"] for piece in calls] == [0] * len(calls)
    # id, type and name in the call's first delta only; the arguments, joined, are the whole answer's
    assert (calls[0]["id"], calls[0]["type"], calls[0]["function"]["name"]) == (
        calls[0]["id"], "function", call["function"]["name"])
    assert calls[0]["id"].startswith("call_")
    assert not any({"id", "type"} & set(piece) or "name" in piece["function"] for piece in calls[1:])
    assert "".join(piece["function"]["arguments"] for piece in calls) == call["function"]["arguments"]
    assert not any(delta.get("content") for delta in deltas)
    finish = chunks[-2]["choices"][0]
    assert (finish["delta"], finish["finish_reason"]) == ({}, "tool_calls")
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks[:-2]] == [None] * (len(chunks) - 2)
    usage = chunks[-1]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]
    assert usage["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"]
    assert all(chunk["usage"] is None for chunk in chunks[:-1])


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_the_client_s_stream_helper_builds_the_whole_answer_s_message(client, no_whitespace, choice):  # noqa: F811
    asked = dict(model="tiny", messages=USER, tools=[TIME, PING], tool_choice=choice, logit_bias=no_whitespace)
    whole = client.chat.completions.create(**asked).choices[0]
    with client.chat.completions.stream(**asked, stream_options={"include_usage": True}) as stream:
        final = stream.get_final_completion()
    streamed = final.choices[0]
    assert streamed.finish_reason == whole.finish_reason
    expected = _without_ids(whole.message.model_dump(exclude={"parsed"}))
    assert _without_ids(streamed.message.model_dump(exclude={"parsed"})) == expected
    if whole.finish_reason == "tool_calls":
        assert streamed.message.content is None  # not "", which the first delta's content "" accumulated to
        assert json.loads(streamed.message.tool_calls[0].function.arguments) == \
            json.loads(whole.message.tool_calls[0].function.arguments)
    assert final.usage is not None
