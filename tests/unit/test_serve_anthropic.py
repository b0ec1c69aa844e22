"""serve's Anthropic Messages API (edgesdk/serve/anthropic.py) on a real server over the tiny bundle."""

from __future__ import annotations

import json

import pytest

from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served
from tests.unit.test_tools import ROOM
from tests.unit.test_tools import server as tools_server  # noqa: F401 (a fixture: room for the tools' description)

MESSAGES = [{"role": "user", "content": "Say something."}]
WEATHER = {"name": "get_weather", "description": "Weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                            "required": ["city"]}}


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


@pytest.fixture
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=24))
    yield server
    server.close()


def _events(server: Served, body: dict, headers: dict | None = None) -> list[tuple[str, dict]]:
    status, response_headers, payload = server.request("POST", "/v1/messages", {**body, "stream": True},
                                                       headers=headers)
    assert status == 200, payload
    assert response_headers["Content-Type"] == "text/event-stream"
    events = []
    for block in payload.decode().split("\n\n"):
        if block:
            name, data = block.split("\n", 1)
            assert name.startswith("event: "), block
            assert data.startswith("data: "), block
            events.append((name[len("event: "):], json.loads(data[len("data: "):])))
    return events


def test_a_message_is_the_chat_completion_s_answer_in_anthropic_s_shape(served):
    status, chat = served.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 12})
    assert status == 200, chat
    status, message = served.post("/v1/messages", {"model": "any", "max_tokens": 12, "messages": MESSAGES})
    assert status == 200, message
    assert message["id"].startswith("msg_")
    assert (message["type"], message["role"], message["model"]) == ("message", "assistant", "tiny-host")
    assert message["content"] == [{"type": "text", "text": chat["choices"][0]["message"]["content"]}]
    expected = {"length": "max_tokens", "stop": "end_turn"}[chat["choices"][0]["finish_reason"]]
    assert (message["stop_reason"], message["stop_sequence"]) == (expected, None)
    used = message["usage"]
    assert used["output_tokens"] == chat["usage"]["completion_tokens"]
    assert used["input_tokens"] + used["cache_read_input_tokens"] == chat["usage"]["prompt_tokens"]
    status, counted = served.post("/v1/messages/count_tokens", {"model": "any", "messages": MESSAGES})
    assert (status, counted) == (200, {"input_tokens": chat["usage"]["prompt_tokens"]})


def test_system_text_blocks_and_a_stop_sequence(served):
    # a turn's text blocks are joined by a line break, as llama-server joins them (its OpenAI text parts)
    status, whole = served.post("/v1/messages", {"max_tokens": 16, "system": "Be brief.",
                                                 "messages": [{"role": "user", "content": "Say\nsomething."}]})
    assert status == 200, whole
    text = whole["content"][0]["text"]
    assert len(text) > 3
    stop = text[2:4]
    blocks = [{"type": "text", "text": "Say"}, {"type": "text", "text": "something."}]
    status, cut = served.post("/v1/messages", {"max_tokens": 16, "system": [{"type": "text", "text": "Be brief."}],
                                               "messages": [{"role": "user", "content": blocks}],
                                               "stop_sequences": [stop]})
    assert status == 200, cut
    assert cut["content"][0]["text"] == text[:text.index(stop)]
    assert (cut["stop_reason"], cut["stop_sequence"]) == ("stop_sequence", stop)


def test_a_stream_carries_the_whole_answer_in_anthropic_s_events(served):
    status, whole = served.post("/v1/messages", {"max_tokens": 12, "messages": MESSAGES})
    assert status == 200
    events = _events(served, {"max_tokens": 12, "messages": MESSAGES})
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) <= {"content_block_delta"}
    text = "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta")
    assert text == whole["content"][0]["text"]
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == whole["stop_reason"]
    assert delta["usage"]["output_tokens"] == whole["usage"]["output_tokens"]
    assert events[0][1]["message"]["usage"]["input_tokens"] > 0


def test_tools_are_called_as_tool_use_blocks_whole_and_streamed(tools_server):  # noqa: F811 (the fixture)
    served = tools_server
    body = {"max_tokens": ROOM, "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER],
            "tool_choice": {"type": "tool", "name": "get_weather"}}
    status, message = served.post("/v1/messages", body)
    assert status == 200, message
    (block,) = message["content"]
    assert block["type"] == "tool_use"
    assert block["id"].startswith("toolu_")
    assert block["name"] == "get_weather"
    assert block["input"]["city"] in ("Paris", "Oslo")
    assert message["stop_reason"] == "tool_use"
    events = _events(served, body)
    started = [data for name, data in events if name == "content_block_start"]
    assert [data["content_block"]["type"] for data in started] == ["tool_use"]
    deltas = [data["delta"] for name, data in events if name == "content_block_delta"]  # the input in pieces
    assert {delta["type"] for delta in deltas} == {"input_json_delta"}
    assert json.loads("".join(delta["partial_json"] for delta in deltas)) == block["input"]
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    # the call and its result travel back as tool_use and tool_result blocks
    follow = {"max_tokens": 8, "tools": [WEATHER], "tool_choice": {"type": "none"}, "messages": [
        body["messages"][0], {"role": "assistant", "content": [block]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block["id"], "content": "Sunny, 21 C"}]}]}
    status, answer = served.post("/v1/messages", follow)
    assert status == 200, answer
    assert answer["content"][0]["type"] == "text"


@pytest.mark.parametrize(("body", "param", "message"), [
    ({"messages": MESSAGES}, "max_tokens", "'max_tokens' is required"),
    ({"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}, "messages[0].role", "goes in 'system'"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0]", '"image" block'),
    ({"max_tokens": 4, "messages": MESSAGES, "thinking": {"type": "sometimes"}}, "thinking",
     "'thinking' must be"),
    ({"max_tokens": 4, "messages": MESSAGES, "thinking": {"type": "enabled", "budget_tokens": 10}}, "thinking",
     "with N >= 1024"),
    ({"max_tokens": 4, "messages": MESSAGES, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     "tools[0]", "client tools"),
    ({"max_tokens": 4, "messages": MESSAGES, "stop_sequences": 5}, "stop_sequences", "stop_sequences"),
    # 0 pre-warms the prompt cache (Anthropic's minimum: test_anthropic47.py); -1, the chat route's "no limit", is none
    ({"max_tokens": -1, "messages": MESSAGES}, "max_tokens", "max_tokens"),
    ({"max_tokens": 4, "messages": MESSAGES, "tool_choice": {"type": "sometimes"}}, "tool_choice", "tool_choice"),
])
def test_refusals_are_anthropic_errors_naming_the_field(served, body, param, message):
    status, answer = served.post("/v1/messages", body)
    assert status == 400
    assert answer["type"] == "error"
    assert answer["error"]["type"] == "invalid_request_error"
    assert message in answer["error"]["message"]


def test_the_api_key_is_taken_as_x_api_key_too(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=4), api_key="secret")
    try:
        body = {"max_tokens": 4, "messages": MESSAGES}
        status, answer = server.post("/v1/messages", body)
        assert (status, answer["error"]["type"]) == (401, "authentication_error")
        status, answer = server.post("/v1/messages", body, headers={"x-api-key": "secret"})
        assert status == 200, answer
        status, answer = server.post("/v1/chat/completions", body, headers={"x-api-key": "secret"})
        assert status == 200, answer
        status, answer = server.post("/v1/chat/completions", body, headers={"x-api-key": "wrong"})
        assert (status, answer["error"]["code"]) == (401, "invalid_api_key")
    finally:
        server.close()


def test_anthropic_s_own_client_talks_to_the_server(runtime):
    """Anthropic's Python SDK against the server: an answer, a stream, a count and an error, as it reads them."""
    anthropic = pytest.importorskip("anthropic")
    server = Served(runtime, ServeDefaults(max_tokens=12), api_key="secret")
    try:
        client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.port}", api_key="secret", max_retries=0)
        message = client.messages.create(model="tiny-host", max_tokens=10, system="Be brief.", messages=MESSAGES)
        assert message.stop_reason in ("end_turn", "max_tokens")
        assert message.usage.output_tokens >= 1
        with client.messages.stream(model="tiny-host", max_tokens=10, system="Be brief.", messages=MESSAGES) as stream:
            streamed = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert streamed == message.content[0].text == final.content[0].text
        assert final.usage.output_tokens == message.usage.output_tokens
        counted = client.messages.count_tokens(model="tiny-host", messages=MESSAGES)
        assert counted.input_tokens > 0
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.messages.create(model="tiny-host", max_tokens=10, messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
        assert refused.value.status_code == 400
        assert '"image" block' in refused.value.body["error"]["message"]
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.port}", api_key="wrong", max_retries=0) \
                .messages.create(model="tiny-host", max_tokens=4, messages=MESSAGES)
    finally:
        server.close()


def test_consecutive_turns_of_one_role_are_combined_as_anthropic_combines_them():
    """Templates that require alternating roles (Llama 2's, Mistral's) refused two user turns in a row."""
    from edgesdk.serve.anthropic import chat_body

    result = [{"type": "tool_result", "tool_use_id": "t1", "content": "18 C"}]
    call = [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]
    body = chat_body({"max_tokens": 8, "system": "Be brief.", "messages": [
        {"role": "user", "content": "Hello."}, {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {"role": "assistant", "content": call}, {"role": "user", "content": result},
        {"role": "user", "content": "Thanks."}, {"role": "assistant", "content": "You"},
        {"role": "assistant", "content": "are welcome"}]})
    assert [(m["role"], m.get("content")) for m in body["messages"]] == [
        ("system", "Be brief."), ("user", "Hello.\n\nWeather?"), ("assistant", None), ("tool", "18 C"),
        ("user", "Thanks."), ("assistant", "You\n\nare welcome")]
