"""``POST /v1/embeddings`` with llama-server's ``content`` and no ``input``: answered as ``/embedding`` answers it, as
llama-server's ``handle_embeddings_impl`` takes such a body ("content" field is not OAI compatible), after the same
refusal of pooling ``none``. It was a 400 ("'input' is required")."""

from __future__ import annotations

import pytest

from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served

pytest.importorskip("torch")

TEXT = "The quick brown fox jumps over the lazy dog."


def test_content_on_the_openai_route_is_answered_in_llama_servers_shape(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=8, pooling="mean"))
    try:
        native_status, native = server.post("/embedding", {"content": TEXT, "embd_normalize": 2})
        status, answer = server.post("/v1/embeddings", {"content": TEXT, "embd_normalize": 2})
        unnormalised_status, unnormalised = server.post("/v1/embeddings", {"content": TEXT, "embd_normalize": -1})
        both_status, both = server.post("/v1/embeddings", {"input": TEXT, "content": "ignored"})
    finally:
        server.close()
    assert (native_status, status, unnormalised_status, both_status) == (200, 200, 200, 200), answer
    assert answer == native  # [{"index": 0, "embedding": [[...]]}]
    assert answer[0]["index"] == 0
    assert len(answer[0]["embedding"]) == 1
    assert unnormalised != answer  # embd_normalize read, as /embedding reads it
    assert both["object"] == "list"  # input wins: OpenAI's answer


def test_content_on_the_openai_route_is_still_refused_under_pooling_none(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=8, pooling="none"))
    try:
        status, answer = server.post("/v1/embeddings", {"content": TEXT})
    finally:
        server.close()
    assert status == 400, answer
    assert answer["error"]["message"].startswith("Pooling type 'none' is not OAI compatible"), answer
