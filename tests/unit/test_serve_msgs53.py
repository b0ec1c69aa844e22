"""Chat message conversion on the OpenAI, Ollama and Anthropic routes, and serve's check of its API keys: a tool
result's ``tool_call_id`` reaches the prompt (llama.cpp's polyfill writes it), and a key any header carries is taken."""

from __future__ import annotations

import json

import pytest

from edgesdk.serve import ollama
from edgesdk.serve.anthropic import parse_messages_request
from edgesdk.serve.api import parse_chat_request

CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}}}}}
# two calls of one tool, answered in turn: only the ids say which result answers which call
CALLS = [{"id": "call_a", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Oslo"}'}},
         {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Lima"}'}}]
PARALLEL = [{"role": "user", "content": "Time in Oslo and Lima?"},
            {"role": "assistant", "content": None, "tool_calls": CALLS},
            {"role": "tool", "tool_call_id": "call_a", "content": "09:00"},
            {"role": "tool", "tool_call_id": "call_b", "content": "03:00"}]


def _result(call_id: str, content: str, name: str | None = "get_time") -> str:
    """A tool result's text as llama.cpp's polyfill writes it, id included (the tool's name, where known, as "tool")."""
    named = {} if name is None else {"tool": name}
    return json.dumps({"tool_response": {**named, "content": content, "tool_call_id": call_id}}, ensure_ascii=False)


def test_the_chat_route_s_prompt_holds_each_tool_result_s_call_id(served):
    status, body = served.post("/apply-template", {"messages": PARALLEL})
    assert status == 200, body
    assert _result("call_a", "09:00") in body["prompt"]
    assert _result("call_b", "03:00") in body["prompt"]


def test_a_tool_result_of_no_known_call_keeps_its_id():
    messages = [{"role": "user", "content": "Time?"},
                {"role": "tool", "tool_call_id": "call_z", "name": "get_time", "content": "12:00"}]
    assert parse_chat_request({"messages": messages}).messages[1]["content"] == _result("call_z", "12:00")


def test_an_anthropic_tool_result_holds_its_tool_use_id():
    body = {"model": "tiny", "max_tokens": 4, "messages": [
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_time", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "12:00"}]}]}
    texts = [message["content"] for message in parse_messages_request(body).messages]
    assert _result("toolu_1", "12:00") in texts


def test_ollama_renders_a_tool_result_with_the_id_of_the_call_it_answers():
    calls = [{"id": call["id"], "function": {"name": "get_time", "arguments": json.loads(call["function"]["arguments"])}}
             for call in CALLS]
    body = {"model": "tiny", "tools": [CLOCK], "messages": [
        PARALLEL[0], {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_a", "content": "09:00"},
        {"role": "tool", "tool_name": "get_time", "content": "03:00"}]}  # the latest get_time call: call_b
    texts = [message["content"] for message in ollama.parse_chat(body, "tiny").request.messages]
    assert texts[-2:] == [_result("call_a", "09:00"), _result("call_b", "03:00")]


def test_ollama_keeps_the_id_of_a_tool_result_that_answers_no_call_made():
    """A result whose ``tool_call_id`` names no call, renders as the chat route renders it: with that id."""
    for result in ({"tool_name": "get_time"}, {}):
        body = {"model": "tiny", "messages": [{"role": "user", "content": "Time?"},
                                              {"role": "tool", "tool_call_id": "call_z", "content": "12:00", **result}]}
        expected = parse_chat_request({"messages": [body["messages"][0], {
            "role": "tool", "tool_call_id": "call_z", "content": "12:00",
            **({"name": result["tool_name"]} if result else {})}]}).messages
        assert ollama.parse_chat(body, "tiny").request.messages == expected
        assert expected[-1]["content"] == _result("call_z", "12:00", result.get("tool_name"))


def _serve_with_empty_host(tiny_bundle, key: str):
    """``edgesdk serve --api-key KEY --host ""``: refused at the host, checked after the keys, where the key is taken."""
    from click.testing import CliRunner

    from edgesdk.cli import main

    return CliRunner().invoke(main, ["serve", str(tiny_bundle.path), "--port", "0", "--host", "", "--api-key", key])


@pytest.mark.parametrize("key", ["clé-secrète", "two words", "ok,ключ"])
def test_serve_takes_a_key_a_header_carries_as_utf8(tiny_bundle, key):
    """llama-server takes any key and matches the header's bytes (serve/http_server.py does too): a non-ASCII key or
    one with inner spaces was refused at start ("must be printable ASCII without spaces")."""
    result = _serve_with_empty_host(tiny_bundle, key)
    assert result.exit_code == 2
    assert "'--host'" in result.output, result.output
    assert "--api-key" not in result.output


def test_serve_refuses_a_key_of_another_encoding_without_showing_it(tiny_bundle):
    """A key given in Latin-1 bytes reads as a lone surrogate (Python's surrogateescape): no UTF-8 form to match."""
    result = _serve_with_empty_host(tiny_bundle, "fine,cl\udce9-secrete")
    assert result.exit_code == 2
    assert "key 2 of 2 is not UTF-8 text (a byte of another encoding at character 3)" in result.output
    assert "secrete" not in result.output


def test_a_key_with_inner_spaces_opens_the_routes(runtime):
    from tests.unit.test_serve import Served

    server = Served(runtime, api_key=("two words",))
    try:
        assert server.request("GET", "/v1/models/tiny-host", headers={"Authorization": "Bearer two words"})[0] == 200
        assert server.request("GET", "/v1/models/tiny-host", headers={"x-api-key": "two words"})[0] == 200
        assert server.request("GET", "/v1/models/tiny-host", headers={"Authorization": "Bearer two"})[0] == 401
    finally:
        server.close()


def test_ollama_results_of_parallel_calls_of_one_tool_answer_one_call_each():
    """Results that name only their ``tool_name`` answer that tool's calls of the latest turn in order: both were
    taken for the last call (the prompt then said twice that call_1_1 was answered, and call_1_0 never)."""
    calls = [{"function": {"name": "get_time", "arguments": {"city": city}}} for city in ("Oslo", "Lima")]
    earlier = [{"role": "assistant", "content": "", "tool_calls": [calls[0]]},
               {"role": "tool", "tool_name": "get_time", "content": "08:00"}]
    body = {"model": "tiny", "messages": [
        PARALLEL[0], *earlier, {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "tool_name": "get_time", "content": "09:00"},
        {"role": "tool", "tool_name": "get_time", "content": "03:00"},
        {"role": "tool", "tool_name": "get_time", "content": "late"}]}  # a third: the latest call, as before
    texts = [message["content"] for message in ollama.parse_chat(body, "tiny").request.messages]
    assert texts[2] == _result("call_1_0", "08:00")
    assert texts[-3:] == [_result("call_3_0", "09:00"), _result("call_3_1", "03:00"), _result("call_3_1", "late")]


@pytest.mark.parametrize("message", ["hi", None, ["user", "hi"]])
def test_ollama_names_a_message_that_is_no_object_as_the_message(message):
    """It was "messages[1].role must be one of system, user, assistant, tool, got 'hi'": its role blamed."""
    from edgesdk.serve.api import ApiError

    with pytest.raises(ApiError) as refused:
        ollama.parse_chat({"model": "tiny", "messages": [PARALLEL[0], message]}, "tiny")
    assert refused.value.param == "messages[1]"
    assert refused.value.message.startswith("messages[1] must be an object with 'role' and 'content'")


def _status(url: str, header: bytes) -> int:
    """The status of ``GET /props`` sent with one header line written as raw bytes (as curl sends a UTF-8 key)."""
    import socket
    from urllib.parse import urlsplit

    place = urlsplit(url)
    with socket.create_connection((place.hostname, place.port), timeout=60) as connection:
        connection.sendall(b"GET /props HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + header + b"\r\n\r\n")
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def test_serve_started_with_a_non_ascii_key_opens_to_it(tiny_bundle, tmp_path):
    """The real command: a key of non-ASCII letters and an inner space, beside another, opens the routes to a client
    sending its UTF-8 bytes (as llama-server does); the command refused to start with it."""
    from tests._utils.serve_command import serve_command

    with serve_command(tiny_bundle.path, tmp_path, "--api-key", "clé secrète, ключ") as url:
        assert _status(url, "Authorization: Bearer clé secrète".encode()) == 200
        assert _status(url, "x-api-key: ключ".encode()) == 200
        assert _status(url, "Authorization: Bearer clé".encode()) == 401
