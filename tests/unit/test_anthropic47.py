"""serve's Anthropic Messages API (edgesdk/serve/anthropic.py) against Anthropic's reference: ``max_tokens`` (a
whole number >= 0, 0 pre-warming the prompt cache; no -1), ``temperature`` (0.0 to 1.0), a ``tool_use`` block's
``input`` (an object), and consecutive turns of one role combined into one turn."""

from __future__ import annotations

import pytest

from edgesdk.serve.anthropic import parse_messages_request
from edgesdk.serve.api import ApiError
from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served

MESSAGES = [{"role": "user", "content": "Say something."}]
CALL = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


@pytest.fixture
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=24))
    yield server
    server.close()


def _refused(body: dict) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_messages_request(body)
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize("value", [1.5, 2])
def test_a_temperature_above_one_is_refused(value):
    """Anthropic's temperature ranges from 0.0 to 1.0; the chat route's (OpenAI's) 2 is not Anthropic's."""
    error = _refused({"max_tokens": 4, "messages": MESSAGES, "temperature": value})
    assert error.param == "temperature"
    assert "[0, 1]" in error.message
    assert parse_messages_request({"max_tokens": 4, "messages": MESSAGES, "temperature": 1}).temperature == 1


@pytest.mark.parametrize("value", [-1, -5, 2.5, "8"])
def test_max_tokens_is_a_whole_number_of_at_least_zero(value):
    """Anthropic's max_tokens has a minimum of 0; the chat route's -1 (llama-server's "no limit") is no limit
    Anthropic takes: it ran an answer to the end of the context."""
    error = _refused({"max_tokens": value, "messages": MESSAGES})
    assert error.param == "max_tokens"
    assert ">= 0" in error.message
    assert "-1" not in error.message.replace(f"got {value}", "")


def test_max_tokens_zero_prewarms_the_cache(served):
    """max_tokens 0 (Anthropic's cache pre-warming): the prompt is processed into the cache and nothing is
    generated; the next request with that prompt reads it from the cache."""
    status, warmed = served.post("/v1/messages", {"max_tokens": 0, "messages": MESSAGES})
    assert status == 200, warmed
    assert warmed["stop_reason"] == "max_tokens"
    assert warmed["usage"]["output_tokens"] == 0
    assert "".join(block.get("text", "") for block in warmed["content"]) == ""
    prompt = warmed["usage"]["input_tokens"] + warmed["usage"]["cache_read_input_tokens"]
    status, answer = served.post("/v1/messages", {"max_tokens": 2, "messages": MESSAGES})
    assert status == 200, answer
    assert answer["usage"]["cache_read_input_tokens"] >= prompt - 1


@pytest.mark.parametrize(("fields", "named"), [({"stream": True}, "stream"),
                                               ({"thinking": {"type": "enabled", "budget_tokens": 2048}},
                                                "thinking")])
def test_max_tokens_zero_takes_no_stream_nor_thinking(fields, named):
    error = _refused({"max_tokens": 0, "messages": MESSAGES, **fields})
    assert error.param == "max_tokens"
    assert named in error.message


@pytest.mark.parametrize("value", [[1], "city=Paris", 5])
def test_a_tool_use_input_must_be_an_object(value):
    """A tool_use block's input is an object (the call's arguments); a list or a string was passed on to the
    template as the call's arguments."""
    turns = [*MESSAGES, {"role": "assistant", "content": [{**CALL, "input": value}]}]
    error = _refused({"max_tokens": 4, "messages": turns})
    assert error.param == "messages[1].content[0].input"
    assert "object" in error.message


def test_an_assistant_s_text_then_its_call_in_the_next_turn_are_one_turn(served):
    """Anthropic combines consecutive turns of one role into one turn: an assistant's text and, in the next
    assistant turn, its tool_use are one assistant message that writes and calls, as the same blocks in one turn."""
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "21 C"}]}
    apart = [*MESSAGES, {"role": "assistant", "content": "Let me check."},
             {"role": "assistant", "content": [CALL]}, result]
    together = [*MESSAGES, {"role": "assistant", "content": [{"type": "text", "text": "Let me check."}, CALL]}, result]
    one = parse_messages_request({"max_tokens": 4, "messages": together}).messages
    assert parse_messages_request({"max_tokens": 4, "messages": apart}).messages == one
    assert [message["role"] for message in one].count("assistant") == 1
    counts = []
    for turns in (apart, together):
        status, counted = served.post("/v1/messages/count_tokens", {"messages": turns})
        assert status == 200, counted
        counts.append(counted["input_tokens"])
    assert counts[0] == counts[1]


def test_an_empty_turn_adds_no_blank_line_to_the_next():
    """An assistant turn of thinking alone (left out, as Anthropic strips it) has no text: combined with the next
    assistant turn, that turn's text is kept as it is (a final one is the answer's start, which a leading blank
    line would change)."""
    thinking = {"type": "thinking", "thinking": "Hmm.", "signature": ""}
    turns = [*MESSAGES, {"role": "assistant", "content": [thinking]}, {"role": "assistant", "content": "The fox"}]
    messages = parse_messages_request({"max_tokens": 4, "messages": turns}).messages
    assert messages[-1] == {"role": "assistant", "content": "The fox"}
