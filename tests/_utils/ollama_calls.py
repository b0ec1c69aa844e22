"""Calls on ``edgesdk serve``'s Ollama routes for the tests: the real ``ollama`` client pointed at a served tiny
bundle, and plain posts that check Ollama's answer shapes."""

from __future__ import annotations


def ollama_client(server):
    """The ``ollama`` package's client for ``server`` (tests.unit.test_serve.Served)."""
    import ollama

    return ollama.Client(host=f"http://127.0.0.1:{server.port}")


def post_ok(server, path: str, body: dict) -> dict:
    """The 200 answer to ``body`` posted on ``path``."""
    status, payload = server.post(path, body)
    assert status == 200, payload
    return payload


def post_error(server, path: str, body: dict) -> tuple[int, str]:
    """The status and message of a refusal, checked to be in Ollama's ``{"error": ...}`` shape."""
    status, payload = server.post(path, body)
    assert set(payload) == {"error"}, payload  # Ollama's shape
    return status, payload["error"]
