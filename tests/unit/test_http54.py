"""The HTTP server (edgesdk/serve/http_server.py) and the model pool (edgesdk/serve/model_pool.py) where they
answered otherwise than they should:

* a ``Connection`` field listing ``close`` among other options (``Connection: TE, close``, as Perl's LWP sends it)
  left the connection open: the standard library compares the first field's whole value with ``close``, where RFC
  9110 §7.6.1 makes it a list and RFC 9112 §9.6 says the server MUST close after the answer;
* a POST with neither a Content-Length nor a Transfer-Encoding was refused with a 411 that said what was missing but
  not how to send it;
* the model pool's 503 of a full queue said "0 requests wait for their model to be loaded" when ``--max-queue 0``
  refused a request behind the one answering: it named neither what kept the server busy nor the limit."""

from __future__ import annotations

import json
import socket

import pytest

from edgesdk.serve.api import ApiError
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.model_pool import ModelPool, ServedModel


def _exchange(served, request: bytes) -> tuple[bytes, bool]:
    """What the server answers ``request`` with, and whether it closed the connection after (False: it kept it
    open past the answer, until the client gave up)."""
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=10)
    sock.sendall(request)
    received = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return received, True
            received += chunk
    except TimeoutError:
        return received, False
    finally:
        sock.close()


@pytest.mark.parametrize("connection", ["TE, close", "close, TE", "Close", "keep-alive\r\nConnection: close"])
def test_a_connection_field_listing_close_closes_the_connection_after_the_answer(served, connection):
    answer, closed = _exchange(served, f"GET /health HTTP/1.1\r\nHost: x\r\nConnection: {connection}\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 200"), answer
    head = answer.split(b"\r\n\r\n", 1)[0].decode()
    assert "Connection: close" in head.split("\r\n")
    assert closed


def test_a_connection_field_without_close_keeps_the_connection(served):
    # two requests on one connection: both answered, the second (Connection: TE, close) then closes it
    request = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: TE\r\n\r\n" \
              b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: TE, close\r\n\r\n"
    answer, closed = _exchange(served, request)
    assert answer.count(b"HTTP/1.1 200") == 2
    assert closed


def test_a_post_without_a_length_is_a_411_saying_how_to_send_it(served):
    answer, _ = _exchange(served, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 411")
    message = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["message"]
    assert "Content-Length" in message
    assert "chunked" in message


def test_the_pool_s_503_of_a_full_queue_names_what_is_busy_and_the_limit(runtime, tiny_bundle):
    completer = Completer(runtime, ServeDefaults(max_tokens=2, max_waiting=0))
    models = [ServedModel("first", tiny_bundle), ServedModel("second", tiny_bundle)]
    pool = ModelPool(models, load=lambda model: pytest.fail("nothing is loaded"), loaded=completer,
                     log=lambda line: None)
    lease = pool.acquire("first")
    try:
        with pytest.raises(ApiError) as refused:
            pool.acquire("second")
    finally:
        pool.release(lease)
    assert (refused.value.status, refused.value.code) == (503, "server_busy")
    message = refused.value.message
    assert "1 request(s) hold the model 'first'" in message
    assert "--max-queue 0" in message
    assert "wait for their model to be loaded" not in message
