"""``edgesdk serve`` with several bundles (serve/model_pool.py): a bundle removed from under the server after its
start. Ollama answers a request for a model it no longer has without unloading the one loaded; its error names the
model. Real bundles of two tiny models, real servers over HTTP, the CLI's own model loader."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.unit.test_serve_models42 import CHAT, Server, build_named_lively

pytest.importorskip("torch")

A, B = "lively1-host", "lively2-host"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return [build_named_lively(tmp_path_factory.mktemp(f"pool51_{seed}"), seed).path for seed in (1, 2)]


@pytest.fixture
def removed(built, tmp_path):
    """A server of A and a copy of B, the copy removed once the server has started (A loaded)."""
    copy = Path(shutil.copytree(built[1], tmp_path / "gone"))
    server = Server([built[0], copy])
    shutil.rmtree(copy)
    yield server, copy
    server.close()


def _loaded(server: Server) -> list[str]:
    status, body = server.get("/api/ps")
    assert status == 200, body
    return [model["name"].removesuffix(":latest") for model in body["models"]]


@pytest.mark.parametrize(("route", "body"), [
    ("/v1/chat/completions", {"model": B, "messages": CHAT}),
    ("/tokenize", {"model": B, "content": "Once"}),
    ("/v1/messages/count_tokens", {"model": B, "messages": CHAT}),
])
def test_a_request_for_a_removed_bundle_is_a_500_naming_the_model_and_the_missing_bundle(removed, route, body):
    server, copy = removed
    status, answer = server.post(route, body)
    assert status == 500, answer
    error = answer["error"]
    message = error["message"]
    # named as a failed load is: the model, its bundle, why (the bundle is gone), not a tokenizer.json to fix
    assert f"the model '{B}' (bundle " in message
    assert "does not exist or is not a directory" in message
    assert "tokenizer" not in message
    assert "the other models served here still answer" in message
    if "code" in error:
        assert error["code"] == "model_load_failed"
    assert _loaded(server) == [A]
    status, answer = server.post("/v1/chat/completions", {"model": A, "messages": CHAT})
    assert (status, answer["model"]) == (200, A)


@pytest.mark.parametrize(("route", "body"), [
    ("/api/chat", {"model": B, "messages": CHAT, "stream": False}),
    ("/api/generate", {"model": B}),  # Ollama's load request: nothing to generate
    ("/v1/embeddings", {"model": B, "input": "Once"}),
])
def test_a_removed_bundle_does_not_unload_the_loaded_model(removed, route, body, capsys):
    server, copy = removed
    assert _loaded(server) == [A]
    status, answer = server.post(route, body)
    assert status == 500, answer
    message = answer["error"] if isinstance(answer["error"], str) else answer["error"]["message"]
    assert f"the model '{B}' (bundle " in message
    assert "does not exist or is not a directory" in message
    # the loaded model goes on answering, never unloaded and loaded again for the next request
    assert _loaded(server) == [A]
    status, answer = server.post("/v1/chat/completions", {"model": A, "messages": CHAT})
    assert (status, answer["model"]) == (200, A)
    log = capsys.readouterr().err
    assert f"unloaded {A}" not in log
    assert f"loaded {A} in" not in log
    if route.startswith("/api/"):  # Ollama's routes load first: the refusal is said in the log
        assert f"{A} stays loaded" in log


def test_a_bundle_put_back_is_served_again(built, removed):
    server, copy = removed
    assert server.post("/v1/chat/completions", {"model": B, "messages": CHAT})[0] == 500
    shutil.copytree(built[1], copy)
    status, answer = server.post("/v1/chat/completions", {"model": B, "messages": CHAT})
    assert (status, answer["model"]) == (200, B)
    assert _loaded(server) == [B]
