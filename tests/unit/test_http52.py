"""The HTTP server core (edgesdk/serve/http_server.py and its helpers) where it answered otherwise than the API it
follows:

* Ollama's model-management routes that edgesdk does not implement (``/api/pull``, ``/api/push``, ``/api/create``,
  ``/api/copy``, ``/api/delete``, ``/api/blobs/{digest}``) answered a 404 in OpenAI's error shape
  (``{"error": {"message": ...}}``), which an Ollama client reads as no message at all; a pull of the model served
  failed, where Ollama answers a pull of a model it has with its success status."""

from __future__ import annotations

import json

import pytest

from tests._utils.ollama_calls import ollama_client


# ------------------------------------------------------------------------------------ Ollama's model management
def test_a_pull_of_the_served_model_streams_ollama_s_success(served):
    status, headers, payload = served.request("POST", "/api/pull", {"model": "tiny-host"})
    assert status == 200, payload
    assert headers["Content-Type"] == "application/x-ndjson"
    assert [json.loads(line) for line in payload.decode().splitlines()] == [
        {"status": "pulling manifest"}, {"status": "verifying sha256 digest"}, {"status": "writing manifest"},
        {"status": "success"}]


def test_a_whole_pull_of_the_served_model_by_another_spelling_is_one_success(served):
    # Ollama's name matching: any case, name:latest for name; the older 'name' field
    assert served.post("/api/pull", {"model": "Tiny-Host:latest", "stream": False}) == (200, {"status": "success"})
    assert served.post("/api/pull", {"name": "tiny-host", "stream": False}) == (200, {"status": "success"})


def test_the_ollama_client_pulls_the_served_model(served):
    client = ollama_client(served)
    assert client.pull("tiny-host").status == "success"
    assert [part.status for part in client.pull("tiny-host", stream=True)] == [
        "pulling manifest", "verifying sha256 digest", "writing manifest", "success"]


def test_a_pull_of_a_model_not_served_says_what_edgesdk_does_instead(served):
    import ollama

    with pytest.raises(ollama.ResponseError) as caught:
        ollama_client(served).pull("llama3.2")
    assert caught.value.status_code == 501
    message = caught.value.error
    assert "'llama3.2'" in message
    assert "tiny-host" in message
    assert "edgesdk build" in message
    assert "edgesdk deploy" in message


def test_a_pull_without_a_model_is_ollama_s_400(served):
    status, body = served.post("/api/pull", {"stream": False})
    assert status == 400
    assert set(body) == {"error"}
    assert "'model' is required" in body["error"]


@pytest.mark.parametrize(("method", "path", "body", "words"), [
    ("POST", "/api/push", {"model": "tiny-host"}, "edgesdk deploy"),
    ("POST", "/api/create", {"model": "mine", "from": "tiny-host"}, "edgesdk build"),
    ("POST", "/api/copy", {"source": "tiny-host", "destination": "mine"}, "--alias"),
    ("DELETE", "/api/delete", {"model": "tiny-host"}, "remove the bundle"),
    ("POST", "/api/blobs/sha256:" + "0" * 64, None, "edgesdk build"),
])
def test_a_model_management_route_is_a_501_in_ollama_s_shape(served, method, path, body, words):
    status, _, payload = served.request(method, path, body)
    answer = json.loads(payload)
    assert status == 501, answer
    assert set(answer) == {"error"}
    assert isinstance(answer["error"], str)
    assert words in answer["error"]
    assert "edgesdk serve does not" in answer["error"]


def test_the_ollama_client_reads_a_management_refusal_s_message(served):
    import ollama

    client = ollama_client(served)
    for call in (lambda: client.delete("tiny-host"), lambda: client.copy("tiny-host", "mine")):
        with pytest.raises(ollama.ResponseError) as caught:
            call()
        assert caught.value.status_code == 501
        assert caught.value.error.startswith("edgesdk serve does not")


def test_a_blob_s_head_is_a_501_and_another_method_a_405_naming_ollama_s(served):
    status, _, payload = served.request("HEAD", "/api/blobs/sha256:" + "0" * 64)
    assert (status, payload) == (501, b"")
    status, headers, payload = served.request("GET", "/api/pull")
    assert status == 405
    assert headers["Allow"] == "POST"
    assert set(json.loads(payload)) == {"error"}


def test_a_management_route_wants_the_api_key_first(runtime):
    from tests.unit.test_serve import Served

    server = Served(runtime, api_key="secret")
    try:
        status, body = server.post("/api/pull", {"model": "tiny-host"})
        assert status == 401
        assert set(body) == {"error"}
        status, body = server.post("/api/pull", {"model": "tiny-host", "stream": False},
                                   headers={"Authorization": "Bearer secret"})
        assert (status, body) == (200, {"status": "success"})
    finally:
        server.close()
