"""The HTTP layer of ``edgesdk serve`` against HTTP/1.1 (RFC 9110, RFC 9112), the Fetch standard's CORS protocol and
llama-server's options. Real servers on free ports with the tiny bundle, real sockets."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from edgesdk.serve.completion import ServeDefaults
from tests._utils.serve_command import serve_command
from tests.unit.test_serve import Served


def answer_to(port: int, data: bytes) -> bytes:
    """What the server writes back to ``data`` on a fresh connection, up to its close."""
    reply = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(data)
        while chunk := client.recv(65536):
            reply += chunk
    return reply


# ------------------------------------------------------------------ a refused request line still gets a status line

@pytest.mark.parametrize(("line", "status", "words"), [
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"505", "HTTP/1.1"),  # an HTTP/2 client with prior knowledge (h2c)
    (b"GET /health HTTP/3.0\r\n\r\n", b"505", "HTTP/1.1"),
    (b"GET /health HTTP/1.x\r\n\r\n", b"400", "Bad request version"),
    (b"GARBAGE\r\n\r\n", b"400", "Bad request syntax"),
    (b"GET / HTTP/1.1 extra\r\n\r\n", b"400", "Bad request version"),
    (b"POST /v1/completions\r\n\r\n", b"400", "Bad HTTP/0.9 request type"),
])
def test_a_refused_request_line_is_answered_with_a_status_line_and_headers(served, line, status, words):
    """The base class answered these as HTTP/0.9 (no status line, no headers): the client read a bare JSON text as
    the response (curl: 'Received HTTP/0.9 when not allowed'). RFC 9112 §3: an HTTP/1.1 server's answer."""
    reply = answer_to(served.port, line)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 " + status + b" "), reply[:200]
    assert b"Content-Type: application/json" in head
    assert b"Connection: close" in head
    error = json.loads(body)["error"]
    assert words in error["message"]
    assert error["type"] == "invalid_request_error"


def test_a_request_line_the_server_takes_is_still_answered_as_before(served):
    reply = answer_to(served.port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
    assert json.loads(reply.partition(b"\r\n\r\n")[2])["status"] == "ok"


# ------------------------------------------------------------------ CORS: the DELETE route passes its preflight

ORIGIN = "http://webui.example:5173"


def test_a_preflight_for_delete_on_a_kept_response_allows_delete(runtime):
    """A browser sends a cross-origin DELETE only where the preflight's Access-Control-Allow-Methods lists it (Fetch
    standard, CORS-preflight fetch): 'GET, POST' alone blocked DELETE /v1/responses/{id} from every web page. Other
    preflights keep llama-server's 'GET, POST'."""
    server = Served(runtime, ServeDefaults(max_tokens=2), api_key="sesame")
    try:
        asked = {"Origin": ORIGIN, "Access-Control-Request-Method": "DELETE",
                 "Access-Control-Request-Headers": "authorization"}
        for path in ("/v1/responses/resp_abc", "/responses/resp_abc"):
            status, headers, _ = server.request("OPTIONS", path, headers=asked)
            assert status == 200
            assert "DELETE" in [method.strip() for method in headers["Access-Control-Allow-Methods"].split(",")]
            assert headers["Access-Control-Allow-Origin"] == ORIGIN
        # the DELETE the browser then sends is this server's route, answered with the origin
        status, headers, payload = server.request("DELETE", "/v1/responses/resp_abc",
                                                  headers={"Origin": ORIGIN, "Authorization": "Bearer sesame"})
        assert status == 404
        assert headers["Access-Control-Allow-Origin"] == ORIGIN
        # no DELETE route there, or a preflight for POST: llama-server's answer as it was
        status, headers, _ = server.request("OPTIONS", "/v1/chat/completions", headers=asked)
        assert headers["Access-Control-Allow-Methods"] == "GET, POST"
        status, headers, _ = server.request("OPTIONS", "/v1/responses/resp_abc", headers={
            "Origin": ORIGIN, "Access-Control-Request-Method": "GET"})
        assert headers["Access-Control-Allow-Methods"] == "GET, POST"
    finally:
        server.close()


# ------------------------------------------------------------------ --api-key KEY1,KEY2, as llama-server takes it

def status_of(url: str, key: str | None) -> int:
    # /props, a route the key guards (the model list stays open, as llama-server's get_public_endpoints leaves it)
    request = urllib.request.Request(url + "/props", headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_api_key_takes_a_comma_separated_list_as_llama_server(tiny_bundle, tmp_path):
    """llama-server's --api-key: "multiple keys can be provided as a comma-separated list" (common/arg.cpp), any of
    which a request may send. 'alpha,beta' was taken for one key 'alpha,beta': every request a llama-server setup
    sends (Bearer alpha) was refused with a 401."""
    with serve_command(tiny_bundle.path, tmp_path, "--api-key", "alpha, beta,") as url:
        assert [status_of(url, key) for key in ("alpha", "beta", "alpha,beta", "gamma", None)] == \
            [200, 200, 401, 401, 401]
        request = urllib.request.Request(url + "/props", headers={"x-api-key": "beta"})
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200


def test_the_server_takes_several_keys(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=2), api_key=("alpha", "beta"))
    try:
        for headers, expected in [({"Authorization": "Bearer beta"}, 200), ({"x-api-key": "alpha"}, 200),
                                  ({"Authorization": "Bearer gamma"}, 401), ({}, 401)]:
            status, _, _ = server.request("GET", "/props", headers=headers)
            assert status == expected, headers
    finally:
        server.close()


@pytest.mark.parametrize("key", [",", " , ,"])
def test_an_api_key_list_with_no_key_is_refused(tiny_bundle, tmp_path, key):
    """A list with no key in it is refused at start (a child process: a server that started would serve for good)."""
    try:
        done = subprocess.run([sys.executable, "-m", "edgesdk.cli", "serve", str(tiny_bundle.path), "--port", "0",
                               "--api-key", key], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"--api-key {key!r} was taken: the server started")
    assert done.returncode == 2
    assert "is empty" in done.stderr


# ------------------------------------------------------------------ a body with a UTF-8 byte order mark

def test_a_json_body_after_a_byte_order_mark_is_read(served):
    """RFC 8259 §8.1 lets a parser ignore a UTF-8 BOM, and llama-server's does (nlohmann's skip_bom): a body saved
    by Notepad and sent with curl -d @file was a 400 here. A BOM elsewhere is still no JSON."""
    body = {"prompt": "The quick brown fox", "max_tokens": 2, "temperature": 0}
    status, _, plain = served.request("POST", "/v1/completions", body)
    assert status == 200
    status, _, marked = served.request("POST", "/v1/completions", raw=b"\xef\xbb\xbf" + json.dumps(body).encode())
    assert status == 200, marked
    assert json.loads(marked)["choices"][0]["text"] == json.loads(plain)["choices"][0]["text"]
    status, _, payload = served.request("POST", "/v1/completions", raw=b"{}\xef\xbb\xbf")
    assert status == 400
    assert "not JSON" in json.loads(payload)["error"]["message"]


# ------------------------------------------------------------------ a request-target in absolute-form

def test_a_request_target_in_absolute_form_is_its_path(runtime):
    """RFC 9112 §3.2.2: "a server MUST accept the absolute-form in requests". It was taken for a path: 404 on every
    route, and /health (open without the key) a 401."""
    server = Served(runtime, ServeDefaults(max_tokens=2), api_key="sesame")
    try:
        base = f"http://127.0.0.1:{server.port}"
        status, _, payload = server.request("GET", base + "/health")
        assert (status, json.loads(payload)["status"]) == (200, "ok")
        status, _, payload = server.request("GET", base + "/v1/models?limit=1", headers={"Authorization": "Bearer sesame"})
        assert status == 200, payload
        assert json.loads(payload)["data"][0]["id"] == "tiny-host"
        status, _, _ = server.request("GET", "HTTP://EXAMPLE.com:80/props")  # the key is still asked for
        assert status == 401
        status, _, payload = server.request("GET", "http://127.0.0.1")  # no path: '/', Ollama's liveness answer
        assert status == 200, payload
        body = {"prompt": "The quick brown fox", "max_tokens": 2}
        status, _, payload = server.request("POST", base + "/v1/completions", body, headers={
            "Authorization": "Bearer sesame", "Expect": "100-continue"})
        assert status == 200, payload
        assert json.loads(payload)["object"] == "text_completion"
    finally:
        server.close()


# ------------------------------------------------------------------ a header line that is no field line

@pytest.mark.parametrize("line", [b"Content-Length : 38", b"Bad Header: y", b"NoColon", b": no name"])
def test_a_header_line_that_is_no_field_line_is_a_400(served, line):
    """RFC 9112 §5.1: whitespace between a field name and its colon MUST be a 400. The standard library's parser
    ended the header section at such a line without a word and dropped every field after it: here the
    ``Connection: close`` and the Content-Length after it (a 411 where the client sent one)."""
    body = json.dumps({"prompt": "The quick brown fox", "max_tokens": 2}).encode()
    reply = answer_to(served.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + line + b"\r\nConnection: close\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), reply[:300]
    assert b"Connection: close" in head
    message = json.loads(payload)["error"]["message"]
    assert "RFC 9112" in message
    assert "not a header field" in message


def test_a_field_line_folded_or_before_the_fields_is_still_taken(served):
    """RFC 9112 §5.2 (obs-fold) and §2.2 (whitespace before the first field): a recipient may take or drop these,
    as the standard library does; they stay answered."""
    for head in (b"Host: x\r\n Folded: y\r\n", b" Lead: y\r\nHost: x\r\n"):
        reply = answer_to(served.port, b"GET /health HTTP/1.1\r\n" + head + b"Connection: close\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 200 "), reply[:200]
