"""A request refused before its body is read (413 too large, 401 no key) closes its connection; the server
first reads what the client still sends (RFC 9112 §9.6), so a client writing its body gets the refusal
instead of "connection reset". Real server on the tiny bundle, http.client as the client."""

from __future__ import annotations

import http.client
import json

import pytest

from edgesdk.serve.http_server import MAX_BODY_BYTES


def post(port: int, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("POST", "/v1/completions", body=body,
                           headers={"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


@pytest.mark.parametrize("attempt", range(3))
def test_a_body_too_large_gets_its_413_while_the_client_is_still_sending_it(served, attempt):
    body = json.dumps({"prompt": "x" * (4 * MAX_BODY_BYTES)}).encode()
    status, payload = post(served.port, body)
    assert status == 413
    assert f"{MAX_BODY_BYTES:,}" in payload["error"]["message"]
    status, _ = post(served.port, json.dumps({"prompt": "hi", "max_tokens": 1}).encode())
    assert status == 200  # the server goes on serving
