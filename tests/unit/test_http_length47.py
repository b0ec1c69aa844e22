"""A Content-Length of more digits than Python's int() reads (4300, CPython's int_max_str_digits) is the 413 of any
body past the limit, not a 500 with a ValueError."""

from __future__ import annotations

import json

import pytest

from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve_review import Served, read_until_closed


@pytest.fixture
def idle_server(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=2))
    yield server
    server.close()


@pytest.mark.parametrize("length", [b"9" * 5000, b"0" * 5000 + b"2000000", b"2000000"])
def test_a_content_length_past_the_limit_in_any_number_of_digits_is_a_413(idle_server, length):
    client = idle_server.raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n")
    head, _, payload = read_until_closed(client).partition(b"\r\n\r\n")
    client.close()
    assert head.startswith(b"HTTP/1.1 413"), head
    message = json.loads(payload)["error"]["message"]
    assert "this server reads at most" in message
    assert len(message) < 200
