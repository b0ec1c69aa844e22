"""The HTTP server (edgesdk/serve/http_server.py) where a request's framing that HTTP/1.1 lets a client send was not
read as RFC 9112 reads it: an empty line before a request line (a POST body ended with an extra CRLF, a request after
it on the connection) closed the connection without an answer, and ``Content-Length: 33, 33`` (two equal lengths a
proxy joined into one field) was a 400 where the two fields were read as one length."""

from __future__ import annotations

import json
import re
import socket

import pytest

from tests.unit.test_serve_review import read_until_closed

HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
LAST_HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
BODY = json.dumps({"prompt": "hi", "max_tokens": 1}).encode()


def _statuses(served, request: bytes) -> list[bytes]:
    """The status lines of the answers to ``request``, sent raw on one connection, until the server closes it."""
    client = socket.create_connection(("127.0.0.1", served.port), timeout=30)
    client.sendall(request)
    received = read_until_closed(client)
    client.close()
    return re.findall(rb"HTTP/1\.1 \d{3} [^\r]*", received)


@pytest.mark.parametrize("empty", [b"\r\n", b"\n", b"\r\n\r\n"])
def test_an_empty_line_before_a_request_line_is_skipped(served, empty):
    assert _statuses(served, empty + LAST_HEALTH) == [b"HTTP/1.1 200 OK"]


def test_a_post_body_ended_with_an_extra_crlf_leaves_the_connection_to_the_next_request(served):
    request = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s\r\n" % (len(BODY), BODY)
    assert _statuses(served, request + HEALTH + b"\r\n" + LAST_HEALTH) == [b"HTTP/1.1 200 OK"] * 3


def test_a_request_line_past_its_limit_after_an_empty_line_is_still_the_414(served):
    assert _statuses(served, b"\r\nGET /" + b"a" * 70000 + b" HTTP/1.1\r\nHost: x\r\n\r\n") == \
        [b"HTTP/1.1 414 Request-URI Too Long"]


def test_empty_lines_and_then_the_end_of_the_connection_are_no_request(served):
    client = socket.create_connection(("127.0.0.1", served.port), timeout=30)
    client.sendall(b"\r\n\r\n")
    client.shutdown(socket.SHUT_WR)
    assert read_until_closed(client) == b""
    client.close()


@pytest.mark.parametrize("lengths", ["{n}, {n}", "{n},{n}", "{n},"])
def test_a_content_length_listing_one_length_is_that_length(served, lengths):
    length = lengths.format(n=len(BODY)).encode()
    request = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %s\r\n\r\n%s" % (length, BODY)
    assert _statuses(served, request + LAST_HEALTH) == [b"HTTP/1.1 200 OK"] * 2


@pytest.mark.parametrize("lengths", ["{n}, {m}", ",", ""])
def test_a_content_length_listing_lengths_that_differ_or_none_is_still_a_400(served, lengths):
    length = lengths.format(n=len(BODY), m=len(BODY) + len(HEALTH)).encode()
    request = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %s\r\n\r\n%s" % (length, BODY)
    assert _statuses(served, request + HEALTH) == [b"HTTP/1.1 400 Bad Request"]


def test_a_get_with_a_zero_content_length_listed_twice_keeps_its_connection(served):
    request = b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 0, 0\r\n\r\n"
    assert _statuses(served, request + LAST_HEALTH) == [b"HTTP/1.1 200 OK"] * 2


def test_a_request_line_s_control_characters_are_escaped_in_the_request_log(runtime, capfd):
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_serve import Served

    served = Served(runtime, ServeDefaults(max_tokens=1))
    served.server.log = True
    try:
        capfd.readouterr()
        # a terminal's escape sequences: clear the screen, set the window's title (ended by BEL)
        assert _statuses(served, b"GET /\x1b[2J\x1b]0;title\x07\\ HTTP/1.1\r\nConnection: close\r\n\r\n") == \
            [b"HTTP/1.1 404 Not Found"]
    finally:
        served.close()
    log = capfd.readouterr().err
    assert "\x1b" not in log, log
    assert "\x07" not in log, log
    assert '"GET /\\x1b[2J\\x1b]0;title\\x07\\\\ HTTP/1.1" 404' in log, log
