"""The routes' readers of an answer under tools take the server's word on whether the answer is its ``<think>``
block from its first character (a template that opens the block in the prompt): JSON inside the block, which the
constraint left free, is reasoning there, never the call (the OpenAI chat body and Anthropic's content blocks)."""

from __future__ import annotations

from edgesdk.serve import anthropic
from edgesdk.serve.api import completion_body, parse_chat_request
from tests.unit.test_serve_think54 import CALL, TOOLS

# what a model thinking in a block the prompt opened may write: JSON of a tool never offered, then its call
ANSWER = '{"tool_call": {"name": "rm_rf", "arguments": {"path": "/"}}}\n</think>\n\n' + CALL


def _request():
    return parse_chat_request({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS})


def test_the_chat_body_reads_json_in_an_opened_block_as_reasoning():
    body = completion_body(_request(), "id", "m", ANSWER, "stop", 5, 9, think_opened=True)
    message = body["choices"][0]["message"]
    assert [call["function"]["name"] for call in message["tool_calls"]] == ["get_weather"]
    assert "rm_rf" in message["reasoning_content"]
    assert body["choices"][0]["finish_reason"] == "tool_calls"


def test_anthropic_reads_json_in_an_opened_block_as_its_thinking_block():
    blocks, finish = anthropic.content_blocks(_request(), ANSWER, "stop", think_opened=True)
    assert [block["type"] for block in blocks] == ["thinking", "tool_use"]
    assert "rm_rf" in blocks[0]["thinking"]
    assert blocks[1]["name"] == "get_weather"
    assert finish == "tool_calls"
    stream = anthropic.ToolStream(True)
    for start in range(0, len(ANSWER), 7):
        stream.push(ANSWER[start:start + 7])
    stream.close("stop")
    assert [block["type"] for block in stream.blocks] == ["thinking", "tool_use"]
