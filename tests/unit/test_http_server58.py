"""The HTTP server (edgesdk/serve/http_server.py) where the standard library's own refusal of a request (a method with
no route: ``PUT /v1/messages``) came in OpenAI's error shape on the Messages API's and Ollama's routes, whose clients
read only their API's shape (Anthropic's ``{"type": "error", "error": {...}}``, Ollama's ``{"error": "..."}``)."""

from __future__ import annotations

import json
import socket

import pytest

from tests.unit.test_serve_review import read_until_closed


def _exchange(served, request: bytes) -> tuple[bytes, bytes]:
    """The head and body of the answer to ``request`` sent raw."""
    client = socket.create_connection(("127.0.0.1", served.port), timeout=30)
    client.sendall(request)
    head, _, payload = read_until_closed(client).partition(b"\r\n\r\n")
    client.close()
    return head, payload


def test_a_method_with_no_route_on_the_messages_api_is_refused_in_anthropic_s_shape(served):
    head, payload = _exchange(served, b"PUT /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
    assert head.startswith(b"HTTP/1.1 501"), head
    body = json.loads(payload)
    assert body["type"] == "error", body
    assert "PUT" in body["error"]["message"]


@pytest.mark.parametrize("path", [b"/api/chat", b"/api/tags"])
def test_a_method_with_no_route_on_ollama_s_api_is_refused_in_ollama_s_shape(served, path):
    head, payload = _exchange(served, b"PATCH " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
    assert head.startswith(b"HTTP/1.1 501"), head
    body = json.loads(payload)
    assert isinstance(body["error"], str), body
    assert "PATCH" in body["error"]


def test_a_method_with_no_route_elsewhere_keeps_openai_s_shape(served):
    head, payload = _exchange(served, b"PUT /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
    assert head.startswith(b"HTTP/1.1 501"), head
    error = json.loads(payload)["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "unsupported_method")
