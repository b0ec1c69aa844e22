"""A thinking model's block before its call under tools, on the Anthropic Messages route (a ``thinking`` block before
the ``tool_use`` block) and the Responses route (a ``reasoning`` item before the ``function_call`` item), whole and
streamed, as each route gives the reasoning of an answer without tools."""

from __future__ import annotations

import json

import pytest

from edgesdk.serve import anthropic
from edgesdk.serve.completion import Completion
from edgesdk.serve.reasoning import CLOSE
from edgesdk.serve.response_events import Output
from edgesdk.serve.responses import parse_responses_request
from tests.unit.test_serve_reasoning import ASK, no_whitespace
from tests.unit.test_serve_think54 import SHORT_TOOL, THOUGHT_ANSWERS, served, thinking_runtime  # noqa: F401

THOUGHT = "The user wants Paris's weather."
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
SIZES = (1, 3, 7, len(THOUGHT_ANSWERS[0]))


def _message_request():
    return anthropic.parse_messages_request({"model": "m", "max_tokens": 64, "messages": ASK,
                                             "tools": [{"name": "get_weather", "input_schema": SCHEMA}]})


def _without_ids(blocks: list[dict]) -> list[dict]:
    return [{key: value for key, value in block.items() if key != "id"} for block in blocks]


@pytest.mark.parametrize("answer", THOUGHT_ANSWERS)
def test_anthropic_gives_the_block_before_a_call_as_a_thinking_block(answer):
    """The block was dropped: the message held the tool_use block alone, and its stream no thinking events."""
    request, completion = _message_request(), Completion(answer, "stop", 10, 20, 0, None)
    whole = anthropic.message_body(request, "msg_1", "m", completion)
    assert whole["stop_reason"] == "tool_use"
    assert _without_ids(whole["content"]) == [{"type": "thinking", "thinking": THOUGHT, "signature": ""},
                                              {"type": "tool_use", "name": "get_weather", "input": {"city": "Paris"}}]
    for size in SIZES:
        stream, events = anthropic.ToolStream(), []
        for start in range(0, len(answer), size):
            events += stream.push(answer[start:start + size])
        closing, finish = stream.close("stop")
        events += closing
        assert finish == "tool_calls"
        assert _without_ids(stream.blocks) == _without_ids(whole["content"]), size
        starts = [(data["index"], data["content_block"]["type"]) for name, data in events
                  if name == "content_block_start"]
        assert starts == [(0, "thinking"), (1, "tool_use")], size
        thinking = [data["delta"] for name, data in events if name == "content_block_delta" and data["index"] == 0]
        assert "".join(d["thinking"] for d in thinking if d["type"] == "thinking_delta") == THOUGHT, size
        # the thinking block ends as Anthropic's does: its signature_delta, then its stop, before the call's start
        shapes = [(name, data.get("index"), data.get("delta", {}).get("type")) for name, data in events]
        at = shapes.index(("content_block_delta", 0, "signature_delta"))
        assert shapes[at + 1:at + 3] == [("content_block_stop", 0, None), ("content_block_start", 1, None)], size
        assert thinking[-1] == {"type": "signature_delta", "signature": ""}, size
        assert shapes[-1] == ("content_block_stop", 1, None), size


def test_anthropic_an_answer_cut_while_thinking_under_tools_is_its_thinking_block_alone():
    """Cut by max_tokens in the block: the thinking so far, no empty text block after it (as without tools)."""
    request = _message_request()
    completion = Completion("The user wants", "length", 10, 64, 0, None)
    whole = anthropic.message_body(request, "msg_1", "m", completion)
    assert whole["content"] == [{"type": "thinking", "thinking": "The user wants", "signature": ""}]
    assert whole["stop_reason"] == "max_tokens"


def _responses_asked():
    tool = {"type": "function", "name": "get_weather", "parameters": SCHEMA}
    return parse_responses_request({"model": "m", "input": "Paris?", "tools": [tool]})


def _shown(items: list[dict]) -> list[dict]:
    return [{key: value for key, value in item.items() if key not in ("id", "call_id")} for item in items]


@pytest.mark.parametrize("answer", THOUGHT_ANSWERS)
def test_responses_gives_the_block_before_a_call_as_a_reasoning_item(answer):
    """The block was dropped: the output held the function_call alone, with no reasoning tokens counted."""
    completion = Completion(answer, "stop", 10, 1000, 0, None)
    whole = Output(_responses_asked(), "m", 0.0, 1.0, count_tokens=len).whole(completion)
    assert _shown(whole["output"]) == [
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": THOUGHT}],
         "status": "completed"},
        {"type": "function_call", "status": "completed", "name": "get_weather", "arguments": '{"city": "Paris"}'}]
    # the reasoning's tokens: the answer's text up to </think> (count_tokens=len counts its characters), not the call's
    thought = answer[:answer.index(CLOSE) + len(CLOSE)]
    assert whole["usage"]["output_tokens_details"]["reasoning_tokens"] == len(thought)
    for size in SIZES:
        output = Output(_responses_asked(), "m", 0.0, 1.0, count_tokens=len)
        events = output.start()
        for start in range(0, len(answer), size):
            events += output.push(answer[start:start + size])
        events += output.end(completion)
        final = events[-1][1]["response"]
        assert _shown(final["output"]) == _shown(whole["output"]), size
        assert final["usage"] == whole["usage"], size
        thought_deltas = [data for name, data in events if name == "response.reasoning_text.delta"]
        assert {data["output_index"] for data in thought_deltas} == {0}, size
        assert "".join(data["delta"] for data in thought_deltas) == THOUGHT, size
        added = [(data["output_index"], data["item"]["type"]) for name, data in events
                 if name == "response.output_item.added"]
        assert added == [(0, "reasoning"), (1, "function_call")], size
        names = [name for name, _ in events]
        assert names.index("response.reasoning_text.done") < names.index("response.function_call_arguments.delta")


def test_responses_route_returns_a_thinking_model_s_block_under_tools(served, thinking_runtime):  # noqa: F811
    """End to end: the tiny thinking model, its whitespace banned, thinks for its 6 tokens under a tool; the
    response (whole and streamed) is its reasoning item, as the chat route gives its reasoning_content."""
    bias = no_whitespace(thinking_runtime)
    tool = {"type": "function", "name": SHORT_TOOL[0]["function"]["name"],
            "parameters": SHORT_TOOL[0]["function"]["parameters"]}
    chat = {"messages": ASK, "tools": SHORT_TOOL, "logit_bias": bias}
    status, body = served.post("/v1/chat/completions", chat)
    assert status == 200, body
    thought = body["choices"][0]["message"].get("reasoning_content")
    assert thought, body
    request = {"model": "m", "input": ASK, "tools": [tool], "logit_bias": bias, "store": False}
    status, whole = served.post("/v1/responses", request)
    assert status == 200, whole
    assert [item["type"] for item in whole["output"]] == ["reasoning"], whole
    assert whole["output"][0]["content"] == [{"type": "reasoning_text", "text": thought}]
    assert whole["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
    _, _, payload = served.request("POST", "/v1/responses", {**request, "stream": True})
    events = [json.loads(block.split("\n", 1)[1].removeprefix("data: "))
              for block in payload.decode().split("\n\n") if block]
    assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta") == thought
    assert [item["type"] for item in events[-1]["response"]["output"]] == ["reasoning"]
