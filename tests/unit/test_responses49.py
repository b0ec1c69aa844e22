"""OpenAI's Responses API and Anthropic's Messages API on a real server over the tiny bundle: review 49.

* A streamed thinking block ends as Anthropic's stream ends one ("Streaming Messages", extended thinking: a
  ``signature_delta`` just before the block's ``content_block_stop``) and as llama-server's does
  (tools/server/server-task.cpp, ``to_json_anthropic_stream``: ``{"type": "signature_delta", "signature": ""}``). It
  had no ``signature_delta``, so a client that keeps a thinking block once its signature comes lost it.
"""

from __future__ import annotations

import json

from tests.unit.test_serve import Served

ASK = [{"role": "user", "content": "Tell me about the fox."}]


def _message_events(server: Served, body: dict) -> list[tuple[str, dict]]:
    status, _, payload = server.request("POST", "/v1/messages", {**body, "stream": True})
    assert status == 200, payload
    events = []
    for chunk in payload.decode().split("\n\n"):
        if chunk:
            name, data = chunk.split("\n", 1)
            events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def test_a_streamed_thinking_block_ends_with_its_signature_delta(terse):
    body = {"model": "m", "max_tokens": 10, "messages": ASK}
    status, whole = terse.post("/v1/messages", body)
    assert status == 200, whole
    assert [block["type"] for block in whole["content"]] == ["thinking"]
    events = _message_events(terse, body)
    shapes = [(name, data.get("index"), (data.get("content_block") or data.get("delta") or {}).get("type"))
              for name, data in events if name.startswith("content_block")]
    # the block's text, then its signature just before its stop (Anthropic's order)
    assert shapes[0] == ("content_block_start", 0, "thinking")
    assert shapes[-2:] == [("content_block_delta", 0, "signature_delta"), ("content_block_stop", 0, None)]
    assert {shape for shape in shapes[1:-2]} == {("content_block_delta", 0, "thinking_delta")}
    # the block the events build, as Anthropic's SDK accumulates them, is the whole answer's
    block = dict(events[[name for name, _ in events].index("content_block_start")][1]["content_block"])
    for name, data in events:
        if name == "content_block_delta" and data["delta"]["type"] == "thinking_delta":
            block["thinking"] += data["delta"]["thinking"]
        elif name == "content_block_delta" and data["delta"]["type"] == "signature_delta":
            block["signature"] = data["delta"]["signature"]
    assert block == whole["content"][0]


def test_a_thinking_block_signs_before_the_text_block_opens():
    from edgesdk.serve.anthropic import ThinkingStream

    blocks = ThinkingStream()
    events = blocks.pieces("The fox", "") + blocks.pieces(" runs.", "It") + blocks.close()
    shapes = [(name, data.get("index"), (data.get("content_block") or data.get("delta") or {}).get("type"))
              for name, data in events]
    assert shapes == [("content_block_start", 0, "thinking"), ("content_block_delta", 0, "thinking_delta"),
                      ("content_block_delta", 0, "thinking_delta"), ("content_block_delta", 0, "signature_delta"),
                      ("content_block_stop", 0, None), ("content_block_start", 1, "text"),
                      ("content_block_delta", 1, "text_delta"), ("content_block_stop", 1, None)]
    assert events[3][1]["delta"] == {"type": "signature_delta", "signature": ""}
