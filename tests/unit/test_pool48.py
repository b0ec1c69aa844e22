"""The pool area's review (serve/http_server.py with several bundles, serve/model_pool.py, serve/metrics.py,
serve/reasoning.py, serve/line_limits.py): real bundles of two tiny models, real servers over HTTP."""

from __future__ import annotations

import functools
import json
import socket

import pytest

from tests.unit.test_serve_models42 import CHAT, TOKENS, A, B, Server, build_named_lively

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    return [build_named_lively(tmp_path_factory.mktemp(f"lively{seed}"), seed).path for seed in (1, 2)]


@pytest.fixture(scope="module")
def several(bundles):
    server = Server(bundles)
    yield server
    server.close()


@pytest.fixture(scope="module")
def alone(bundles):
    """The second bundle served alone: the refusals a body gets from that model itself."""
    server = Server(bundles[1:])
    yield server
    server.close()


# A body per route that names the idle model and that the route refuses whole (a 4xx, or /infill's 501 for a model
# without fill-in-the-middle tokens): none of them may load that model
REFUSED = [
    ("/v1/completions", {"model": B, "prompt": "Once", "temperature": "hot"}),
    ("/v1/completions", {"model": B, "prompt": ["Once", "Upon"], "max_tokens": -5}),
    ("/completion", {"model": B, "prompt": "Once", "temperature": "hot"}),
    ("/completion", {"model": B, "prompt": "Once", "response_fields": 5}),
    ("/infill", {"model": B, "input_prefix": "def f(", "input_suffix": ")", "temperature": "hot"}),
    ("/v1/embeddings", {"model": B, "input": 5.5}),
    ("/v1/embeddings", {"model": B, "input": "Once", "dimensions": 0}),
    ("/embedding", {"model": B}),
    ("/embeddings", {"model": B, "content": "Once", "embd_normalize": "two"}),
    ("/v1/responses", {"model": B, "input": "Once", "temperature": "hot"}),
    ("/v1/responses", {"model": B, "input": 5}),
]


@pytest.mark.parametrize(("route", "body"), REFUSED, ids=[f"{route} {sorted(body)}" for route, body in REFUSED])
def test_a_request_refused_whole_swaps_no_model_in(several, alone, route, body):
    """A body refused before anything is generated costs no swap: the loaded model (another client's, with its
    conversations' caches) stays, as Ollama's handlers check a request before scheduleRunner loads its model
    (server/routes.go) and as the chat routes here already do."""
    status, answer = several.post("/v1/chat/completions", {"model": A, "messages": CHAT, "max_tokens": TOKENS})
    assert status == 200, answer
    assert several.pool.loaded[0] == A
    status, answer = several.post(route, body)
    assert status in (400, 501), (status, answer)
    assert several.pool.loaded[0] == A, (status, answer)
    assert alone.post(route, body) == (status, answer)  # the refusal the model itself gives
    status, answer = several.post(route, {**body, "model": "lively3-host"})
    assert status == 404, answer  # a name not served is refused first, as before


def test_an_accepted_request_still_swaps_its_model_in(several):
    """The checks made against the model's description, not the model, still let a good request load it."""
    for route, body in [("/v1/completions", {"model": B, "prompt": "Once", "max_tokens": TOKENS}),
                        ("/completion", {"model": A, "prompt": "Once", "n_predict": TOKENS}),
                        ("/v1/embeddings", {"model": B, "input": "Once"}),
                        ("/embedding", {"model": A, "content": "Once"}),
                        ("/v1/responses", {"model": B, "input": "Once", "max_output_tokens": TOKENS})]:
        status, answer = several.post(route, body)
        assert status == 200, (route, answer)
        assert several.pool.loaded[0] == body["model"], route


LONG = " ".join(["The quick brown fox jumps over the lazy dog."] * 40)  # past the tiny bundles' 128-token context


@pytest.mark.parametrize(("route", "body"), [
    ("/v1/chat/completions", {"model": B, "messages": [{"role": "user", "content": LONG}]}),
    ("/v1/completions", {"model": B, "prompt": LONG}),
    ("/v1/messages", {"model": B, "max_tokens": TOKENS, "messages": [{"role": "user", "content": LONG}]}),
    ("/v1/responses", {"model": B, "input": LONG}),
    ("/completion", {"model": B, "prompt": LONG}),
], ids=["chat", "completions", "messages", "responses", "completion"])
def test_a_prompt_past_the_context_swaps_no_model_in(several, alone, route, body):
    """A prompt longer than the named model's context is refused (llama-server's exceed_context_size_error) from its
    tokens, which the model's tokenizer counts without the model: the loaded one stays, and the refusal is the one
    the model itself gives (the same body served by its bundle alone)."""
    status, answer = several.post("/v1/chat/completions", {"model": A, "messages": CHAT, "max_tokens": TOKENS})
    assert status == 200, answer
    status, answer = several.post(route, body)
    assert status == 400, answer
    assert "maximum context length is 128 tokens" in str(answer), answer
    assert several.pool.loaded[0] == A, answer
    assert alone.post(route, body) == (status, answer)


BODY = json.dumps({"prompt": "x" * 1_000_000}).encode()  # a body past what the socket buffers hold
MANY_FIELDS = b"".join(b"X-Field-%d: v\r\n" % number for number in range(120))
HEADS = {
    "too many header fields": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n"
                               % (len(BODY), MANY_FIELDS), 431, "more than 100 header fields"),
    "a header line too long": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Long: %s\r\nContent-Length: %d\r\n\r\n"
                               % (b"a" * 70_000, len(BODY)), 431, "header line is longer than 65,536 bytes"),
    "a request line too long": (b"POST /v1/completions?%s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                                % (b"a" * 70_000, len(BODY)), 414, "request line is longer than 65,536 bytes"),
}


@pytest.mark.parametrize("case", list(HEADS))
def test_a_head_refused_unread_lets_its_client_send_the_body_and_read_the_refusal(alone, case, monkeypatch):
    """A head refused before its fields were read (the standard library's 414 and 431) left the body unread at the
    close: the kernel reset the connection, so a client still writing its body failed with a broken pipe or a reset
    and never read the refusal. It is now read and dropped, as after a 413 (RFC 9112 §9.6), and the refusal names
    the limit."""
    from edgesdk.serve import http_server

    # the server (a thread of this process) drains for LINGER_S (5 s) from its answer; this client sends its body
    # only after reading that answer, which a loaded CI machine could delay past 5 s: a longer window, same check
    monkeypatch.setattr(http_server, "linger", functools.partial(http_server.linger, seconds=60.0))
    head, status, said = HEADS[case]
    client = socket.create_connection(("127.0.0.1", alone.port), timeout=30)
    try:
        client.sendall(head)
        received = b""
        while chunk := client.recv(65536):  # the answer, then the server's end of its side
            received += chunk
        client.sendall(BODY)  # a client that writes its whole body before it reads (or after, as here)
    finally:
        client.close()
    start, _, payload = received.partition(b"\r\n\r\n")
    assert start.startswith(b"HTTP/1.1 %d " % status), start
    assert said in json.loads(payload)["error"]["message"]
