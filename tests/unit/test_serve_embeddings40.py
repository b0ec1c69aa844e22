"""serve's embedding routes on a real server over the tiny bundle: OpenAI's ``POST /v1/embeddings`` (driven by the
``openai`` client), llama-server's ``POST /embedding`` and ``/embeddings``, and Ollama's ``POST /api/embed`` and
``/api/embeddings`` (driven by the ``ollama`` client). Vectors are checked against
:func:`edgesdk.runtime.embedding.embed_tokens` on the same backend, and against transformers' final hidden state."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from edgesdk.runtime.embedding import POOLINGS, EmbeddingConfig, embed_tokens
from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served

TEXTS = ["The cat sat on the mat.", "Edge boards run small models."]
LONG = "a b c d e f g h " * 60  # well past the tiny bundle's 256-token context


@pytest.fixture(scope="module")
def served(runtime):
    server = Served(runtime)
    yield server
    server.close()


@pytest.fixture(scope="module")
def unpooled(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=16, pooling="none"))
    yield server
    server.close()


def _ids(runtime, text: str) -> list[int]:
    return runtime.tokenizer.encode(text)


def _want(runtime, ids, pooling: str = "mean", norm: int = 2, truncate: bool = False) -> np.ndarray:
    """The embedding the runtime itself gives ``ids``."""
    return embed_tokens(runtime.backend, ids, EmbeddingConfig(pooling=pooling, normalize=norm), truncate).vectors


def _close(got, want) -> None:
    np.testing.assert_allclose(np.asarray(got, dtype=np.float32), want, rtol=0, atol=1e-6)


def _openai_error(server: Served, body: object, path: str = "/v1/embeddings") -> tuple[int, dict]:
    status, payload = server.post(path, body)
    assert set(payload) == {"error"}, payload
    assert set(payload["error"]) == {"message", "type", "param", "code"}, payload
    return status, payload["error"]


# ------------------------------------------------------------------------------------------------ OpenAI's route


def test_the_openai_client_gets_each_text_s_unit_vector_in_base64_and_in_floats(served, runtime):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{served.port}/v1", api_key="none", max_retries=0)
    answer = client.embeddings.create(model="tiny-host", input=TEXTS)  # the client asks for base64 and decodes it
    floats = client.embeddings.create(model="tiny-host", input=TEXTS, encoding_format="float")
    tokens = [len(_ids(runtime, text)) for text in TEXTS]
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == sum(tokens)
    assert answer.model == "tiny-host"
    assert [item.index for item in answer.data] == [0, 1]
    for index, text in enumerate(TEXTS):
        want = _want(runtime, _ids(runtime, text))
        _close(answer.data[index].embedding, want)
        _close(floats.data[index].embedding, want)
        assert abs(np.linalg.norm(want) - 1) < 1e-5
    assert not np.allclose(answer.data[0].embedding, answer.data[1].embedding)


def test_base64_is_the_little_endian_float32_bytes_of_the_vector(served, runtime):
    status, body = served.post("/v1/embeddings", {"input": TEXTS[0], "encoding_format": "base64"})
    assert status == 200, body
    vector = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    _close(vector, _want(runtime, _ids(runtime, TEXTS[0])))
    assert body["object"] == "list"
    assert body["data"][0]["object"] == "embedding"


def test_the_pooled_vector_is_transformers_final_hidden_state_normalised(served, tiny_model_dir, runtime):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32).eval()
    ids = _ids(runtime, TEXTS[1])
    with torch.no_grad():
        # mean pooling, the default of a model that declares none
        hidden = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0].mean(0).numpy()
    _, body = served.post("/v1/embeddings", {"input": TEXTS[1], "encoding_format": "float"})
    np.testing.assert_allclose(body["data"][0]["embedding"], hidden / np.linalg.norm(hidden), atol=1e-5)


@pytest.mark.parametrize("form", ["string", "strings", "token ids", "token id lists"])
def test_every_input_form_embeds_as_its_tokens_do(served, runtime, form):
    ids = [_ids(runtime, text) for text in TEXTS]
    given = {"string": TEXTS[0], "strings": TEXTS, "token ids": ids[0], "token id lists": ids}[form]
    status, body = served.post("/v1/embeddings", {"model": "m", "input": given, "encoding_format": "float"})
    assert status == 200, body
    count = 1 if form in ("string", "token ids") else 2
    assert [item["index"] for item in body["data"]] == list(range(count))
    for item, tokens in zip(body["data"], ids[:count], strict=True):
        _close(item["embedding"], _want(runtime, tokens))
    assert body["usage"]["prompt_tokens"] == sum(len(tokens) for tokens in ids[:count])


def test_dimensions_keep_the_first_values_normalised_again_and_past_the_width_are_refused(served, runtime):
    status, body = served.post("/v1/embeddings", {"input": TEXTS[0], "dimensions": 8, "encoding_format": "float"})
    assert status == 200, body
    full = _want(runtime, _ids(runtime, TEXTS[0]))
    _close(body["data"][0]["embedding"], full[:8] / np.linalg.norm(full[:8]))
    before = served.completer.metrics.prompt_tokens
    status, error = _openai_error(served, {"input": TEXTS, "dimensions": full.shape[0] + 1})
    assert status == 400
    assert error["param"] == "dimensions"
    assert str(full.shape[0]) in error["message"]
    assert served.completer.metrics.prompt_tokens == before  # refused before any input ran on the board


@pytest.mark.parametrize(("given", "param", "words"), [
    ("", "input", "empty"),
    ([], "input", "empty array"),
    ([[]], "input[0]", "non-empty array of token ids"),
    (["a", ""], "input[1]", "empty"),
    ([10 ** 6], "input", "vocabulary"),
    ([3, -1], "input", "vocabulary"),
    ([[3], [10 ** 6]], "input[1]", "vocabulary"),
    ([1.5], "input[0]", "got the number 1.5"),
    ({"text": "a"}, "input", "got an object"),
    (None, "input", "null"),
])
def test_empty_inputs_and_bad_token_ids_are_400s_naming_the_input(served, given, param, words):
    status, error = _openai_error(served, {"input": given})
    assert (status, error["param"]) == (400, param), error
    assert words in error["message"], error


def test_a_body_that_is_not_an_object_is_a_400_not_a_server_error(served):
    for path in ("/v1/embeddings", "/embedding"):
        status, error = _openai_error(served, "input", path)
        assert status == 400, error
        assert "JSON object" in error["message"], error


def test_an_input_past_the_context_is_refused_naming_it(served, runtime):
    status, error = _openai_error(served, {"input": ["short", LONG]})
    assert status == 400
    assert error["param"] == "input[1]"
    assert error["code"] == "context_length_exceeded"
    assert str(runtime.backend.max_context) in error["message"]


def test_pooling_none_is_refused_on_the_openai_route(unpooled):
    status, error = _openai_error(unpooled, {"input": "hello"})
    assert status == 400
    assert "--pooling" in error["message"]


def test_the_route_is_v1_embeddings_alone(served):
    assert served.post("/v1/embedding", {"input": "a"})[0] == 404  # llama-server has no /v1/embedding either
    status, headers, _ = served.request("GET", "/v1/embeddings")
    assert status == 405
    assert headers["Allow"] == "POST"


# ------------------------------------------------------------------------------------------------ llama-server's


@pytest.mark.parametrize("path", ["/embedding", "/embeddings"])
def test_the_native_route_answers_a_list_of_index_and_a_list_of_vectors(served, runtime, path):
    status, body = served.post(path, {"content": TEXTS})
    assert status == 200, body
    assert [set(item) for item in body] == [{"index", "embedding"}] * 2
    assert [item["index"] for item in body] == [0, 1]
    for item, text in zip(body, TEXTS, strict=True):
        assert len(item["embedding"]) == 1
        _close(item["embedding"][0], _want(runtime, _ids(runtime, text)))
    status, single = served.post(path, {"input": _ids(runtime, TEXTS[0])})  # token ids, as 'input'
    assert status == 200
    assert len(single) == 1
    _close(single[0]["embedding"][0], _want(runtime, _ids(runtime, TEXTS[0])))


@pytest.mark.parametrize("norm", [-1, 0, 1, 2, 3])
def test_embd_normalize_normalises_as_common_embd_normalize(served, runtime, norm):
    status, body = served.post("/embedding", {"content": TEXTS[0], "embd_normalize": norm})
    assert status == 200, body
    np.testing.assert_allclose(body[0]["embedding"][0], _want(runtime, _ids(runtime, TEXTS[0]), norm=norm),
                               rtol=1e-5, atol=1e-5 if norm else 1e-1)


@pytest.mark.parametrize(("body", "param"), [
    ({"content": "a", "embd_normalize": -2}, "embd_normalize"),
    ({"content": "a", "embd_normalize": "2"}, "embd_normalize"),
    ({"content": "a", "encoding_format": "int8"}, "encoding_format"),
    ({"prompt": "a"}, "input"),
    ({"content": ""}, "content"),
    ({"content": [10 ** 6]}, "content"),
])
def test_native_bad_fields_are_400s_naming_them(served, body, param):
    status, error = _openai_error(served, body, "/embedding")
    assert (status, error["param"]) == (400, param), error


def test_native_too_long_is_refused(served):
    status, error = _openai_error(served, {"content": LONG}, "/embedding")
    assert status == 400
    assert error["code"] == "context_length_exceeded"


def test_with_pooling_none_the_native_route_gives_every_token_s_vector_unnormalised(unpooled, runtime):
    ids = _ids(runtime, TEXTS[0])
    status, body = unpooled.post("/embedding", {"content": TEXTS[0], "embd_normalize": 2})
    assert status == 200, body
    rows = np.asarray(body[0]["embedding"], dtype=np.float32)
    assert rows.shape == (len(ids), runtime.backend.hidden_states(np.asarray(ids)).shape[1])
    _close(rows, runtime.backend.hidden_states(np.asarray(ids, dtype=np.int64)))  # llama-server normalises pooled only


# ------------------------------------------------------------------------------------------------ Ollama's


def _ollama(server: Served):
    ollama = pytest.importorskip("ollama")
    return ollama, ollama.Client(host=f"http://127.0.0.1:{server.port}")


def _ollama_error(server: Served, path: str, body: object) -> tuple[int, str]:
    status, payload = server.post(path, body)
    assert set(payload) == {"error"}, payload  # Ollama's shape
    assert isinstance(payload["error"], str), payload
    return status, payload["error"]


def test_the_ollama_client_s_embed_gets_unit_vectors_and_its_counts(served, runtime):
    _, client = _ollama(served)
    answer = client.embed(model="tiny-host:latest", input=TEXTS)
    assert answer.model == "tiny-host:latest"
    assert len(answer.embeddings) == 2
    for vector, text in zip(answer.embeddings, TEXTS, strict=True):
        _close(vector, _want(runtime, _ids(runtime, text)))
    assert answer.prompt_eval_count == sum(len(_ids(runtime, text)) for text in TEXTS)
    assert answer.total_duration > 0
    assert answer.load_duration == 0
    one = client.embed(model="tiny-host", input=TEXTS[0], dimensions=8)
    full = _want(runtime, _ids(runtime, TEXTS[0]))
    _close(one.embeddings[0], full[:8] / np.linalg.norm(full[:8]))
    wide = client.embed(model="tiny-host", input=TEXTS[0], dimensions=full.shape[0] + 5)  # Ollama keeps them all
    _close(wide.embeddings[0], full)


def test_the_ollama_client_s_deprecated_embeddings_get_the_vector_not_normalised(served, runtime):
    _, client = _ollama(served)
    answer = client.embeddings(model="tiny-host", prompt=TEXTS[0])
    _close(answer.embedding, _want(runtime, _ids(runtime, TEXTS[0]), norm=-1))
    assert abs(np.linalg.norm(answer.embedding) - 1) > 1e-3
    status, body = served.post("/api/embeddings", {"model": "tiny-host", "prompt": ""})
    assert (status, body) == (200, {"embedding": []})  # an empty prompt loads the model


def test_ollama_embed_truncates_to_the_context_unless_truncate_is_false(served, runtime):
    _, client = _ollama(served)
    ids = _ids(runtime, LONG)
    limit = runtime.backend.max_context
    answer = client.embed(model="tiny-host", input=LONG)
    assert answer.prompt_eval_count == limit
    _close(answer.embeddings[0], _want(runtime, ids[:limit]))
    status, error = _ollama_error(served, "/api/embed", {"model": "tiny-host", "input": LONG, "truncate": False})
    assert status == 400
    assert str(limit) in error
    status, error = _ollama_error(served, "/api/embeddings", {"model": "tiny-host", "prompt": LONG})
    assert status == 400
    assert str(limit) in error


def test_ollama_num_ctx_is_the_window_an_input_is_cut_to(served, runtime):
    ids = _ids(runtime, TEXTS[1])
    status, body = served.post("/api/embed", {"model": "tiny-host", "input": [TEXTS[0], TEXTS[1]],
                                              "options": {"num_ctx": 4, "temperature": 0.5}})
    assert status == 200, body
    assert body["prompt_eval_count"] == 8
    _close(body["embeddings"][1], _want(runtime, ids[:4]))
    status, error = _ollama_error(served, "/api/embed", {"model": "tiny-host", "input": TEXTS[1], "truncate": False,
                                                         "options": {"num_ctx": 4}})
    assert status == 400
    assert "'input'" in error
    assert "num_ctx" in error


def test_ollama_empty_input_loads_the_model_and_bad_input_is_its_400(served):
    for empty in ("", [], None):
        status, body = served.post("/api/embed", {"model": "tiny-host", "input": empty})
        assert (status, body) == (200, {"model": "tiny-host", "embeddings": []})
    for body, words in [({"model": "tiny-host", "input": ["a", 5]}, "'input[1]' must be a string"),
                        ({"model": "tiny-host", "input": [1, 2]}, "'input[0]' must be a string"),
                        ({"model": "tiny-host", "input": ["a", ""]}, "'input[1]' is empty"),
                        ({"model": "tiny-host", "input": "a", "dimensions": -1}, "'dimensions'"),
                        ({"model": "tiny-host", "input": "a", "truncate": "no"}, "'truncate'"),
                        ({"model": "tiny-host", "input": "a", "options": {"num_ctx": "2048"}}, "'options.num_ctx'"),
                        ({"model": "tiny-host", "input": "a", "keep_alive": [1]}, "'keep_alive'"),
                        ({"model": "tiny-host", "prompt": 5}, "'prompt'")]:
        path = "/api/embeddings" if "prompt" in body else "/api/embed"
        status, error = _ollama_error(served, path, body)
        assert status == 400, error
        assert words in error, error
    status, error = _ollama_error(served, "/api/embed", {"model": "llama3", "input": "a"})
    assert status == 404
    assert "not found" in error


def test_ollama_routes_refuse_pooling_none_in_ollama_s_shape(unpooled):
    ollama, client = _ollama(unpooled)
    with pytest.raises(ollama.ResponseError) as caught:
        client.embed(model="tiny-host", input="hello")
    assert caught.value.status_code == 400
    assert "--pooling" in caught.value.error
    status, error = _ollama_error(unpooled, "/api/embeddings", {"model": "tiny-host", "prompt": "hello"})
    assert status == 400
    assert "--pooling" in error


# ------------------------------------------------------------------------------------------------ every route


@pytest.mark.parametrize(("path", "body"), [("/v1/embeddings", {"input": "a"}), ("/embedding", {"content": "a"}),
                                            ("/api/embed", {"model": "tiny-host", "input": "a"})])
def test_an_api_key_guards_the_embedding_routes(runtime, path, body):
    server = Served(runtime, api_key="sesame")
    try:
        status, payload = server.post(path, body)
        assert status == 401
        assert "API key" in str(payload)
        status, payload = server.post(path, body, headers={"Authorization": "Bearer sesame"})
        assert status == 200, payload
    finally:
        server.close()


def test_a_chat_keeps_its_prompt_cache_across_an_embedding_request(runtime):
    """An embedding runs beside the conversation in the KV cache: the chat's next turn still finds its first turn
    there (cached_tokens, timings.cache_n) and answers as it does with no embedding between the turns."""
    first = [{"role": "user", "content": "Tell me about boards."}]

    def two_turns(embed_between: bool) -> dict:
        server = Served(runtime)
        try:
            _, one = server.post("/v1/chat/completions", {"messages": first, "max_tokens": 6})
            if embed_between:
                assert server.post("/v1/embeddings", {"input": TEXTS})[0] == 200
                assert server.post("/api/embed", {"model": "tiny-host", "input": LONG})[0] == 200
            turn = first + [one["choices"][0]["message"], {"role": "user", "content": "And then?"}]
            _, two = server.post("/v1/chat/completions", {"messages": turn, "max_tokens": 6})
            assert two["usage"]["prompt_tokens_details"]["cached_tokens"] >= one["usage"]["prompt_tokens"] - 1
            return two
        finally:
            server.close()

    plain, embedded = two_turns(False), two_turns(True)
    assert embedded["usage"] == plain["usage"]
    assert embedded["timings"]["cache_n"] == plain["timings"]["cache_n"] > 0
    assert embedded["choices"][0]["message"] == plain["choices"][0]["message"]


def test_the_request_log_says_what_was_embedded(runtime, capfd):
    server = Served(runtime)
    server.server.log = True
    try:
        server.post("/v1/embeddings", {"input": TEXTS})
        server.post("/api/embed", {"model": "tiny-host", "input": LONG})
    finally:
        server.close()
    log = capfd.readouterr().err
    tokens = sum(len(runtime.tokenizer.encode(text)) for text in TEXTS)
    assert f"/v1/embeddings: 2 input(s) embedded, {tokens} token(s)" in log
    assert f"/api/embed: 1 input(s) embedded, {runtime.backend.max_context} token(s), 1 cut to the context" in log


def test_serve_pooling_is_the_runtime_s_poolings_and_reaches_the_server(tiny_bundle, tmp_path):
    import json
    import urllib.request

    from edgesdk.cli_serve import serve
    from tests._utils.serve_command import serve_command

    option = next(param for param in serve.params if param.name == "pooling")
    assert tuple(option.type.choices) == POOLINGS
    assert option.default is None  # the model's declared pooling, else mean
    with serve_command(tiny_bundle.path, tmp_path, "--pooling", "mean") as url:
        request = urllib.request.Request(url + "/embedding", json.dumps({"content": TEXTS[0]}).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            body = json.loads(response.read())
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(tiny_bundle.path, threads=1)
    _close(body[0]["embedding"][0], _want(runtime, _ids(runtime, TEXTS[0]), pooling="mean"))
