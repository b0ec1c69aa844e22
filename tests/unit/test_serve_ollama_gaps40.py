"""serve's Ollama API (edgesdk/serve/ollama.py) against Ollama's server/routes.go and api/types.go where the two
could part: unloading with ``keep_alive`` 0, loading, ``keep_alive`` durations, /api/show's capabilities and the
counts of a prompt taken from the KV cache. A real server over the tiny bundle, driven by the real ``ollama`` client
where it can send the request."""

from __future__ import annotations

import json

import pytest

ollama = pytest.importorskip("ollama")

from edgesdk.serve.completion import ServeDefaults  # noqa: E402
from tests.unit.test_serve import Served  # noqa: E402

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}]
NAME = "tiny-host:latest"


@pytest.fixture(scope="module")
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=12))
    yield server
    server.close()


def _client(server: Served) -> ollama.Client:
    return ollama.Client(host=f"http://127.0.0.1:{server.port}")


def _post(server: Served, path: str, body: dict) -> tuple[int, dict]:
    status, _, payload = server.request("POST", path, body)
    return status, json.loads(payload)


def test_keep_alive_zero_with_nothing_to_generate_is_ollama_s_unload_answer(served):
    """server/routes.go: an empty prompt (/api/generate) or no messages (/api/chat) with keep_alive 0 expires the
    runner and answers done with done_reason "unload"; the board's model stays loaded, so /api/ps still lists it."""
    client = _client(served)
    for keep_alive in (0, 0.0, "0", "0s", "0m"):
        generated = client.generate(model=NAME, keep_alive=keep_alive)
        assert (generated.response, generated.done, generated.done_reason) == ("", True, "unload"), keep_alive
        chatted = client.chat(model=NAME, messages=[], keep_alive=keep_alive, stream=False)
        assert (chatted.message.role, chatted.message.content, chatted.done, chatted.done_reason) == \
            ("assistant", "", True, "unload"), keep_alive
    # the bodies Ollama writes: GenerateResponse / ChatResponse with nothing but these set (the metrics omitted)
    status, body = _post(served, "/api/generate", {"model": NAME, "keep_alive": 0})
    assert status == 200, body
    assert set(body) == {"model", "created_at", "response", "done", "done_reason"}
    assert (body["model"], body["response"], body["done"], body["done_reason"]) == (NAME, "", True, "unload")
    status, body = _post(served, "/api/chat", {"model": "tiny-host", "keep_alive": "0s"})
    assert status == 200, body
    assert set(body) == {"model", "created_at", "message", "done", "done_reason"}
    assert (body["model"], body["message"], body["done_reason"]) == \
        ("tiny-host", {"role": "assistant", "content": ""}, "unload")
    assert [model.model for model in client.ps().models] == [NAME]  # still loaded: it answers the next request
    answered = client.chat(model=NAME, messages=MESSAGES, keep_alive=0, stream=False, options={"num_predict": 4})
    assert answered.done_reason in ("stop", "length")  # a request with messages is answered, whatever keep_alive says


def test_nothing_to_generate_without_keep_alive_zero_loads(served):
    """keep_alive absent, above 0 or below 0 (keep loaded): the load answer, done_reason "load"."""
    client = _client(served)
    for keep_alive in (None, "5m", -1, "-1s", 300, "1h30m"):
        generated = client.generate(model=NAME, prompt="", keep_alive=keep_alive)
        assert (generated.response, generated.done_reason) == ("", "load"), keep_alive
        chatted = client.chat(model=NAME, messages=[], keep_alive=keep_alive, stream=False)
        assert (chatted.message.content, chatted.done_reason) == ("", "load"), keep_alive


@pytest.mark.parametrize("keep_alive", ["5 minutes", "-1", "5", "", "1d", "m5", "2562048h", "\u0663s"])
def test_a_keep_alive_that_is_not_a_go_duration_is_refused_as_ollama_refuses_it(served, keep_alive):
    """api/types.go's Duration.UnmarshalJSON parses a string with Go's time.ParseDuration, which refuses a number
    without its unit (other than "0"), unknown units, digits other than ASCII 0-9 and one past time.Duration's int64
    of nanoseconds: Ollama's 400 before anything runs."""
    for path, body in (("/api/chat", {"messages": MESSAGES}), ("/api/generate", {"prompt": "hi"}),
                       ("/api/generate", {})):
        status, payload = _post(served, path, {"model": NAME, **body, "keep_alive": keep_alive})
        assert status == 400, (path, payload)
        assert set(payload) == {"error"}
        assert "'keep_alive'" in payload["error"], payload
        assert "5m" in payload["error"], payload  # the fix: what a duration looks like


def _sentence_transformers(directory):
    """A sentence-transformers model directory (modules.json and a Pooling module of last-token pooling) around a
    tiny model: a model that declares its pooling, as an embedding model does."""
    (directory / "1_Pooling").mkdir(parents=True)
    (directory / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_lasttoken": True}))
    return directory


def test_show_lists_embedding_for_a_model_that_declares_pooling_and_completion_otherwise(served, terse,
                                                                                         tmp_path):
    """server/images.go, Model.Capabilities: a GGUF with pooling_type is "embedding" in place of "completion"; a
    generative model is "completion" only, though /api/embed answers for it (llama3.2 lists completion and tools);
    thinking where the template thinks."""
    pytest.importorskip("torch")
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.runtime.session import open_runtime
    from tests._utils.tiny import save_tiny_model_dir

    generative = _client(served)
    assert generative.show(NAME).capabilities == ["completion", "tools"]
    assert len(generative.embed(model=NAME, input="the board runs cool").embeddings) == 1  # it embeds all the same
    assert _client(terse).show(NAME).capabilities == ["completion", "tools", "thinking"]

    model_dir = _sentence_transformers(save_tiny_model_dir(tmp_path / "embedder"))
    bundle = build(BuildConfig(target="host", model=str(model_dir), out=tmp_path / "b",
                               export=ExportConfig(max_context=64), progress=False))
    assert bundle.manifest["model"]["before"]["pooling"] == "last"
    server = Served(open_runtime(bundle.path, threads=1), ServeDefaults(max_tokens=4))
    try:
        assert _client(server).show("tiny-host").capabilities == ["embedding", "tools"]
    finally:
        server.close()


def test_a_prompt_from_the_kv_cache_counts_whole_as_ollama_s_runner_counts_it(served):
    """Ollama's runner sets prompt_eval_count to the prompt's length when the sequence is made (NewSequence:
    ``numPromptInputs: len(inputs)``), before LoadCacheSlot takes the cached prefix off what it evaluates; only
    prompt_eval_duration shrinks. The same messages again, their prompt in the cache, count the same."""
    client = _client(served)
    first = client.chat(model=NAME, messages=MESSAGES, stream=False, options={"num_predict": 6})
    status, reference = _post(served, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 6})
    assert status == 200, reference
    assert reference["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the cache holds the prompt
    again = client.chat(model=NAME, messages=MESSAGES, stream=False, options={"num_predict": 6})
    assert first.prompt_eval_count == again.prompt_eval_count == reference["usage"]["prompt_tokens"]
    assert again.prompt_eval_duration > 0
    streamed = list(client.generate(model=NAME, prompt="Say something.", system="Be brief.", stream=True,
                                    options={"num_predict": 6}))
    assert streamed[-1].prompt_eval_count == reference["usage"]["prompt_tokens"]
