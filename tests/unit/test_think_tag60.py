"""A thinking block whose answer ended inside its ``</think>`` on the routes that stream it: llama-server reads a
trailing start of the tag as the tag in a partial answer alone (cut by the token limit or a stop string; common/
chat-parser.cpp ``try_find_literal``), so an answer that ended at end-of-generation keeps it in its reasoning
(``<think>abc</thi``: reasoning ``abc</thi``), and the streamed Messages route gives the thinking its whole answer
gives. Under tools an open block never ends at end-of-generation (edgesdk/serve/completion.py, ``ThinkingFirst``):
the answer still owes its call, so its cut tag is always a partial answer's and dropped.

A real server over the tiny bundle, its chat template thinking as Qwen3's does, the model's logits steered toward
a scripted answer (tests/unit/test_think48.py, ``Steered``)."""

from __future__ import annotations

import json

import pytest

from edgesdk.runtime.session import open_runtime
from edgesdk.serve.completion import ServeDefaults
from edgesdk.serve.tools import answer_message
from tests.unit.test_serve import Served
from tests.unit.test_serve_mend54 import EOS, _constraint, _feed
from tests.unit.test_think48 import THINKS, Steered

CUT = "<think>\nabc</thi"  # the model ends the answer inside its closing tag
WHOLE = "<think>\nabc</think>\n\nhi"
ASK = [{"role": "user", "content": "Is the fox quick?"}]


@pytest.fixture(scope="module")
def steered(tiny_bundle):
    runtime = open_runtime(tiny_bundle.path, threads=1)
    runtime.tokenizer.template_source, runtime.tokenizer._template = THINKS, None
    backend = runtime.backend
    runtime.backend = Steered(backend, runtime.tokenizer, (CUT,))
    server = Served(runtime, ServeDefaults(max_tokens=64, prompt_cache=False))
    yield server
    server.close()
    runtime.backend = backend


@pytest.fixture
def script(steered):
    """Sets the one script the model follows; set back after the test."""
    backend = steered.completer.runtime.backend

    def follow(text: str) -> None:
        backend.scripts = (text,)

    yield follow
    backend.scripts = (CUT,)


def _message(**fields) -> dict:
    return {"model": "tiny-host", "messages": ASK, "max_tokens": 64, "temperature": 0, **fields}


def _events(server: Served, body: dict) -> list[tuple[str, dict]]:
    status, headers, payload = server.request("POST", "/v1/messages", {**body, "stream": True})
    assert status == 200, payload
    assert headers["Content-Type"] == "text/event-stream"
    events = []
    for block in payload.decode().split("\n\n"):
        if block:
            name, data = block.split("\n", 1)
            events.append((name[len("event: "):], json.loads(data[len("data: "):])))
    return events


def _streamed_thinking(events: list[tuple[str, dict]]) -> str:
    return "".join(data["delta"]["thinking"] for name, data in events
                   if name == "content_block_delta" and data["delta"]["type"] == "thinking_delta")


def _whole_thinking(server: Served, body: dict) -> tuple[str, str]:
    status, answer = server.post("/v1/messages", body)
    assert status == 200, answer
    thinking = "".join(block["thinking"] for block in answer["content"] if block["type"] == "thinking")
    return thinking, answer["stop_reason"]


def test_a_streamed_message_ended_inside_the_tag_keeps_its_start(steered):
    """The old stream dropped ``</thi`` from the thinking at end-of-generation (``abc``), where the whole answer
    and llama-server keep it."""
    body = _message()
    thinking, stop_reason = _whole_thinking(steered, body)
    assert (thinking, stop_reason) == ("abc</thi", "end_turn")
    events = _events(steered, body)
    assert _streamed_thinking(events) == "abc</thi"
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"
    assert not [data for name, data in events if name == "content_block_delta" and data["delta"]["type"] == "text_delta"
                and data["delta"]["text"]]


@pytest.mark.parametrize(("fields", "stop_reason"), [({"max_tokens": len(CUT)}, "max_tokens"),
                                                     ({"stop_sequences": ["nk>\n\n"]}, "stop_sequence")])
def test_a_streamed_message_cut_inside_the_tag_drops_its_start(steered, script, fields, stop_reason):
    """Cut by the token limit or a stop string the answer is partial: the tag's start is the tag, as before."""
    script(WHOLE)
    body = _message(**fields)
    assert _whole_thinking(steered, body) == ("abc", stop_reason)
    events = _events(steered, body)
    assert _streamed_thinking(events) == "abc"
    assert events[-2][1]["delta"]["stop_reason"] == stop_reason


def test_under_tools_an_open_block_never_ends_at_end_of_generation():
    """Under tools the answer still owes its call: the end of generation is refused inside the block, the start of
    its closing tag too, so an answer under tools that ends there was cut (partial) and its tag's start is dropped
    (AnswerStream's flush, not told how the answer ended)."""
    for opened, text in ((True, b"abc</thi"), (False, b"<think>abc</thi")):
        constraint = _constraint(opened=opened)
        _feed(constraint, text)
        assert not constraint.allows(EOS)
        fields, finish_reason = answer_message(text.decode(), "length", opened=opened)
        assert (fields.get("reasoning_content"), fields["content"], finish_reason) == ("abc", "", "length")


def _response_reasoning(server: Served, body: dict) -> tuple[str, str]:
    """(the whole response's reasoning text, the streamed response's)."""
    status, whole = server.post("/v1/responses", body)
    assert status == 200, whole
    reasoning = "".join(part["text"] for item in whole["output"] if item["type"] == "reasoning"
                        for part in item["content"])
    _, _, payload = server.request("POST", "/v1/responses", {**body, "stream": True})
    events = [json.loads(line[len("data: "):]) for line in payload.decode().splitlines() if line.startswith("data: ")]
    streamed = "".join(event["delta"] for event in events if event["type"] == "response.reasoning_text.delta")
    return reasoning, streamed


def test_a_response_ended_inside_the_tag_keeps_its_start(steered):
    """The Responses route (no tools) dropped ``</thi`` at end-of-generation, whole and streamed."""
    body = {"model": "tiny-host", "input": ASK, "max_output_tokens": 64, "temperature": 0}
    assert _response_reasoning(steered, body) == ("abc</thi", "abc</thi")


def test_a_response_cut_inside_the_tag_drops_its_start(steered, script):
    script(WHOLE)
    body = {"model": "tiny-host", "input": ASK, "max_output_tokens": len(CUT), "temperature": 0}
    assert _response_reasoning(steered, body) == ("abc", "abc")
