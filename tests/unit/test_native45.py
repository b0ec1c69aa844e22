"""llama-server's native endpoints and embeddings at their edges, over real HTTP against the tiny bundle
(tools/server/server-context.cpp and README.md in ggml-org/llama.cpp)."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.parametrize("norm", [-1, 0, 1, 2, 3])
def test_openai_embeddings_take_llama_server_s_embd_normalize(served, norm):
    """llama-server's handle_embeddings_impl reads embd_normalize on /v1/embeddings as on /embedding: the same
    vector comes back from both (-1: as the model gives it)."""
    status, native = served.post("/embedding", {"input": "Hello world", "embd_normalize": norm})
    assert status == 200, native
    status, body = served.post("/v1/embeddings", {"input": "Hello world", "embd_normalize": norm})
    assert status == 200, body
    vector = np.asarray(body["data"][0]["embedding"])
    assert np.allclose(vector, native[0]["embedding"][0], rtol=1e-5, atol=1e-6)
    if norm == -1:
        assert abs(np.linalg.norm(vector) - 1.0) > 1e-3  # the tiny model's raw vector is not of unit length
    if norm == 1:
        assert np.abs(vector).sum() == pytest.approx(1.0, rel=1e-5)


def test_openai_embeddings_stay_unit_vectors_and_refuse_a_bad_embd_normalize(served):
    status, body = served.post("/v1/embeddings", {"input": ["Hello", [5, 6, 7]], "embd_normalize": None})
    assert status == 200, body
    for item in body["data"]:
        assert np.linalg.norm(item["embedding"]) == pytest.approx(1.0, rel=1e-5)
    status, body = served.post("/v1/embeddings", {"input": "Hello", "dimensions": 8})
    assert status == 200, body
    assert np.linalg.norm(body["data"][0]["embedding"]) == pytest.approx(1.0, rel=1e-5)
    status, body = served.post("/v1/embeddings", {"input": "Hello", "embd_normalize": -2})
    assert status == 400, body
    assert body["error"]["param"] == "embd_normalize"

