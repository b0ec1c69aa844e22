"""The pool area's review (serve/http_server.py, serve/model_pool.py, serve/metrics.py, serve/reasoning.py,
serve/line_limits.py): real bundles of tiny models, real servers over HTTP."""

from __future__ import annotations

import socket

import pytest

from tests.unit.test_serve_models42 import Server, build_named_lively
from tests.unit.test_serve_review import CountingHook, post_bytes

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return build_named_lively(tmp_path_factory.mktemp("lively"), 1).path


@pytest.fixture(scope="module")
def alone(bundle):
    server = Server([bundle])
    yield server
    server.close()


def exchange(port: int, request: bytes, answers: int) -> list[bytes]:
    """``request`` sent on one connection, and the heads of the ``answers`` it gets, each read to the end of its
    body (its Content-Length): what a client that keeps its connection reads."""
    client = socket.create_connection(("127.0.0.1", port), timeout=10)
    heads, buffered = [], b""
    try:
        client.sendall(request)
        for _ in range(answers):
            while b"\r\n\r\n" not in buffered:
                chunk = client.recv(65536)
                assert chunk, f"the connection closed after {len(heads)} answers"
                buffered += chunk
            head, _, buffered = buffered.partition(b"\r\n\r\n")
            length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:")))
            while len(buffered) < length:
                buffered += client.recv(65536)
            heads.append(head)
            buffered = buffered[length:]
    finally:
        client.close()
    return heads


def fields(head: bytes) -> dict[str, str]:
    return {name.strip().lower(): value.strip() for name, _, value in
            (line.decode().partition(":") for line in head.split(b"\r\n")[1:])}


@pytest.mark.parametrize("method", ["GET", "OPTIONS"])
def test_an_http_1_0_keep_alive_request_is_answered_keep_alive(alone, method):
    """An HTTP/1.0 client asking to keep its connection (``Connection: Keep-Alive``: ApacheBench's ``ab -k``, HTTP/1.0
    load balancers) takes it for kept only where the answer carries the token back (RFC 2068 §19.7.1; RFC 9112
    Appendix C.2.2); the server kept the connection open but said nothing, so such a client waited for a close that
    came at the client timeout (60 s), on every request. llama-server (cpp-httplib) and nginx answer
    ``Connection: keep-alive``."""
    request = f"{method} /health HTTP/1.0\r\nHost: x\r\nConnection: Keep-Alive\r\n\r\n".encode()
    heads = exchange(alone.port, request * 2, answers=2)  # the connection is kept: a second request on it
    for head in heads:
        assert head.startswith(b"HTTP/1.1 200 "), head
        assert fields(head).get("connection", "").lower() == "keep-alive", head


def test_an_http_1_0_request_without_keep_alive_is_answered_close(alone):
    """Without the token an HTTP/1.0 connection ends after its answer, which says so."""
    head, = exchange(alone.port, b"GET /health HTTP/1.0\r\nHost: x\r\n\r\n", answers=1)
    assert fields(head)["connection"] == "close"


def test_an_http_1_1_answer_names_no_connection_option(alone):
    """HTTP/1.1 keeps a connection by default: its answers carry no Connection field, as before."""
    heads = exchange(alone.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 2, answers=2)
    assert all("connection" not in fields(head) for head in heads)


def test_slots_fail_on_no_slot_is_llama_server_s_unavailable_error(bundle):
    """``GET /slots?fail_on_no_slot=1`` while the slot answers: llama-server's 503 is typed ``unavailable_error``
    (server-context.cpp: ``format_error_response("no slot available", ERROR_TYPE_UNAVAILABLE)``), what a balancer
    probing for a free slot tells from a fault; it was typed ``server_error``, a server fault's type."""
    hook = CountingHook(hold_at=1)
    server = Server([bundle], hook=hook)
    client = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    try:
        assert server.get("/slots?fail_on_no_slot=1")[0] == 200  # idle: the slots
        client.sendall(post_bytes({"prompt": "Once", "max_tokens": 2}))
        assert hook.held.wait(30)
        status, body = server.get("/slots?fail_on_no_slot=1")
        assert status == 503, body
        assert (body["error"]["type"], body["error"]["code"]) == ("unavailable_error", "no_slot_available")
        assert body["error"]["message"].startswith("no slot available")
        hook.release.set()
        assert client.recv(4096).startswith(b"HTTP/1.1 200")
    finally:
        hook.release.set()
        client.close()
        server.close()


@pytest.mark.parametrize("route", ["/completion", "/infill"])
@pytest.mark.parametrize("body", ["Once", 5, ["Once"]], ids=["string", "number", "array"])
def test_a_body_that_is_no_json_object_is_a_400_on_llama_server_s_routes(alone, route, body):
    """``POST /completion`` and ``/infill`` read ``response_fields`` off the body before its parser ran, so a body
    that is JSON but no object (a string, a number, an array) failed there: a 500 "internal error: AttributeError"
    with a traceback in the log. It is the parser's 400, as on every other route."""
    status, answer = alone.post(route, body)
    assert status == 400, answer
    kind = {str: "a string", int: "a number", list: "an array"}[type(body)]  # JSON's words, not Python's
    assert answer["error"]["message"] == f"the request body must be a JSON object, got {kind}"
    assert alone.post("/v1/completions", body) == (status, answer)  # as OpenAI's text route refuses it
