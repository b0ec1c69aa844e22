"""The HTTP server (edgesdk/serve/http_server.py) where it read a request's head or a chunked body otherwise than
it should:

* a chunked body that ended (the client half-closed) right after a chunk's data, before its CRLF, was refused as
  "has a chunk longer than its size", which blamed a chunk that was not too long;
* a header line with no name before its colon (``: value``) was refused naming the line as 'Missing header name.',
  the email parser's defect text, which is no line of the request;
* a first header line ``From x`` (a name with a space, no colon) was kept aside by the email parser as a mailbox's
  envelope line and the request answered as if it were not there (RFC 9112 §5.1 has it refused);
* a field folded onto a next line (obs-fold) kept its line break in its value: a folded ``Authorization: Bearer``
  was a 401, and a folded ``Origin`` went back out in ``Access-Control-Allow-Origin`` as a folded response line
  (RFC 9112 §5.2: a server unfolds obs-fold, or rejects it, and no sender generates it);
* a ``Content-Type: message/...`` header made the parser's body a list, on which the header check failed with an
  AttributeError and the client got no answer at all; a ``multipart/form-data`` one was refused as a header line ''
  that "is not a header field"."""

from __future__ import annotations

import json
import socket

import pytest

from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served
from tests.unit.test_serve_review import read_until_closed


def _exchange(served, request: bytes, half_close: bool = False) -> tuple[bytes, bytes]:
    """The head and body of the answer to ``request`` sent raw (``half_close``: the client's sending side closed
    after it, so the server reads the end of the request)."""
    client = socket.create_connection(("127.0.0.1", served.port), timeout=30)
    client.sendall(request)
    if half_close:
        client.shutdown(socket.SHUT_WR)
    head, _, payload = read_until_closed(client).partition(b"\r\n\r\n")
    client.close()
    if head.startswith(b"HTTP/1.1 100 "):  # the interim answer to Expect: 100-continue, then the final one
        head, _, payload = payload.partition(b"\r\n\r\n")
    return head, payload


@pytest.mark.parametrize("tail", [b"5\r\nhello", b"5\r\nhello\r"])
def test_a_chunked_body_that_ends_before_a_chunk_s_crlf_is_said_to_end_there(served, tail):
    head, payload = _exchange(served, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                              + tail, half_close=True)
    assert head.startswith(b"HTTP/1.1 400"), head
    message = json.loads(payload)["error"]["message"]
    assert "ended after a chunk's data, before the CRLF that closes it" in message, message
    assert "longer than its size" not in message


def test_a_chunk_longer_than_its_size_is_still_said_to_be(served):
    head, payload = _exchange(served, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                              b"2\r\nhello\r\n0\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), head
    assert "has a chunk longer than its size" in json.loads(payload)["error"]["message"]


def test_a_header_line_with_no_name_is_refused_as_such(served):
    head, payload = _exchange(served, b"GET /health HTTP/1.1\r\nHost: x\r\n: orphan\r\nConnection: close\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), head
    message = json.loads(payload)["error"]["message"]
    assert "a request header line has no field name before its colon" in message, message
    assert "Missing header name" not in message


@pytest.mark.parametrize("before", [b"", b"Host: x\r\n"])
def test_a_from_line_with_no_colon_is_refused_naming_it(served, before):
    head, payload = _exchange(served, b"GET /health HTTP/1.1\r\n" + before + b"From x\r\nConnection: close\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), head
    message = json.loads(payload)["error"]["message"]
    assert message.startswith("the request's header line 'From x' is not a header field"), message


def test_a_folded_header_field_is_read_on_one_line_and_never_echoed_folded(served):
    head, payload = _exchange(served, b"GET /health HTTP/1.1\r\nHost: x\r\nOrigin: http://a.example\r\n"
                              b"\tSet-Cookie: x=1\r\nConnection: close\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"\r\n\t" not in head, head  # no folded line in the answer
    assert b"\r\n " not in head, head
    assert b"\r\nSet-Cookie" not in head
    assert b"Access-Control-Allow-Origin: http://a.example Set-Cookie: x=1\r\n" in head, head


@pytest.mark.parametrize("expect", [b"", b"Expect: 100-continue\r\n"])
def test_a_folded_authorization_is_read_as_its_key(runtime, expect):
    """``Authorization: Bearer`` with its key folded onto the next line was a 401: the line break stayed in the
    value, so its scheme was no 'Bearer'."""
    server = Served(runtime, ServeDefaults(max_tokens=2), api_key="sesame")
    try:
        body = b'{"content": "hi"}'
        head, payload = _exchange(server, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer\r\n"
                                  b"  sesame\r\n" + expect + b"Connection: close\r\n"
                                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        assert head.startswith(b"HTTP/1.1 200"), head + payload
        assert json.loads(payload)["tokens"]
    finally:
        server.close()


@pytest.mark.parametrize("content_type", [b"message/rfc822", b"message/http", b"multipart/form-data",
                                          b"multipart/form-data; boundary=x"])
def test_a_content_type_of_the_email_parser_s_own_kinds_is_just_a_field(served, content_type):
    head, payload = _exchange(served, b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Type: " + content_type +
                              b"\r\nConnection: close\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert json.loads(payload)["status"] == "ok"


def test_a_broken_line_after_a_message_content_type_is_still_named(served):
    head, payload = _exchange(served, b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Type: message/rfc822\r\n"
                              b"Content-Length : 5\r\nConnection: close\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), head
    assert "'Content-Length : 5' is not a header field" in json.loads(payload)["error"]["message"]
