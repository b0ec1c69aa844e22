"""``edgesdk serve``: OpenAI-compatible requests against a real bundle over real HTTP.

The server runs in a thread on a free port of 127.0.0.1 with the tiny host bundle; answers are
checked against :func:`edgesdk.runtime.generate.generate` run directly on the same runtime.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.session import open_runtime
from edgesdk.serve.api import ApiError, parse_chat_request, parse_text_request
from edgesdk.serve.completion import Completer, ServeDefaults, StopMatcher
from edgesdk.serve.http_server import ApiServer

PROMPT = "The quick brown fox"


# ------------------------------------------------------------------------------------ request bodies


def test_chat_request_normalises_roles_and_text_parts():
    request = parse_chat_request({
        "model": "anything", "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]}],
        "max_completion_tokens": 7, "max_tokens": 99, "temperature": 0.5, "top_p": 0.9, "seed": 3,
        "stop": "\n", "stream": True, "stream_options": {"include_usage": True}, "user": "someone",
        "presence_penalty": 0, "n": 1})
    # text parts joined by a line break, as llama.cpp joins them (tests/unit/test_serve_parity36.py)
    assert request.messages == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello \nthere"})
    assert (request.max_tokens, request.temperature, request.top_p, request.seed) == (7, 0.5, 0.9, 3)
    assert request.stop == ("\n",)
    assert request.stream
    assert request.include_usage


@pytest.mark.parametrize(("body", "param"), [
    ({"n": 2}, "n"),
    ({"n": True}, "n"),  # True == 1 in Python: it was taken for n = 1
    ({"logprobs": "yes"}, "logprobs"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"echo": True}, "echo"),
    ({"tools": [{"type": "function"}]}, "tools[0]"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ({"grammar": "root ::= \"yes"}, "grammar"),
    ({"json_schema": {"type": "object", "properties": {"a": {"type": "string", "contentEncoding": "base64"}}}}, "json_schema"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"top_p": -0.1}, "top_p"),  # 0 is OpenAI's and llama.cpp's greedy nucleus
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 1.5}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"max_tokens": 1e400}, "max_tokens"),
    ({"seed": -2}, "seed"),  # -1 is llama-server's random seed (tests/unit/test_serve_parity36.py)
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": 5}, "stop"),
    ({"stream": "yes"}, "stream"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "function", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
])
def test_chat_request_refusals_name_the_field(body, param):
    full = {"messages": [{"role": "user", "content": "hi"}], **body}
    with pytest.raises(ApiError) as caught:
        parse_chat_request(full)
    assert caught.value.status == 400
    assert caught.value.param == param
    assert param.split("[")[0].split(".")[0] in caught.value.message


def test_text_request_takes_one_prompt():
    assert parse_text_request({"prompt": ["one"]}).prompt == "one"
    for prompt in (None, "", ["a", "b"], 3):
        with pytest.raises(ApiError, match="'prompt' must be a non-empty string"):
            parse_text_request({"prompt": prompt})
    with pytest.raises(ApiError, match="'echo'"):
        parse_text_request({"prompt": "x", "echo": "yes"})
    with pytest.raises(ApiError, match="'logprobs' must be at most 20"):
        parse_text_request({"prompt": "x", "logprobs": 21})
    with pytest.raises(ApiError, match="JSON object"):
        parse_text_request(["prompt"])


# ------------------------------------------------------------------------------------ stop strings


def test_stop_matcher_holds_back_a_possible_stop_start():
    matcher = StopMatcher(("</s>",))
    assert matcher.push("Hello <") == "Hello "
    assert matcher.push("/") == ""
    assert matcher.push("x") == "</x"  # not a stop after all
    assert matcher.push(" ok </") == " ok "
    assert matcher.push("s> more") == ""
    assert matcher.stopped


# ------------------------------------------------------------------------------------ the server


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    return open_runtime(tiny_bundle.path, threads=1)


class Served:
    """A server on a free port in a background thread, and requests to it."""

    def __init__(self, runtime, defaults=None, hook=None, api_key=None):
        self.completer = Completer(runtime, defaults or ServeDefaults(max_tokens=16), hook=hook)
        self.server = ApiServer(("127.0.0.1", 0), self.completer, "tiny-host", api_key=api_key, log=False)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def request(self, method: str, path: str, body: object | None = None, headers: dict | None = None,
                raw: bytes | None = None) -> tuple[int, dict, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        connection.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        payload = response.read()
        connection.close()
        return response.status, dict(response.getheaders()), payload

    def post(self, path: str, body: object, **kwargs) -> tuple[int, dict]:
        status, _, payload = self.request("POST", path, body, **kwargs)
        return status, json.loads(payload)

    def stream(self, path: str, body: dict) -> list[dict | str]:
        status, headers, payload = self.request("POST", path, {**body, "stream": True})
        assert status == 200, payload
        assert headers["Content-Type"] == "text/event-stream"
        events = [line[len("data: "):] for line in payload.decode().split("\n\n") if line]
        assert events[-1] == "[DONE]"
        return [json.loads(event) for event in events[:-1]] + ["[DONE]"]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def served(runtime):
    server = Served(runtime)
    yield server
    server.close()


@pytest.fixture(scope="module")
def reference(tiny_bundle):
    """A second runtime for :func:`direct`: the served one's KV cache belongs to its server's prompt cache."""
    return open_runtime(tiny_bundle.path, threads=1)


def direct(runtime, ids, max_tokens):
    """The greedy answer of ``generate`` itself, decoded."""
    tokens, stats = generate(runtime.backend, ids, SamplingConfig(max_new_tokens=max_tokens),
                             runtime.tokenizer.eos_token_ids)
    return runtime.tokenizer.decode(tokens), tokens, stats


def test_chat_answer_is_the_runtime_s_greedy_answer(served, reference):
    messages = [{"role": "user", "content": PROMPT}]
    status, body = served.post("/v1/chat/completions", {"model": "x", "messages": messages, "max_tokens": 12})
    assert status == 200, body
    ids = reference.tokenizer.prompt_ids(PROMPT, raw=False)
    text, tokens, stats = direct(reference, ids, 12)
    assert body["object"] == "chat.completion"
    assert body["model"] == "tiny-host"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": text}
    assert body["choices"][0]["finish_reason"] == ("stop" if stats.stop_reason == "eos" else "length")
    assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": len(tokens),
                             "total_tokens": len(ids) + len(tokens), "prompt_tokens_details": {"cached_tokens": 0}}


def test_streamed_chat_equals_the_whole_answer(served):
    request = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 12,
               "stream_options": {"include_usage": True}}
    _, whole = served.post("/chat/completions", request)  # the route without /v1 too
    events = served.stream("/v1/chat/completions", request)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-3])
    assert text == whole["choices"][0]["message"]["content"]
    assert events[-3]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert events[-2]["choices"] == []
    prompt_tokens = whole["usage"]["prompt_tokens"]
    # The same prompt again: all of it but the last token comes from the first answer's KV cache.
    assert events[-2]["usage"] == {**whole["usage"], "prompt_tokens_details": {"cached_tokens": prompt_tokens - 1}}
    assert len({e["id"] for e in events[:-1]}) == 1


def test_a_chat_s_next_turn_reuses_the_cache_and_answers_as_a_fresh_prefill(served, reference):
    """Turn two sends turn one's messages and answer again: their tokens come from the KV cache
    (usage.prompt_tokens_details.cached_tokens), and the answer equals generate() on an empty cache."""
    first = [{"role": "user", "content": PROMPT}]
    _, body = served.post("/v1/chat/completions", {"messages": first, "max_tokens": 8})
    turn = first + [body["choices"][0]["message"], {"role": "user", "content": "And then?"}]
    _, second = served.post("/v1/chat/completions", {"messages": turn, "max_tokens": 8})
    tokenizer = reference.tokenizer
    ids = tokenizer.encode(tokenizer.render_chat(turn), add_special_tokens=False)
    text, tokens, _ = direct(reference, ids, 8)
    assert second["choices"][0]["message"]["content"] == text
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert body["usage"]["prompt_tokens"] - 1 <= cached < len(ids)  # at least turn one's prompt
    _, fresh = served.post("/v1/chat/completions", {"messages": turn, "max_tokens": 8, "cache_prompt": False})
    assert fresh["choices"][0]["message"]["content"] == text
    assert fresh["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


@pytest.mark.parametrize("cache_ram_mib", [256, 0])
def test_a_request_between_two_turns_costs_the_chat_its_cache_only_without_cache_ram(runtime, cache_ram_mib):
    """As Open WebUI asks for a title between a chat's turns: the chat's next turn gets its cache back
    from host memory (--cache-ram), or, with none, keeps only what it shares with the title request."""
    server = Served(runtime, ServeDefaults(max_tokens=8, cache_ram_mib=cache_ram_mib))
    try:
        chat = [{"role": "user", "content": " ".join(["tell me about the quick brown fox"] * 8)}]
        _, first = server.post("/v1/chat/completions", {"messages": chat})
        title = [{"role": "user", "content": "Give this chat a title of three words."}]
        server.post("/v1/chat/completions", {"messages": title})
        turn = chat + [first["choices"][0]["message"], {"role": "user", "content": "And then?"}]
        _, second = server.post("/v1/chat/completions", {"messages": turn})
        cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        if cache_ram_mib:
            assert cached >= first["usage"]["prompt_tokens"]
        else:
            assert cached < first["usage"]["prompt_tokens"] // 2  # the chat template's start, shared with the title
    finally:
        server.close()


def test_prompt_cache_off_prefills_every_prompt(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=4, prompt_cache=False))
    try:
        for _ in range(2):
            _, body = server.post("/v1/completions", {"prompt": PROMPT})
            assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        status, body = server.post("/v1/completions", {"prompt": PROMPT, "cache_prompt": "yes"})
        assert (status, body["error"]["param"]) == (400, "cache_prompt")
    finally:
        server.close()


def test_text_completion_feeds_the_prompt_raw(served, reference):
    status, body = served.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 10})
    assert status == 200, body
    text, tokens, _ = direct(reference, reference.tokenizer.prompt_ids(PROMPT, raw=True), 10)
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == text
    assert body["usage"]["completion_tokens"] == len(tokens)
    events = served.stream("/v1/completions", {"prompt": PROMPT, "max_tokens": 10})
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == text


def test_stop_string_cuts_the_answer_in_both_forms(served, reference):
    text, _, _ = direct(reference, reference.tokenizer.prompt_ids(PROMPT, raw=True), 16)
    assert len(text) >= 6, f"the tiny model's answer is too short to cut: {text!r}"
    stop = text[3:6]
    cut = text[: text.find(stop)]
    status, body = served.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 16, "stop": [stop]})
    assert status == 200
    assert body["choices"][0] == {"index": 0, "text": cut, "logprobs": None, "finish_reason": "stop"}
    events = served.stream("/v1/completions", {"prompt": PROMPT, "max_tokens": 16, "stop": stop})
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == cut
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


def test_defaults_fill_in_what_a_request_leaves_out(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=3))
    try:
        _, body = server.post("/v1/completions", {"prompt": PROMPT})
        assert body["usage"]["completion_tokens"] <= 3
        _, longer = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 8})
        assert longer["usage"]["completion_tokens"] > body["usage"]["completion_tokens"] or \
            longer["choices"][0]["finish_reason"] == "stop"
    finally:
        server.close()


@pytest.mark.parametrize(("method", "path", "body", "status", "code"), [
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 3}, 400,
     "unsupported_parameter"),
    ("POST", "/v1/audio/speech", {"input": "hi"}, 404, "not_found"),
    ("GET", "/v2/anything", None, 404, "not_found"),
    ("POST", "/v1/completions", {"prompt": "word " * 400}, 400, "context_length_exceeded"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "\udc80"}]}, 400, "not_utf8"),
])
def test_errors_have_openai_s_shape(served, method, path, body, status, code):
    got, _, payload = served.request(method, path, body)
    error = json.loads(payload)["error"]
    assert got == status, payload
    assert error["code"] == code
    assert error["message"]
    assert error["type"]


def test_body_that_is_not_json_or_too_large_is_refused(served):
    status, _, payload = served.request("POST", "/v1/completions", raw=b"{not json")
    assert status == 400
    assert "not JSON" in json.loads(payload)["error"]["message"]
    # Refused on its headers, before a byte of the body is read; the connection then closes.
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as client:
        client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n")
        reply = b""
        while chunk := client.recv(4096):
            reply += chunk
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert b"Connection: close" in head
    assert "2,000,000 bytes" in json.loads(payload)["error"]["message"]


def test_keep_alive_connection_carries_requests_after_an_error(served):
    """A refused request's body is read (or the connection closed), so the next request on the same
    connection is parsed from its own first byte."""
    connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
    for body, status in (({"prompt": "x", "n": 2}, 400), ({"prompt": PROMPT, "max_tokens": 2}, 200)):
        connection.request("POST", "/v1/completions", body=json.dumps(body))
        response = connection.getresponse()
        response.read()
        assert response.status == status
    connection.request("POST", "/v1/nothing", body=json.dumps({"prompt": "x"}))
    response = connection.getresponse()
    response.read()
    assert response.status == 404
    assert response.getheader("Connection") == "close"
    connection.close()


def test_api_key_guards_the_v1_routes_but_not_health(runtime):
    """The key guards every route but /health, / and the model list (llama-server's get_public_endpoints)."""
    server = Served(runtime, api_key="s3cret")
    try:
        assert server.request("GET", "/health")[0] == 200
        status, headers, payload = server.request("GET", "/v1/models/tiny-host")
        assert status == 401
        assert headers["WWW-Authenticate"] == "Bearer"
        assert json.loads(payload)["error"]["code"] == "invalid_api_key"
        assert server.request("GET", "/v1/models/tiny-host", headers={"Authorization": "Bearer wrong"})[0] == 401
        status, _, payload = server.request("GET", "/v1/models/tiny-host", headers={"Authorization": "Bearer s3cret"})
        assert status == 200
        assert json.loads(payload)["id"] == "tiny-host"
    finally:
        server.close()


def test_health_and_models(served):
    status, _, payload = served.request("GET", "/health")
    assert status == 200
    assert json.loads(payload) == {"status": "ok", "model": "tiny-host",
                                   "bundle_id": served.completer.runtime.bundle.bundle_id, "backend": "ort-cpu",
                                   "busy": False}
    status, _, payload = served.request("GET", "/v1/models/tiny-host")
    assert status == 200
    assert json.loads(payload)["object"] == "model"


class HeldHook:
    """A StepHook that holds the first request's prefill until released, and counts steps."""

    def __init__(self):
        self.entered, self.release = threading.Event(), threading.Event()
        self.steps, self.ends = 0, []

    def begin(self, prompt_tokens, max_new_tokens):
        pass

    def before_step(self, kind):
        self.entered.set()
        self.release.wait(60)
        return 0.0

    def after_step(self, kind, tokens, compute_s):
        self.steps += 1

    def end(self, stats):
        self.ends.append(stats)


def test_requests_past_the_queue_get_503_and_the_server_goes_on(runtime):
    hook = HeldHook()
    server = Served(runtime, ServeDefaults(max_tokens=4, max_waiting=0), hook=hook)
    try:
        results = {}
        first = threading.Thread(target=lambda: results.update(first=server.post(
            "/v1/completions", {"prompt": PROMPT})))
        first.start()
        assert hook.entered.wait(30)
        status, body = server.post("/v1/completions", {"prompt": PROMPT})
        assert status == 503
        assert body["error"]["code"] == "server_busy"
        assert json.loads(server.request("GET", "/health")[2])["busy"] is True
        hook.release.set()
        first.join(60)
        assert results["first"][0] == 200
        assert server.post("/v1/completions", {"prompt": PROMPT})[0] == 200
    finally:
        hook.release.set()
        server.close()


def test_client_that_leaves_mid_stream_stops_the_generation(runtime, reference):
    hook = HeldHook()
    hook.release.set()
    server = Served(runtime, ServeDefaults(max_tokens=200), hook=hook)
    try:
        ids = runtime.tokenizer.prompt_ids(PROMPT, raw=True)
        _, tokens, stats = direct(reference, ids, 200)
        assert stats.stop_reason == "max_new_tokens", "the tiny model must run to max_tokens for this check"
        client = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        body = json.dumps({"prompt": PROMPT, "max_tokens": 200, "stream": True}).encode()
        client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        received = b""
        while b"data: " not in received:  # the headers, then the first text event
            chunk = client.recv(4096)
            assert chunk, "the server closed the stream before its first event"
            received += chunk
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # reset on close
        client.close()
        deadline = time.monotonic() + 30
        while not hook.ends and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hook.ends == [None]  # the answer ended early, through the hook's end of request
        assert hook.steps < 200
        assert not server.completer.busy
        assert server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 2})[0] == 200
    finally:
        server.close()


# ------------------------------------------------------------------------------------ the command


def test_serve_command_answers_and_guards_on_a_simulated_board(tiny_bundle, tmp_path):
    """``edgesdk serve`` in its own process: a simulated, guarded board with telemetry, an answer,
    the guard's level at /health, and a clean stop on SIGTERM (the telemetry file closed)."""
    telemetry = tmp_path / "steps.jsonl"
    process = subprocess.Popen(
        [sys.executable, "-m", "edgesdk.cli", "serve", str(tiny_bundle.path), "--port", "0", "--quiet",
         "--simulate-thermal", "--telemetry", str(telemetry), "--threads", "1"],
        stderr=subprocess.PIPE, text=True, cwd=tmp_path, env={**os.environ, "EDGESDK_HUGE_PAGES": "0"})
    try:
        url = None
        for line in process.stderr:
            if " on http://" in line:
                url = line.split(" on ", 1)[1].split("/v1", 1)[0]
                break
        assert url, "the server never said where it listens"
        host, port = url[len("http://"):].rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        connection.request("POST", "/v1/chat/completions", body=json.dumps(
            {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 5}))
        answer = json.loads(connection.getresponse().read())
        connection.request("GET", "/health")
        health = json.loads(connection.getresponse().read())
        connection.close()
        assert answer["choices"][0]["finish_reason"] in ("stop", "length")
        assert health["thermal"]["level"] == "normal"
        assert health["thermal"]["temperature_c"] is not None
    finally:
        process.send_signal(signal.SIGTERM)
        rest = process.communicate(timeout=60)[1]
    assert process.returncode == 128 + signal.SIGTERM, rest
    assert "Traceback" not in rest, rest
    records = [json.loads(line) for line in Path(telemetry).read_text().splitlines()]
    assert any(record.get("kind") == "decode" for record in records)


def test_serve_refuses_a_port_in_use(tiny_bundle, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "edgesdk.cli", "serve", str(tiny_bundle.path), "--port",
                               str(port)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "--port" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("key", ["line\nqwzx", "nul\x00vbnq", "bell\x07jkpf"])
def test_serve_refuses_a_key_no_header_can_carry(tiny_bundle, key):
    from click.testing import CliRunner

    from edgesdk.cli import main

    result = CliRunner().invoke(main, ["serve", str(tiny_bundle.path), "--port", "0", "--api-key", f"ok,{key}"])
    assert result.exit_code == 2
    assert "key 2 of 2 holds the control character" in result.output
    assert "no HTTP header can carry" in result.output
    assert key[-4:] not in result.output  # the key is not shown


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("GET", "/v1/chat/completions", "POST"),
    ("POST", "/v1/models", "GET, HEAD"),
    ("POST", "/health", "GET, HEAD"),
])
def test_a_route_asked_with_another_method_is_405_with_allow(served, method, path, allow):
    status, headers, payload = served.request(method, path, {"x": 1} if method == "POST" else None)
    assert status == 405, payload
    assert headers["Allow"] == allow
    assert json.loads(payload)["error"]["code"] == "method_not_allowed"
