"""serve's Ollama API (edgesdk/serve/ollama.py) where Ollama's server/routes.go decides: /api/generate's deprecated
``context`` both ways (the last object of an answer that is not raw carries ``Tokenize(prompt + answer)``; a request's
``context`` is detokenized and put in front of the rendered prompt), the capabilities checked before a model loads
(``think``, completion, insert, in that order) and an embedding model refused on /api/chat and /api/generate. A real
server over tiny bundles built by the real pipeline, driven by the real ``ollama`` client where it can send the
request; the expected prompts come from the server's own /apply-template, /tokenize and /detokenize routes."""

from __future__ import annotations

import json

import pytest

ollama = pytest.importorskip("ollama")

from edgesdk.serve import ollama as ollama_api  # noqa: E402
from edgesdk.serve.api import ApiError  # noqa: E402
from edgesdk.serve.completion import ServeDefaults  # noqa: E402
from tests._utils.ollama_calls import ollama_client as _client  # noqa: E402
from tests._utils.ollama_calls import post_error as _error  # noqa: E402
from tests._utils.ollama_calls import post_ok as _ok  # noqa: E402
from tests.unit.test_serve import Served  # noqa: E402

NAME = "tiny-host:latest"
SYSTEM, PROMPT = "Be brief.", "Say something."


@pytest.fixture(scope="module")
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=12))
    yield server
    server.close()


def _rendered(server: Served, prompt: str, system: str | None = None) -> str:
    """The prompt /api/generate renders from ``prompt`` and ``system``: the chat route's rendering of the same
    messages."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return _ok(server, "/apply-template", {"messages": messages})["prompt"]


def _ids(server: Served, text: str) -> list[int]:
    """Ollama's ``Tokenize``: special tokens read, none added (llama-server's /tokenize defaults)."""
    return _ok(server, "/tokenize", {"content": text, "add_special": False, "parse_special": True})["tokens"]


def _text(server: Served, ids: list[int]) -> str:
    """Ollama's ``Detokenize``: each token's piece, special tokens written out (llama-server's /detokenize)."""
    return _ok(server, "/detokenize", {"tokens": ids})["content"]


# ------------------------------------------------------------------------------------------------ context


def test_a_generate_answer_ends_with_the_token_ids_of_its_prompt_and_answer(served):
    """routes.go, GenerateHandler: the done object of a request that is not raw carries ``context``,
    ``r.Tokenize(prompt + answer)``; the stream's earlier objects, a raw answer and /api/chat carry none."""
    client = _client(served)
    whole = client.generate(model=NAME, prompt=PROMPT, system=SYSTEM, stream=False, options={"num_predict": 8})
    assert whole.response
    assert list(whole.context) == _ids(served, _rendered(served, PROMPT, SYSTEM) + whole.response)
    parts = list(client.generate(model=NAME, prompt=PROMPT, system=SYSTEM, stream=True, options={"num_predict": 8}))
    assert [part.context for part in parts[:-1]] == [None] * (len(parts) - 1)
    assert list(parts[-1].context) == list(whole.context)

    raw = _ok(served, "/api/generate", {"model": NAME, "prompt": "Once upon", "raw": True, "stream": False,
                                        "options": {"num_predict": 4}})
    assert "context" not in raw
    chatted = _ok(served, "/api/chat", {"model": NAME, "stream": False, "options": {"num_predict": 4},
                                        "messages": [{"role": "user", "content": PROMPT}]})
    assert "context" not in chatted


def test_a_context_sent_back_goes_in_front_of_the_prompt_and_the_conversation_grows(served):
    """routes.go: ``r.Detokenize(req.Context)`` is written first and the prompt rendered from ``prompt`` after it,
    the whole sent to the model as one text. The answer is that of /completion over the same token ids, and each
    turn's context begins with the one sent (LangChain's Ollama LLM and ollama-python's examples send it back)."""
    client = _client(served)
    first = client.generate(model=NAME, prompt=PROMPT, stream=False, options={"num_predict": 6})
    context = list(first.context)
    for turn in ("And then?", "Why?"):
        expected = _ids(served, _text(served, context) + _rendered(served, turn))
        completed = _ok(served, "/completion", {"prompt": expected, "n_predict": 6})
        answer = client.generate(model=NAME, prompt=turn, context=context, stream=False, options={"num_predict": 6})
        assert answer.response == completed["content"]
        assert answer.prompt_eval_count == len(expected)
        assert list(answer.context[:len(context)]) == context  # the conversation so far, then this turn
        assert list(answer.context) == _ids(served, _text(served, context) + _rendered(served, turn) + answer.response)
        streamed = list(client.generate(model=NAME, prompt=turn, context=context, stream=True,
                                        options={"num_predict": 6}))
        assert "".join(part.response for part in streamed) == answer.response
        assert list(streamed[-1].context) == list(answer.context)
        context = list(answer.context)
    # an empty context changes nothing, as an empty detokenized text in front changes nothing in Ollama
    again = client.generate(model=NAME, prompt=PROMPT, context=[], stream=False, options={"num_predict": 6})
    assert (again.response, list(again.context)) == (first.response, list(first.context))


@pytest.mark.parametrize(("context", "named"), [
    ([5, 10**9], "'context[1]' is 1000000000"),
    ([-1], "'context[0]' is -1"),
])
def test_a_context_id_outside_the_vocabulary_is_refused_naming_it(served, context, named):
    vocabulary = served.completer.token_id_limit()
    status, error = _error(served, "/api/generate", {"model": NAME, "prompt": PROMPT, "context": context})
    assert status == 400
    assert named in error
    assert f"{vocabulary} ids, 0 to {vocabulary - 1}" in error  # the vocabulary's size
    with pytest.raises(ollama.ResponseError) as caught:
        _client(served).generate(model=NAME, prompt=PROMPT, context=context, stream=False)
    assert caught.value.status_code == 400


@pytest.mark.parametrize("context", ["1 2 3", [1, "2"], [1.5], [True], {"0": 1}, 7])
def test_a_context_that_is_not_an_array_of_token_ids_is_refused(served, context):
    status, error = _error(served, "/api/generate", {"model": NAME, "prompt": PROMPT, "context": context})
    assert status == 400
    assert "'context' must be an array of token ids" in error


def test_context_or_system_with_raw_is_refused_after_the_unload_answer_as_ollama_orders_them(served):
    """routes.go: "raw mode does not support template, system, or context", checked after the unload answer
    (an empty prompt and keep_alive 0) and before the load answer."""
    for field, value in (("context", [5, 6]), ("system", "Be brief.")):
        for prompt in ("Once upon", ""):
            status, error = _error(served, "/api/generate", {"model": NAME, "prompt": prompt, "raw": True,
                                                             field: value})
            assert status == 400
            assert "raw mode does not support template, system, or context" in error
            assert f"'{field}' cannot be sent with 'raw': true" in error
        unloaded = _ok(served, "/api/generate", {"model": NAME, "raw": True, field: value, "keep_alive": 0})
        assert unloaded["done_reason"] == "unload"
    raw = _ok(served, "/api/generate", {"model": NAME, "prompt": "Once upon", "raw": True, "system": "",
                                        "stream": False, "options": {"num_predict": 3}})
    assert raw["done"]  # an empty system, as Go's empty string, is no system
    raw = _ok(served, "/api/generate", {"model": NAME, "prompt": "Once upon", "raw": True, "context": [],
                                        "stream": False, "options": {"num_predict": 3}})
    assert raw["done"]


def test_a_context_that_leaves_no_room_is_cut_as_ollamas_runner_cuts_its_input(served):
    """A context that leaves the prompt no room: Ollama's runner (runner/ollamarunner/runner.go ``NewSequence``,
    ``truncate`` true by default) keeps the input's first ``num_keep`` tokens and its end, so the prompt after the
    context is answered (it was a 400 naming 'context'); ``truncate`` false is Ollama's refusal."""
    limit = served.completer.runtime.backend.max_context
    filler = _ids(served, "the board runs cool " * 200)[:limit]
    answered = _ok(served, "/api/generate", {"model": NAME, "prompt": PROMPT, "context": filler, "stream": False,
                                             "options": {"num_predict": 2}})
    assert answered["prompt_eval_count"] == limit - 1
    assert answered["context"][:limit] == filler  # the whole conversation sent back, as Ollama's Tokenize(prompt + answer)
    status, error = _error(served, "/api/generate", {"model": NAME, "prompt": PROMPT, "context": filler,
                                                     "truncate": False})
    assert status == 400
    assert error.startswith("the input length exceeds the context length: ")
    assert f"context of {limit}" in error


# ------------------------------------------------------------------------------------------------ context and suffix


from tests.unit import test_serve_infill40 as infill40  # noqa: E402

qwen_bundle, qwen_runtime, fim_served = infill40.qwen_bundle, infill40.qwen_runtime, infill40.fim_served


def test_a_suffix_s_answer_carries_context_and_takes_one_in_front_of_its_prompt(fim_served, qwen_runtime):
    """routes.go's template flow (a suffix): the detokenized context, then the fill-in-the-middle prompt; the answer
    carries the context of the whole."""
    client = _client(fim_served)
    ids = infill40._expected(qwen_runtime.tokenizer, infill40.PREFIX, infill40.SUFFIX)
    first = client.generate(model=NAME, prompt=infill40.PREFIX, suffix=infill40.SUFFIX, stream=False,
                            options={"num_predict": 4})
    assert list(first.context) == _ids(fim_served, _text(fim_served, ids) + first.response)
    context = list(first.context)
    expected = _ids(fim_served, _text(fim_served, context)) + ids
    completed = _ok(fim_served, "/completion", {"prompt": expected, "n_predict": 4})
    again = client.generate(model=NAME, prompt=infill40.PREFIX, suffix=infill40.SUFFIX, context=context,
                            stream=False, options={"num_predict": 4})
    assert again.response == completed["content"]
    assert again.prompt_eval_count == len(expected)
    raw = client.generate(model=NAME, prompt=infill40.PREFIX, suffix=infill40.SUFFIX, raw=True, stream=False,
                          options={"num_predict": 2})
    assert raw.context is None


# ------------------------------------------------------------------------------------------------ capabilities


def test_think_on_a_model_that_does_not_think_is_refused_raw_or_not(served):
    """routes.go checks ``think`` against the thinking capability before anything else about the prompt, raw too."""
    for body in ({"prompt": PROMPT}, {"prompt": "Once upon", "raw": True}):
        status, error = _error(served, "/api/generate", {"model": NAME, **body, "think": True, "stream": False})
        assert status == 400
        assert f'"{NAME}" does not support thinking' in error


def test_a_load_request_is_checked_as_ollama_checks_it_before_loading(served, terse):
    """routes.go: ``think`` (ChatHandler and GenerateHandler) and the insert capability of a ``suffix`` are checked
    before the model is scheduled, so before the "load" answer; the "unload" answer comes before either."""
    completer = served.completer
    for parse, body in ((ollama_api.parse_chat, {"messages": []}), (ollama_api.parse_generate, {"prompt": ""})):
        asked = parse({"model": NAME, **body, "think": True}, "tiny-host")
        with pytest.raises(ApiError) as caught:
            ollama_api.loaded(asked, completer)
        assert (caught.value.status, caught.value.param) == (400, "think")
        assert f'"{NAME}" does not support thinking' in caught.value.message
        assert ollama_api.loaded(parse({"model": NAME, **body, "think": False}, "tiny-host"),
                                 completer)["done_reason"] == "load"
        unloading = parse({"model": NAME, **body, "think": True, "keep_alive": 0}, "tiny-host")
        assert ollama_api.loaded(unloading, completer)["done_reason"] == "unload"
        thinking = parse({"model": NAME, **body, "think": True}, "tiny-host")
        assert ollama_api.loaded(thinking, terse.completer)["done_reason"] == "load"  # its template thinks
    with pytest.raises(ApiError) as caught:
        ollama_api.loaded(ollama_api.parse_generate({"model": NAME, "suffix": "x"}, "tiny-host"), completer)
    assert "does not support insert" in caught.value.message


def _sentence_transformers(directory):
    """A sentence-transformers model directory (modules.json and a Pooling module of mean pooling) around a tiny
    model: a model that declares its pooling, as an embedding model does."""
    (directory / "1_Pooling").mkdir(parents=True)
    (directory / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    return directory


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    pytest.importorskip("torch")
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.runtime.session import open_runtime
    from tests._utils.tiny import save_tiny_model_dir

    root = tmp_path_factory.mktemp("embedder41")
    model_dir = _sentence_transformers(save_tiny_model_dir(root / "model"))
    bundle = build(BuildConfig(target="host", model=str(model_dir), out=root / "b",
                               export=ExportConfig(max_context=64), progress=False))
    assert bundle.manifest["model"]["before"]["pooling"] == "mean"
    server = Served(open_runtime(bundle.path, threads=1), ServeDefaults(max_tokens=4))
    yield server
    server.close()


def _chat(client: ollama.Client, stream: bool):
    """/api/chat's answer, whole or every object of its stream (where the client raises an error)."""
    answer = client.chat(model=NAME, messages=[{"role": "user", "content": PROMPT}], stream=stream)
    return list(answer) if stream else answer


def test_an_embedding_model_does_not_answer_chat_or_generate(embedder):
    """images.go: a model that declares its pooling has "embedding" in place of "completion", and routes.go refuses
    it: 400 ``"<model>" does not support chat`` / ``generate``, raw or not, streamed or not. /api/embed answers, and
    llama-server's and OpenAI's routes still serve it, as llama-server does."""
    client = _client(embedder)
    assert "completion" not in client.show(NAME).capabilities
    for stream in (False, True):
        with pytest.raises(ollama.ResponseError) as caught:
            _chat(client, stream)
        assert caught.value.status_code == 400
        assert f'"{NAME}" does not support chat' in caught.value.error
        assert "/api/embed" in caught.value.error  # the fix
    for body in ({"prompt": PROMPT}, {"prompt": "Once upon", "raw": True}, {"prompt": "def f():", "suffix": "x"}):
        status, error = _error(embedder, "/api/generate", {"model": NAME, **body})
        assert status == 400
        assert f'"{NAME}" does not support generate' in error  # before insert, as CheckCapabilities orders them
    # think first, as routes.go checks it before scheduleRunner's capability check
    status, error = _error(embedder, "/api/chat", {"model": NAME, "think": True,
                                                   "messages": [{"role": "user", "content": PROMPT}]})
    assert (status, "does not support thinking" in error) == (400, True)
    assert len(client.embed(model=NAME, input="the board runs cool").embeddings) == 1
    assert _ok(embedder, "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}],
                                                  "max_tokens": 2})["choices"]
    # a load request too, where the server hands its completer over (routes.go checks before loading)
    for parse, body, route in ((ollama_api.parse_chat, {}, "chat"), (ollama_api.parse_generate, {}, "generate")):
        with pytest.raises(ApiError) as caught:
            ollama_api.loaded(parse({"model": NAME, **body}, "tiny-host"), embedder.completer)
        assert f'"{NAME}" does not support {route}' in caught.value.message


def test_a_load_request_over_http_is_checked_before_the_load_answer(served):
    """The server hands its completer to the load answer, so a client's load request (no messages, an empty prompt)
    with ``think`` true meets the same 400 as Ollama's, not "load"."""
    for path, body in (("/api/chat", {"messages": []}), ("/api/generate", {"prompt": ""})):
        status, error = _error(served, path, {"model": NAME, **body, "think": True, "stream": False})
        assert status == 400, (path, error)
        assert f'"{NAME}" does not support thinking' in error
