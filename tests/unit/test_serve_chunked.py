"""``edgesdk serve`` reads chunked request bodies (RFC 9112 §7.1), as llama-server does: clients that
stream a body of unknown length (``requests`` with a generator, fetch with a stream) send it so. Real
server on the tiny bundle, real sockets."""

from __future__ import annotations

import json
import socket

import pytest

from edgesdk.serve.http_server import MAX_BODY_BYTES

BODY = json.dumps({"prompt": "The quick brown fox", "max_tokens": 3, "temperature": 0}).encode()


def exchange(port: int, data: bytes, answers: int = 1, end: bool = False) -> list[tuple[bytes, dict]]:
    """Send ``data`` on one connection and read ``answers`` answers, or as many as come before the
    server closes it. The write side stays open unless ``end`` (the server drops a request whose client
    left); a body cut short needs ``end``, or the server waits for the rest."""
    replies, reply = [], b""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as client:
        client.sendall(data)
        if end:
            client.shutdown(socket.SHUT_WR)
        while len(replies) < answers:
            head, _, rest = reply.partition(b"\r\n\r\n")
            lengths = [line.split(b":", 1)[1] for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length")]
            if lengths and len(rest) >= int(lengths[0]):
                replies.append((head, json.loads(rest[:int(lengths[0])])))
                reply = rest[int(lengths[0]):]
                continue
            chunk = client.recv(65536)
            if not chunk:
                break
            reply += chunk
    return replies


def chunked(body: bytes, sizes: list[int], extension: bytes = b"", trailer: bytes = b"") -> bytes:
    out, start = b"", 0
    for size in sizes:
        out += b"%x%s\r\n%s\r\n" % (size, extension, body[start:start + size])
        start += size
    assert start == len(body)
    return out + b"0\r\n" + trailer + b"\r\n"


def request(framed: bytes, headers: bytes = b"Transfer-Encoding: chunked\r\n") -> bytes:
    return b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n" + framed


def test_a_chunked_body_gets_the_answer_its_plain_twin_gets_and_the_connection_goes_on(served):
    plain = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
    framed = chunked(BODY, [1, 17, len(BODY) - 18], extension=b";name=value", trailer=b"X-Checksum: none\r\n")
    framed = framed.replace(b"\r\n", b"\n", 2)  # a bare LF ends a line too (RFC 9112 §2.2)
    answers = exchange(served.port, request(framed) + plain, 2)
    assert [head.split(b"\r\n")[0] for head, _ in answers] == [b"HTTP/1.1 200 OK"] * 2
    assert answers[0][1]["choices"][0]["text"] == answers[1][1]["choices"][0]["text"]
    assert answers[0][1]["usage"]["prompt_tokens"] == answers[1][1]["usage"]["prompt_tokens"]
    assert answers[1][1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the same prompt, kept


@pytest.mark.parametrize(("framed", "expected"), [
    (b"zz\r\n{}\r\n0\r\n\r\n", "not hexadecimal"),
    (b"10\r\n{}", "ended inside a chunk"),
    (b"2\r\n{}}\r\n0\r\n\r\n", "longer than its size"),
    (b"2\r\n{}\r\n", "ended after 2 bytes"),
])
def test_a_broken_chunked_body_is_refused_and_the_connection_closed(served, framed, expected):
    (head, payload), = exchange(served.port, request(framed), end=True)
    assert head.startswith(b"HTTP/1.1 400")
    assert b"Connection: close" in head
    assert expected in payload["error"]["message"]
    assert "RFC 9112" in payload["error"]["message"]


def test_a_chunked_body_past_the_limit_and_other_codings_are_refused(served):
    (head, payload), = exchange(served.port, request(b"%x\r\n" % (MAX_BODY_BYTES + 1)))
    assert head.startswith(b"HTTP/1.1 413")
    assert f"{MAX_BODY_BYTES:,}" in payload["error"]["message"]
    (head, payload), = exchange(served.port, request(chunked(BODY, [len(BODY)]),
                                                     b"Transfer-Encoding: gzip, chunked\r\n"))
    assert head.startswith(b"HTTP/1.1 501")
    assert "'gzip, chunked'" in payload["error"]["message"]


def test_transfer_encoding_beside_a_content_length_wins_and_closes_the_connection(served):
    """RFC 9112 §6.1: the body is read as chunked, and the connection closes after the answer."""
    plain = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
    framed = chunked(BODY, [len(BODY)])
    answers = exchange(served.port, request(framed, b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n") + plain,
                       2)
    assert len(answers) == 1
    head, payload = answers[0]
    assert head.startswith(b"HTTP/1.1 200")
    assert b"Connection: close" in head
    assert payload["choices"][0]["text"]
