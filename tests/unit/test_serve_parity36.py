"""``edgesdk serve`` against llama-server: a request that trickles in, ``seed`` -1, text parts of a message and the
prompt ``POST /completion`` gives back. Real server on the tiny bundle, real sockets."""

from __future__ import annotations

import json
import select
import socket
import threading
import time

import pytest

from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.http_server import MAX_BODY_BYTES, ApiServer
from tests.unit.test_serve_chunked import chunked, exchange, request

PROMPT = "The quick brown fox"


@pytest.fixture
def deadline_server(runtime):
    """A server whose requests must come whole within 1 s of their first byte, each read waiting up to 20 s."""
    completer = Completer(runtime, ServeDefaults(max_tokens=2))
    server = ApiServer(("127.0.0.1", 0), completer, "tiny-host", log=False, client_timeout_s=20.0,
                       request_timeout_s=1.0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def trickle(port: int, head: bytes, slow: bytes, gap_s: float = 0.1) -> tuple[bytes, int]:
    """Send ``head`` at once, then ``slow`` a byte every ``gap_s`` s, reading until the server closes the connection;
    (what the server sent, how many of ``slow``'s bytes went out before it answered or closed)."""
    received, sent = b"", 0
    with socket.create_connection(("127.0.0.1", port), timeout=60) as client:
        client.sendall(head)
        while True:
            if select.select([client], [], [], gap_s)[0]:
                try:
                    chunk = client.recv(65536)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                received += chunk
                continue
            if sent == len(slow):
                continue  # all sent: wait for the answer
            try:
                client.sendall(slow[sent:sent + 1])
            except OSError:  # closed by the server: a reset
                break
            sent += 1
    return received, sent


def test_a_body_sent_a_byte_at_a_time_gets_a_408_at_the_request_deadline(deadline_server):
    """Each byte came within the per-read timeout, so the body never met the 408 and the server waited for a
    slowloris client for as long as it kept sending; the whole request now has a deadline from its first byte."""
    body = json.dumps({"prompt": PROMPT, "max_tokens": 1, "padding": "x" * 200}).encode()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    received, sent = trickle(deadline_server.server_address[1], head, body)
    assert sent < len(body), received  # cut off before the body was whole
    answer, _, payload = received.partition(b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 408"), received
    assert b"Connection: close" in answer
    message = json.loads(payload)["error"]["message"]
    assert "had not all come 1 s after its first byte" in message
    assert "send the whole request at once" in message


def test_a_chunked_body_sent_a_byte_at_a_time_gets_the_408_too(deadline_server):
    body = json.dumps({"prompt": PROMPT, "max_tokens": 1, "padding": "x" * 200}).encode()
    framed = chunked(body, [1] * len(body))
    received, sent = trickle(deadline_server.server_address[1], request(b""), framed)
    assert sent < len(framed), received
    assert received.startswith(b"HTTP/1.1 408"), received


def test_a_head_sent_a_byte_at_a_time_is_let_go_at_its_deadline(runtime):
    """The head had the same gap (each header line read byte by byte, each within the per-read timeout): it must
    now come whole within the client timeout of its first byte, as nginx's client_header_timeout bounds it."""
    completer = Completer(runtime, ServeDefaults(max_tokens=2))
    server = ApiServer(("127.0.0.1", 0), completer, "tiny-host", log=False, client_timeout_s=1.0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        slow = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Padding: %s\r\n" % (b"y" * 300) + b"\r\n"
        received, sent = trickle(server.server_address[1], b"", slow, gap_s=0.05)
    finally:
        server.shutdown()
        server.server_close()
    assert sent < len(slow)
    assert received == b"", received  # closed unanswered, as a head that stalls is


def test_honest_requests_of_the_largest_size_plain_and_chunked_still_pass(served):
    """The deadline takes nothing from a body that comes at once: 1 MiB, plain and in 64 KiB chunks, and the
    connection goes on to a next request."""
    core = json.dumps({"prompt": PROMPT, "max_tokens": 2, "temperature": 0}).encode()
    body = core + b" " * (MAX_BODY_BYTES - len(core))  # JSON's whitespace after the value
    sizes = [65536] * (len(body) // 65536) + ([len(body) % 65536] if len(body) % 65536 else [])
    plain = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    answers = exchange(served.port, plain + request(chunked(body, sizes)), 2)
    assert [head.split(b"\r\n")[0] for head, _ in answers] == [b"HTTP/1.1 200 OK"] * 2
    assert answers[0][1]["choices"][0]["text"] == answers[1][1]["choices"][0]["text"]


def test_a_keep_alive_connection_idle_past_the_request_deadline_still_takes_a_request(runtime):
    """The deadline runs from a request's first byte: the wait for it (an idle keep-alive connection) is the client
    timeout's, so a client that sends its next request later than the request deadline is answered."""
    completer = Completer(runtime, ServeDefaults(max_tokens=2))
    server = ApiServer(("127.0.0.1", 0), completer, "tiny-host", log=False, client_timeout_s=30.0,
                       request_timeout_s=0.3)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=60) as client:
            for _ in range(2):
                client.sendall(health)
                received = b""
                while b"\r\n\r\n" not in received or not received.rstrip().endswith(b"}"):
                    received += client.recv(65536)
                assert received.startswith(b"HTTP/1.1 200"), received
                time.sleep(0.6)  # idle for twice the request deadline
    finally:
        server.shutdown()
        server.server_close()


def test_a_request_timeout_that_is_no_time_is_refused(runtime):
    from edgesdk.errors import EdgeSDKError

    with pytest.raises(EdgeSDKError) as caught:
        ApiServer(("127.0.0.1", 0), Completer(runtime, ServeDefaults(max_tokens=2)), "m", request_timeout_s=0)
    assert "request timeout must be a number of seconds > 0, got 0" in caught.value.problem


# ------------------------------------------------------------------------------------------------ seed -1


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}]}),
    ("/v1/completions", {"prompt": PROMPT}),
    ("/completion", {"prompt": PROMPT}),
])
def test_seed_minus_one_is_a_random_seed_on_every_route(served, path, body):
    """llama-server reads seed -1 (its LLAMA_DEFAULT_SEED, what its clients send by default) as a random seed on
    every route; the OpenAI routes refused it as a seed below 0, while POST /completion took it."""
    from edgesdk.serve.api import RANDOM_SEED, parse_chat_request, parse_text_request

    status, answer = served.post(path, {**body, "max_tokens": 2, "seed": -1})
    assert status == 200, answer
    parse = parse_chat_request if "messages" in body else parse_text_request
    assert parse({**body, "seed": -1}).seed == RANDOM_SEED  # a random seed: the sampler draws one
    assert parse({**body, "seed": -1.0}).seed == RANDOM_SEED
    assert parse({**body, "seed": 7}).seed == 7
    for wrong in (-2, True, "-1", 1.5):
        status, refused = served.post(path, {**body, "max_tokens": 2, "seed": wrong})
        assert status == 400, refused
        assert refused["error"]["param"] == "seed"
        assert "'seed' must be a whole number >= 0, or -1 for a random seed, got" in refused["error"]["message"]


# ------------------------------------------------------------------------------------------- text parts


def test_text_parts_are_joined_by_a_line_break_as_llama_cpp_joins_them(served):
    """llama.cpp gives a template that does not take typed content a message's text parts joined by "\\n", none
    before the first part that makes text (common/chat.cpp, common_chat_msgs_to_json_oaicompat); they were joined
    with nothing, so "Hello" + "there" read "Hellothere". Anthropic's turns are joined alike (llama-server passes
    their text blocks on as text parts); its system blocks and a tool result's blocks are joined as they are."""
    from edgesdk.serve.anthropic import parse_messages_request
    from edgesdk.serve.api import parse_chat_request

    def part(text: str) -> dict:
        return {"type": "text", "text": text}

    cases = [(["Hello", "there"], "Hello\nthere"), (["", "a", "", "b"], "a\n\nb"), (["a", ""], "a\n"), ([], "")]
    for texts, expected in cases:
        request = parse_chat_request({"messages": [{"role": "user", "content": [part(t) for t in texts]}]})
        assert request.messages[-1]["content"] == expected, texts
    turn = {"role": "user", "content": [part("Say"), part("something.")]}
    assert parse_messages_request({"max_tokens": 1, "messages": [turn]}).messages[-1]["content"] == "Say\nsomething."
    system = parse_messages_request({"max_tokens": 1, "system": [part("Be "), part("brief.")], "messages": [turn]})
    assert system.messages[0] == {"role": "system", "content": "Be brief."}
    # over HTTP: the prompt of the parts is the prompt of their joined text
    rendered = [served.post("/apply-template", {"messages": [{"role": "user", "content": content}]})[1]["prompt"]
                for content in ([part("Hello"), part("there")], "Hello\nthere")]
    assert rendered[0] == rendered[1]
    assert "Hello\nthere" in rendered[0]


# ------------------------------------------------------------------------------ POST /completion's prompt


@pytest.fixture(scope="module")
def bos_served(tiny_bundle):
    """A server whose tokenizer puts a BOS (``<|im_start|>``) before a text, as Llama's and Gemma's do."""
    from tokenizers.processors import TemplateProcessing

    from edgesdk.runtime.session import open_runtime
    from tests.unit.test_serve import Served

    runtime = open_runtime(tiny_bundle.path, threads=1)
    tokenizer = runtime.tokenizer.tokenizer
    bos = tokenizer.token_to_id("<|im_start|>")
    tokenizer.post_processor = TemplateProcessing(single="<|im_start|> $A", special_tokens=[("<|im_start|>", bos)])
    server = Served(runtime, ServeDefaults(max_tokens=4))
    yield server
    server.close()


def test_completion_gives_a_text_prompt_back_as_its_tokens_with_the_bos(bos_served):
    """llama-server's POST /completion "prompt" is the prompt's tokens detokenized with their special tokens
    (server.cpp: ``tokens.detokenize(ctx, true)``), a text prompt's BOS included; a text prompt came back as sent,
    while the same prompt sent as token ids came back with its BOS."""
    runtime = bos_served.completer.runtime
    ids = runtime.tokenizer.encode(PROMPT)
    assert ids[0] == runtime.tokenizer.tokenizer.token_to_id("<|im_start|>")
    status, by_text = bos_served.post("/completion", {"prompt": PROMPT, "n_predict": 2, "temperature": 0})
    assert status == 200, by_text
    assert by_text["prompt"] == "<|im_start|>" + PROMPT
    assert by_text["tokens_evaluated"] == len(ids)
    status, by_ids = bos_served.post("/completion", {"prompt": ids, "n_predict": 2, "temperature": 0})
    assert status == 200, by_ids
    assert by_ids["prompt"] == by_text["prompt"]
    assert by_ids["content"] == by_text["content"]
    streamed = bos_served.request("POST", "/completion", {"prompt": PROMPT, "n_predict": 2, "stream": True})[2]
    last = json.loads(streamed.decode().strip().split("\n\n")[-1][len("data: "):])
    assert last["stop"] is True
    assert last["prompt"] == by_text["prompt"]
