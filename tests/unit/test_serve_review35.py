"""``edgesdk serve``: chunked request bodies and the HTTP layer around them, as a client meets them over real
sockets against the tiny bundle."""

from __future__ import annotations

import pytest

from tests.unit.test_serve_chunked import BODY, chunked, exchange, request


@pytest.mark.parametrize("coding", [b"chunked, gzip", b"gzip", b"chunked, chunked", b"", b" , "])
def test_a_transfer_encoding_whose_last_coding_is_not_chunked_once_is_a_400(served, coding):
    """RFC 9112 §6.3: with chunked not the last coding of a request (or none, or chunked twice) the body's end
    cannot be found; the server MUST answer 400 and close the connection (it answered 501, a coding it lacks)."""
    (head, payload), = exchange(served.port, request(chunked(BODY, [len(BODY)]), b"Transfer-Encoding: %s\r\n" % coding))
    assert head.startswith(b"HTTP/1.1 400"), head
    assert b"Connection: close" in head
    message = payload["error"]["message"]
    assert "last coding" in message
    assert "RFC 9112 §6.3" in message
    assert "Transfer-Encoding: chunked" in message


def test_empty_transfer_encoding_list_elements_are_no_coding(served):
    """RFC 9110 §5.6.1: a recipient parses and ignores empty list elements; ', chunked' is a chunked body (it was
    refused with 501 naming the coding ', chunked')."""
    plain = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    framed = request(chunked(BODY, [len(BODY)]), b"Transfer-Encoding: , chunked\r\nTransfer-Encoding: \r\n")
    (head, payload), (_, health) = exchange(served.port, framed + plain, 2)
    assert head.startswith(b"HTTP/1.1 200"), (head, payload)
    assert payload["choices"][0]["text"]
    assert health["status"] == "ok"  # the connection goes on


def test_a_trailer_field_past_the_line_limit_is_named_as_such(served):
    """A trailer field longer than the limit was told 'ended in its trailer fields', as if the client had cut the
    body short; it is named as too long, with the limit."""
    from edgesdk.serve.http_server import CHUNK_LINE_LIMIT

    framed = chunked(BODY, [len(BODY)], trailer=b"X-Checksum: " + b"a" * CHUNK_LINE_LIMIT + b"\r\n")
    (head, payload), = exchange(served.port, request(framed))
    assert head.startswith(b"HTTP/1.1 400"), head
    assert b"Connection: close" in head
    message = payload["error"]["message"]
    assert f"has a trailer field longer than {CHUNK_LINE_LIMIT} bytes" in message
    assert "ended" not in message
    (head, payload), = exchange(served.port, request(chunked(BODY, [len(BODY)], trailer=b"X-Checksum: a")), end=True)
    assert "ended in its trailer fields" in payload["error"]["message"]  # a trailer cut short is still told so


def test_an_http_1_0_request_with_transfer_encoding_closes_its_connection(served):
    """RFC 9112 §6.1: Transfer-Encoding in an HTTP/1.0 message is taken as faulty framing, and the connection closes
    after the message is processed, keep-alive or not (it was kept open under 'Connection: keep-alive', the bytes
    after the body read as the next request)."""
    framed = chunked(BODY, [len(BODY)])
    head = b"POST /v1/completions HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n"
    answers = exchange(served.port, head + framed + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 2)
    assert len(answers) == 1, answers
    (head, payload), = answers
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"Connection: close" in head
    assert payload["choices"][0]["text"]
