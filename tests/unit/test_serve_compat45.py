"""serve's Ollama and Anthropic compatible routes and llama-server's probes, against what the reference tools and
specs answer: Anthropic's ``thinking`` types, llama-server's ``/v1/health`` alias and its ``/metrics`` answer when the
endpoint is off. Real servers over the tiny bundle, real HTTP."""

from __future__ import annotations

import json

import pytest

from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served

ASK = [{"role": "user", "content": "Tell me about the fox."}]


@pytest.mark.parametrize("thinking", [{"type": "adaptive"}, {"type": "adaptive", "display": "summarized"},
                                      {"type": "between_tools"}])
def test_anthropic_s_other_thinking_types_turn_thinking_on(terse, thinking):
    """Anthropic's ``thinking`` takes ``adaptive`` (the model decides how much to think; the only type Claude Opus 4.7
    accepts, so what current clients send) and ``between_tools`` beside ``enabled`` and ``disabled`` (the SDK's
    ThinkingConfigParam): each is thinking on, rendered as ``enabled`` renders it, not a 400."""
    base = {"model": "m", "max_tokens": 10, "messages": ASK}
    status, enabled = terse.post("/v1/messages/count_tokens",
                                 {**base, "thinking": {"type": "enabled", "budget_tokens": 2048}})
    assert status == 200, enabled
    status, disabled = terse.post("/v1/messages/count_tokens", {**base, "thinking": {"type": "disabled"}})
    assert status == 200, disabled
    assert enabled != disabled  # the switch changes the rendered prompt (Qwen3-style template)
    status, counted = terse.post("/v1/messages/count_tokens", {**base, "thinking": thinking})
    assert status == 200, counted
    assert counted == enabled
    status, answer = terse.post("/v1/messages", {**base, "thinking": thinking})
    assert status == 200, answer
    assert [block["type"] for block in answer["content"]] == ["thinking"]


@pytest.mark.parametrize("thinking", [{"type": "sometimes"}, {"type": "enabled"}, "adaptive"])
def test_other_thinking_values_are_still_refused(served, thinking):
    status, answer = served.post("/v1/messages", {"max_tokens": 4, "messages": ASK, "thinking": thinking})
    assert status == 400, answer
    assert answer["error"]["type"] == "invalid_request_error"
    assert "adaptive" in answer["error"]["message"]


@pytest.mark.parametrize("api_key", [None, "secret"])
def test_v1_health_is_llama_server_s_alias_of_health_and_open(runtime, api_key):
    """llama-server serves ``GET /v1/health`` with ``/health``'s handler, both public (tools/server/server.cpp:
    "public endpoint (no API key check)"): a probe configured for it must not get a 404 or a 401."""
    server = Served(runtime, ServeDefaults(max_tokens=4), api_key=api_key)
    try:
        status, _, health = server.request("GET", "/health")
        status_v1, _, health_v1 = server.request("GET", "/v1/health")
        head, _, empty = server.request("HEAD", "/v1/health")
        refused, _, _ = server.request("POST", "/v1/health", {})
    finally:
        server.close()
    assert (status, status_v1, head) == (200, 200, 200)
    assert json.loads(health_v1) == json.loads(health)
    assert empty == b""
    assert refused == 405  # the route is GET's


def test_metrics_off_is_llama_server_s_501_not_supported(served):
    """llama-server without ``--metrics``: ``GET /metrics`` is 501 with type ``not_supported_error`` (tools/server
    README, "When /metrics or /slots endpoint is disabled"), which scrapers and pollers tell from a missing route."""
    status, headers, payload = served.request("GET", "/metrics")
    assert status == 501, payload
    error = json.loads(payload)["error"]
    assert error["type"] == "not_supported_error"
    assert "does not support metrics endpoint" in error["message"]
    assert "--metrics" in error["message"]
    assert headers["Content-Type"] == "application/json"


@pytest.mark.parametrize("path", ["/v1/api/chat", "/v1/api/generate", "/v1/api/show", "/v1/api/embed",
                                  "/v1/api/embeddings"])
def test_ollama_routes_under_v1_are_no_route_not_a_405_that_names_the_method_sent(served, path):
    """Ollama's native routes have no /v1 form (its /v1 is the OpenAI API) and this server routes none: POST there
    is a 404, not a 405 "takes POST, not POST" with an Allow header naming the method the client sent."""
    status, headers, payload = served.request("POST", path, {"model": "tiny-host", "prompt": "hi", "stream": False})
    assert status == 404, payload
    message = json.loads(payload)["error"]["message"]
    assert message.startswith(f"no route POST {path}")
    assert "Allow" not in headers
    status, headers, _ = served.request("GET", path[len("/v1"):])  # the route itself, under another method
    assert (status, headers.get("Allow")) == (405, "POST")


def test_an_ollama_route_under_v1_is_refused_before_its_body_is_sent(served):
    """``Expect: 100-continue`` to a route that is none gets its 404 at once, not a 100 that has the client send a
    body nobody routes (RFC 9110 §10.1.1)."""
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    try:
        connection.putrequest("POST", "/v1/api/chat")
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", "1000")
        connection.putheader("Expect", "100-continue")
        connection.endheaders()
        response = connection.getresponse()  # the final answer, before any of the body was sent
        assert response.status == 404
        assert json.loads(response.read())["error"]["message"].startswith("no route POST /v1/api/chat")
    finally:
        connection.close()


def test_ollama_s_load_duration_is_the_time_the_model_took_to_load(tmp_path_factory):
    """Ollama's ``load_duration`` is the time from the request's start until its model was scheduled (server/routes.go,
    ``checkpointLoaded.Sub(checkpointStart)`` around ``scheduleRunner``), in the answer's ``total_duration`` too: with
    several bundles, a request for the one not loaded waits for its load, which the answer must not report as 0."""
    from tests.unit.test_serve_models42 import CHAT, A, B, Server, build_named_lively

    paths = [build_named_lively(tmp_path_factory.mktemp(f"lively{seed}"), seed).path for seed in (1, 2)]
    server = Server(paths)
    try:
        status, swapped = server.post("/api/chat", {"model": B, "messages": CHAT, "stream": False,
                                                    "options": {"num_predict": 2}})
        assert status == 200, swapped
        status, again = server.post("/api/chat", {"model": B, "messages": CHAT, "stream": False,
                                                  "options": {"num_predict": 2}})
        assert status == 200, again
        status, text = server.post("/api/generate", {"model": A, "prompt": "Once", "options": {"num_predict": 2}})
        assert status == 200, text
        streamed = [json.loads(line) for line in text.split("\n") if line][-1]
        status, embedded = server.post("/api/embed", {"model": B, "input": "Once"})
        assert status == 200, embedded
    finally:
        server.close()
    for loaded in (swapped, streamed, embedded):  # each waited for its model to be loaded in place of the other
        assert 0 < loaded["load_duration"] < loaded["total_duration"], loaded
    assert 0 <= again["load_duration"] < swapped["load_duration"]  # loaded already: no load to wait for


@pytest.mark.parametrize(("backend", "on_gpu"), [("ort-cpu", False), ("ort-cuda", True), ("ort-trt", True),
                                                 ("tensorrt", True)])
def test_api_ps_says_where_the_model_is_as_ollama_ps_reads_it(tiny_bundle, backend, on_gpu):
    """``ollama ps`` prints "100% GPU" where a model's ``size_vram`` equals its ``size`` and "100% CPU" where it is 0
    (cmd/cmd.go, ListRunningHandler): a bundle on a GPU backend (the board's TensorRT engine, ONNX Runtime's CUDA or
    TensorRT provider) is all in the GPU's memory. The backend is the tiny bundle's ONNX Runtime session, named as
    edgesdk.runtime.session names the backend it opened."""
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(tiny_bundle.path, threads=1)
    runtime.backend.name = backend
    model = _running(runtime)
    assert model["size_vram"] == (model["size"] if on_gpu else 0)


def _running(runtime) -> dict:
    """The one model ``GET /api/ps`` lists on a server over ``runtime``."""
    server = Served(runtime, ServeDefaults(max_tokens=4))
    try:
        status, _, payload = server.request("GET", "/api/ps")
    finally:
        server.close()
    assert status == 200, payload
    model = json.loads(payload)["models"][0]
    assert model["size"] > 0
    return model


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate"])
def test_num_predict_0_is_no_limit_as_in_ollama(served, path):
    """Ollama's runners stop at ``num_predict`` only where it is > 0 (runner/ollamarunner/runner.go: ``seq.numPredict
    > 0 && seq.numPredicted >= seq.numPredict``), so 0 is no limit, as -1 is: an answer, not a 400. With ``shift``
    false both run until the context is full."""
    asked = {"model": "tiny-host", "stream": False, "shift": False}
    asked |= {"messages": ASK} if path == "/api/chat" else {"prompt": "Tell me about the fox."}
    status, unlimited = served.post(path, {**asked, "options": {"num_predict": -1}})
    assert status == 200, unlimited
    status, zero = served.post(path, {**asked, "options": {"num_predict": 0}})
    assert status == 200, zero
    assert zero["done_reason"] == unlimited["done_reason"] == "length"
    assert zero["eval_count"] == unlimited["eval_count"] > 16  # past the server's --max-new-tokens (16 here)
    assert zero["prompt_eval_count"] + zero["eval_count"] > 256  # the tiny bundle's context, full


def test_a_refused_messages_request_swaps_no_model_in(tmp_path_factory):
    """With several bundles, a Messages request the server refuses on its body alone (no ``max_tokens``, a bad
    field) is refused before its model is scheduled, as Ollama's handlers check a request before ``scheduleRunner``
    and /api/chat does here: the loaded model stays, not unloaded for a model that answers nothing. A model not served
    is still the 404, and a good request still loads its model."""
    from tests.unit.test_serve_models42 import CHAT, A, B, Server, build_named_lively

    paths = [build_named_lively(tmp_path_factory.mktemp(f"lively{seed}"), seed).path for seed in (1, 2)]
    server = Server(paths)
    try:
        for bad in ({"model": B, "messages": CHAT}, {"model": B, "max_tokens": 2, "messages": CHAT, "top_k": -1}):
            status, refused = server.post("/v1/messages", bad)
            assert status == 400, refused
            assert refused["error"]["type"] == "invalid_request_error"
            status, ps = server.get("/api/ps")
            assert [model["name"] for model in ps["models"]] == [f"{A}:latest"]  # still the one loaded at start
        status, missing = server.post("/v1/messages", {"model": "nope", "messages": CHAT})
        assert (status, missing["error"]["type"]) == (404, "not_found_error")
        status, answered = server.post("/v1/messages", {"model": B, "max_tokens": 2, "messages": CHAT})
        assert status == 200, answered
        status, ps = server.get("/api/ps")
        assert [model["name"] for model in ps["models"]] == [f"{B}:latest"]
    finally:
        server.close()


def test_api_ps_says_a_triton_backend_on_the_cpu_is_on_the_cpu(tiny_bundle, tmp_path):
    """The Triton backend runs where its decoder's tensors are: on a Jetson's GPU, or, as its kernels' PyTorch
    twins (``EDGESDK_KERNELS=reference``), on the CPU, which ``ollama ps`` must read as "100% CPU"."""
    from edgesdk.runtime.session import open_runtime
    from edgesdk.runtime.sparse_decoder import SparseDecoder
    from edgesdk.runtime.triton_backend import TritonBackend
    from tests._utils.tiny import export_tiny_sparse

    runtime = open_runtime(tiny_bundle.path, threads=1)
    _, tensors, record = export_tiny_sparse(tmp_path, max_context=128)
    runtime.backend = TritonBackend(SparseDecoder(tensors, record, mode="reference"), "reference")
    assert _running(runtime)["size_vram"] == 0


def test_ollama_reads_whole_number_options_written_as_floats_and_a_negative_top_k(served):
    """Ollama sets its int options from the JSON's numbers, which Go decodes as float64 (api/types.go
    ``Options.FromMap``), so ``num_predict: 6.0`` is 6; its ``top_k`` goes to llama.cpp's sampler, off at any
    k <= 0. Both were 400s here. A fractional count is its whole part, as Go's ``int64(t)`` cuts it."""
    asked = {"model": "tiny-host", "stream": False, "messages": ASK}
    status, plain = served.post("/api/chat", {**asked, "options": {"num_predict": 6, "num_ctx": 128, "top_k": 0,
                                                                   "seed": 3, "temperature": 0.7}})
    assert status == 200, plain
    status, floats = served.post("/api/chat", {**asked, "options": {"num_predict": 6.0, "num_ctx": 128.0,
                                                                    "top_k": -1, "seed": 3.0, "temperature": 0.7}})
    assert status == 200, floats
    assert floats["message"] == plain["message"]
    assert floats["eval_count"] == plain["eval_count"]
    status, fraction = served.post("/api/chat", {**asked, "options": {"num_predict": 6.5, "num_ctx": 128.5,
                                                                      "top_k": -1, "seed": 3.9, "temperature": 0.7}})
    assert status == 200, fraction
    assert fraction["message"] == plain["message"]
    assert fraction["eval_count"] == plain["eval_count"]
