"""serve's Anthropic Messages API (edgesdk/serve/anthropic.py) against requests clients send and the
answers Anthropic's reference gives: errors naming Anthropic's fields, stop sequences, stop reasons,
usage in a stream, token counts and the error shape on every refusal of these routes."""

from __future__ import annotations

import json
import re
import socket

import pytest

from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served
from tests.unit.test_serve_anthropic import MESSAGES, _events


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


@pytest.fixture
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=24))
    yield server
    server.close()


def _count(server: Served, body: dict) -> int:
    status, counted = server.post("/v1/messages/count_tokens", body)
    assert status == 200, counted
    return counted["input_tokens"]


WEATHER = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.mark.parametrize(("body", "named", "not_named"), [
    # the chat request numbers its messages from the system prompt: this turn was called messages[1]
    ({"system": "Be brief.", "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": 5, "content": "21 C"}]}]},
     "messages[0].content[0].tool_use_id", "messages[1]"),
    ({"system": "Be brief.", "messages": [{"role": "user", "content": "bad \ud800"}]},
     "messages[0].content", "messages[1]"),
    ({"system": "Be brief.", "messages": [{"role": "user", "content": [{"type": "text", "text": "\udc80"}]}]},
     "messages[0].content[0].text", "messages[1]"),
    ({"system": [{"type": "text", "text": "\ud800"}], "messages": MESSAGES}, "system[0].text", "messages[0]"),
    # the tool's fields by Anthropic's names, not the OpenAI function's they are translated into
    ({"messages": MESSAGES, "tools": [{**WEATHER, "name": "get weather"}]}, "tools[0].name", "function"),
    ({"messages": MESSAGES, "tools": [{"name": "get_weather", "input_schema": {"type": "string"}}]},
     "tools[0].input_schema", "function"),
    ({"messages": MESSAGES, "tool_choice": {"type": "any"}}, "'tool_choice' {\"type\": \"any\"}", "required"),
    ({"messages": MESSAGES, "tools": [WEATHER], "tool_choice": {"type": "tool"}}, "must name the tool", "null"),
    ({"messages": [{"role": "user"}]}, "messages[0].content must be a string or an array of content blocks",
     "must be an array,"),
])
def test_refusals_name_the_anthropic_field(served, body, named, not_named):
    status, answer = served.post("/v1/messages", {"max_tokens": 4, **body})
    assert status == 400, answer
    assert answer["type"] == "error"
    message = answer["error"]["message"]
    assert named in message
    assert not_named not in message


def test_more_than_four_stop_sequences_are_taken(served):
    """OpenAI's stop takes at most 4 strings; Anthropic's stop_sequences (and llama-server's) any number."""
    status, whole = served.post("/v1/messages", {"max_tokens": 16, "messages": MESSAGES})
    assert status == 200, whole
    text = whole["content"][0]["text"]
    stop = text[2:4]
    stops = ["never 1", "never 2", "never 3", "never 4", "never 5", stop]
    status, cut = served.post("/v1/messages", {"max_tokens": 16, "messages": MESSAGES, "stop_sequences": stops})
    assert status == 200, cut
    assert cut["content"][0]["text"] == text[:text.index(stop)]
    assert (cut["stop_reason"], cut["stop_sequence"]) == ("stop_sequence", stop)
    status, refused = served.post("/v1/messages", {"max_tokens": 4, "messages": MESSAGES, "stop_sequences": [1]})
    assert status == 400
    assert "'stop_sequences' must be an array of strings" in refused["error"]["message"]


def test_an_empty_system_list_is_no_system_prompt(served):
    """system [] is no system prompt, like system "" and no system: SmolLM2's template then puts its default one."""
    plain = _count(served, {"messages": MESSAGES})
    assert _count(served, {"messages": MESSAGES, "system": ""}) == plain
    assert _count(served, {"messages": MESSAGES, "system": []}) == plain
    assert _count(served, {"messages": MESSAGES, "system": [{"type": "text", "text": "Be brief."}]}) != plain


def test_a_stream_s_usage_is_the_whole_answer_s_as_the_sdk_reads_it(runtime):
    """message_delta's usage is cumulative: with a prompt taken from the cache, the streamed message read
    0 cached tokens and the whole prompt as input, where the same answer without stream read the cache."""
    anthropic = pytest.importorskip("anthropic")
    server = Served(runtime, ServeDefaults(max_tokens=8))
    try:
        client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{server.port}", api_key="x", max_retries=0)
        request = {"model": "tiny-host", "max_tokens": 8, "system": "Be brief.", "messages": MESSAGES}
        client.messages.create(**request)  # the prompt is in the cache from here on
        whole = client.messages.create(**request)
        assert whole.usage.cache_read_input_tokens > 0
        with client.messages.stream(**request) as stream:
            final = stream.get_final_message()
        assert final.content[0].text == whole.content[0].text
        assert final.usage.to_dict() == whole.usage.to_dict()
    finally:
        server.close()


def _long_prompt(server: Served, tokens: int) -> list[dict]:
    """Messages whose prompt has about ``tokens`` tokens (the tiny model's context holds 256)."""
    words = 1
    while _count(server, {"messages": [{"role": "user", "content": "word " * (words + 1)}]}) <= tokens:
        words += 1
    return [{"role": "user", "content": "word " * words}]


def test_an_answer_that_fills_the_context_says_so(served):
    """An answer cut off by a full context before its max_tokens is model_context_window_exceeded, not
    max_tokens: asking again with a larger max_tokens would end there again."""
    messages = _long_prompt(served, 240)
    body = {"max_tokens": 64, "messages": messages}
    status, message = served.post("/v1/messages", body)
    assert status == 200, message
    assert message["usage"]["output_tokens"] < 64
    assert message["stop_reason"] == "model_context_window_exceeded"
    assert _events(served, body)[-2][1]["delta"]["stop_reason"] == "model_context_window_exceeded"
    status, message = served.post("/v1/messages", {"max_tokens": 4, "messages": messages})
    assert (status, message["stop_reason"], message["usage"]["output_tokens"]) == (200, "max_tokens", 4)


def test_count_tokens_counts_a_prompt_past_the_context(served):
    """count_tokens is how a client learns whether a prompt fits: one that does not was a 400, not its count."""
    messages = [{"role": "user", "content": "word " * 300}]
    status, refused = served.post("/v1/messages", {"max_tokens": 4, "messages": messages})
    assert status == 400
    length = int(re.search(r"resulted in (\d+) tokens", refused["error"]["message"])[1])
    assert length > 256
    assert _count(served, {"messages": messages}) == length


def test_refusals_on_these_routes_are_in_anthropic_s_shape(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=4), api_key="k")
    try:
        status, headers, payload = server.request("GET", "/v1/messages", headers={"x-api-key": "k"})
        assert (status, headers["Allow"]) == (405, "POST")
        assert json.loads(payload)["type"] == "error"
        status, _, payload = server.request("GET", "/v1/messages/count_tokens")
        assert (status, json.loads(payload)["error"]["type"]) == (401, "authentication_error")
        # curl's Expect: 100-continue is refused on its headers, in the same shape
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as client:
            client.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                           b"Content-Length: 20\r\nx-api-key: wrong\r\n\r\n")
            received = b""
            while chunk := client.recv(65536):
                received += chunk
        assert received.startswith(b"HTTP/1.1 401"), received[:200]
        assert json.loads(received.partition(b"\r\n\r\n")[2])["error"]["type"] == "authentication_error"
        status, answer = server.post("/v1/chat/completions", {"max_tokens": 2, "messages": MESSAGES})
        assert (status, answer["error"]["code"]) == (401, "invalid_api_key")  # OpenAI's routes keep OpenAI's shape
    finally:
        server.close()
