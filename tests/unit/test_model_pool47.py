"""``edgesdk serve`` with several bundles: a request's model name matched as Ollama matches it (server/routes.go
``getExistingName``: each part of the name compared with ``strings.EqualFold``; a name without a tag is
``name:latest``), and ``name`` read where a Go client sends ``"model": ""`` beside it (Ollama's ShowHandler). Real
bundles of two tiny models, real servers over HTTP, the CLI's own model pool."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from edgesdk.cli_serve import _model_pool, _served_models
from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.session import open_runtime
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.http_server import ApiServer
from tests.unit.test_serve_models42 import CHAT, TOKENS, A, B, Server, build_named_lively

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    return [build_named_lively(tmp_path_factory.mktemp(f"lively{seed}"), seed).path for seed in (1, 2)]


@pytest.fixture
def several(bundles):
    server = Server(bundles)
    yield server
    server.close()


class AliasedServer(Server):
    """:class:`Server` with ``--alias NAME=BUNDLE`` options, as the CLI reads them."""

    def __init__(self, paths: list[Path], aliases: tuple[str, ...]):
        defaults = ServeDefaults(max_tokens=TOKENS)
        runtime = open_runtime(paths[0], threads=1)
        runtime.tokenizer.template_kwargs = {}
        self.completer = Completer(runtime, defaults)
        served = _served_models(paths, aliases)
        self.pool = _model_pool(served, runtime, self.completer, defaults, None, {}, 0, backend=None, threads=1,
                                target=None, ignore_target=False)
        self.server = ApiServer(("127.0.0.1", 0), self.completer, served[0][0], log=False, pool=self.pool)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def ollama_chat(server: Server, model: str) -> tuple[int, dict]:
    return server.post("/api/chat", {"model": model, "messages": CHAT, "stream": False,
                                     "options": {"num_predict": TOKENS}})


def test_a_name_in_another_case_finds_its_model_on_every_api(several):
    """Ollama finds ``qwen`` for ``Qwen`` or ``QWEN:Latest`` and answers with the name as the request wrote it."""
    status, expected = ollama_chat(several, B)
    assert status == 200, expected
    several.post("/v1/completions", {"model": A, "prompt": "Once"})  # A loaded again: the next request swaps
    status, body = ollama_chat(several, B.upper())
    assert status == 200, body
    assert body["model"] == B.upper()  # Ollama's answer: req.Model
    assert body["message"]["content"] == expected["message"]["content"]
    assert [entry["name"] for entry in several.get("/api/ps")[1]["models"]] == [f"{B}:latest"]
    status, body = several.post("/v1/chat/completions", {"model": f"{A.title()}:LATEST", "messages": CHAT})
    assert status == 200, body
    assert body["model"] == A
    assert [entry["name"] for entry in several.get("/api/ps")[1]["models"]] == [f"{A}:latest"]
    status, body = several.post("/api/generate", {"model": B.upper(), "prompt": "Once", "stream": False,
                                                  "options": {"num_predict": TOKENS}})
    assert (status, body.get("model")) == (200, B.upper()), body
    status, body = several.post("/api/embed", {"model": f"{A.upper()}:latest", "input": "Once"})
    assert (status, body.get("model")) == (200, f"{A.upper()}:latest"), body
    status, body = several.post("/api/show", {"model": B.upper()})
    assert status == 200, body
    assert several.get(f"/v1/models/{B.upper()}")[1]["id"] == B
    assert several.post("/v1/chat/completions", {"model": "lively3-host", "messages": CHAT})[0] == 404


def test_a_served_name_with_its_tag_answers_to_the_name_without_it(bundles):
    """A bundle served as ``NAME:latest`` (``--alias``) is the model a request for ``NAME`` wants, as Ollama reads
    ``NAME`` as ``NAME:latest``."""
    server = AliasedServer(bundles, (f"tiny:latest={bundles[1]}",))
    try:
        assert [entry["name"] for entry in server.get("/api/tags")[1]["models"]] == [f"{A}:latest", "tiny:latest"]
        status, body = ollama_chat(server, "tiny")
        assert (status, body.get("model")) == (200, "tiny"), body
        assert [entry["name"] for entry in server.get("/api/ps")[1]["models"]] == ["tiny:latest"]
        status, body = server.post("/v1/completions", {"model": "Tiny", "prompt": "Once"})
        assert (status, body.get("model")) == (200, "tiny:latest"), body
    finally:
        server.close()


def test_an_ollama_name_beside_an_empty_model_names_the_model(several):
    """A Go client filling the deprecated ``Name`` sends ``"model": ""`` beside it; Ollama's ShowHandler reads
    ``name`` then, as the single-bundle server does."""
    status, shown = several.post("/api/show", {"model": "", "name": B})
    assert status == 200, shown
    assert "FROM " + f"{B}:latest" in shown["modelfile"]
    assert [entry["name"] for entry in several.get("/api/ps")[1]["models"]] == [f"{A}:latest"]  # nothing loaded


def test_two_names_a_request_cannot_tell_apart_are_refused_at_start(bundles):
    with pytest.raises(EdgeSDKError) as caught:
        _served_models(bundles, (f"Tiny={bundles[0]}", f"tiny={bundles[1]}"))
    assert "'Tiny' and 'tiny'" in str(caught.value)
    assert str(bundles[1]) in str(caught.value)
    with pytest.raises(EdgeSDKError) as caught:
        _served_models(bundles, (f"tiny={bundles[0]}", f"tiny:latest={bundles[1]}"))
    assert "'tiny' and 'tiny:latest'" in str(caught.value)
    assert [name for name, _ in _served_models(bundles, (f"tiny={bundles[0]}", f"tiny:q4={bundles[1]}"))] == \
        ["tiny", "tiny:q4"]


def test_a_chat_request_refused_whole_swaps_no_model_in(several):
    """Ollama's OpenAI middleware refuses a bad chat body before ChatHandler schedules its model (middleware/openai.go
    ChatMiddleware): the loaded model stays, with its conversations' caches, and no load is paid for a 400."""
    assert several.post("/v1/chat/completions", {"model": A, "messages": CHAT})[0] == 200
    for bad in ({"model": B, "messages": []}, {"model": B, "messages": CHAT, "temperature": "hot"}):
        status, body = several.post("/v1/chat/completions", bad)
        assert status == 400, body
        assert [entry["name"] for entry in several.get("/api/ps")[1]["models"]] == [f"{A}:latest"]
    status, body = several.post("/v1/chat/completions", {"model": "lively3-host", "messages": []})
    assert (status, body["error"]["code"]) == (404, "model_not_found")  # the name first, as before
    status, body = several.post("/v1/chat/completions", {"model": B, "messages": CHAT})
    assert (status, body["model"]) == (200, B)
