"""serve's Ollama API (edgesdk/serve/ollama.py) on a real server over the tiny bundle, driven by the real ``ollama``
client: its pydantic types read every answer."""

from __future__ import annotations

import json

import pytest

ollama = pytest.importorskip("ollama")

from edgesdk.serve.completion import ServeDefaults  # noqa: E402
from tests.unit.test_serve import Served  # noqa: E402
from tests.unit.test_tools import LIGHT  # noqa: E402
from tests.unit.test_tools import server as tools_server  # noqa: E402, F401 (a fixture: 2,048 tokens of context)

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}]
NAME = "tiny-host:latest"


@pytest.fixture(scope="module")
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=24))
    yield server
    server.close()


def _client(server: Served, **kwargs) -> ollama.Client:
    return ollama.Client(host=f"http://127.0.0.1:{server.port}", **kwargs)


def _chat_route(server: Served, messages: list, max_tokens: int, **fields) -> dict:
    status, body = server.post("/v1/chat/completions", {"messages": messages, "max_tokens": max_tokens, **fields})
    assert status == 200, body
    return body


def _error(server: Served, path: str, body: dict) -> tuple[int, dict]:
    status, payload = server.post(path, body)
    assert set(payload) == {"error"}, payload  # Ollama's shape
    return status, payload


def test_a_chat_is_the_chat_route_s_answer_whole_and_streamed(served):
    client = _client(served)
    reference = _chat_route(served, MESSAGES, 12)
    whole = client.chat(model=NAME, messages=MESSAGES, stream=False, options={"num_predict": 12})
    assert isinstance(whole, ollama.ChatResponse)
    assert (whole.model, whole.message.role) == (NAME, "assistant")
    # the chat route keeps a character the token limit cut short (U+FFFD), as llama-server does; Ollama's trims it
    assert whole.message.content == reference["choices"][0]["message"]["content"].rstrip("\ufffd")
    assert (whole.done, whole.done_reason) == (True, reference["choices"][0]["finish_reason"])
    assert whole.prompt_eval_count == reference["usage"]["prompt_tokens"]
    assert whole.eval_count == reference["usage"]["completion_tokens"]
    for duration in (whole.total_duration, whole.prompt_eval_duration, whole.eval_duration):
        assert isinstance(duration, int)
        assert duration > 0
    assert whole.load_duration == 0

    parts = list(client.chat(model=NAME, messages=MESSAGES, stream=True, options={"num_predict": 12}))
    assert all(isinstance(part, ollama.ChatResponse) for part in parts)
    assert [part.done for part in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(part.message.content for part in parts) == whole.message.content
    last = parts[-1]
    assert (last.message.content, last.done_reason) == ("", whole.done_reason)
    assert (last.prompt_eval_count, last.eval_count) == (whole.prompt_eval_count, whole.eval_count)


def test_stream_is_the_default_and_is_newline_delimited_json(served):
    status, headers, payload = served.request("POST", "/api/chat", {"model": NAME, "messages": MESSAGES,
                                                                     "options": {"num_predict": 6}})
    assert status == 200, payload
    assert headers["Content-Type"] == "application/x-ndjson"
    lines = payload.decode().splitlines()
    objects = [json.loads(line) for line in lines]
    assert objects[-1]["done"] is True
    assert all(not body["done"] for body in objects[:-1])
    assert payload.endswith(b"\n")


def test_generate_renders_prompt_and_system_as_the_chat_route_and_raw_as_the_text_route(served):
    client = _client(served)
    reference = _chat_route(served, MESSAGES, 10)
    whole = client.generate(model=NAME, prompt="Say something.", system="Be brief.", stream=False,
                            options={"num_predict": 10})
    assert isinstance(whole, ollama.GenerateResponse)
    assert whole.response == reference["choices"][0]["message"]["content"]
    assert (whole.prompt_eval_count, whole.eval_count) == (reference["usage"]["prompt_tokens"],
                                                           reference["usage"]["completion_tokens"])
    assert whole.context  # the conversation's token ids, to send back (test_serve_ollama_context41.py)
    parts = list(client.generate(model=NAME, prompt="Say something.", system="Be brief.",
                                 options={"num_predict": 10}, stream=True))
    assert "".join(part.response for part in parts) == whole.response
    assert parts[-1].done
    assert parts[-1].eval_count == whole.eval_count

    status, text = served.post("/v1/completions", {"prompt": "Once upon", "max_tokens": 8})
    assert status == 200, text
    raw = client.generate(model=NAME, prompt="Once upon", raw=True, options={"num_predict": 8})
    assert raw.response == text["choices"][0]["text"]
    assert raw.context is None  # a raw answer carries no context, as Ollama's
    assert raw.prompt_eval_count == text["usage"]["prompt_tokens"]


def test_an_empty_prompt_or_no_messages_loads_the_model(served):
    client = _client(served)
    loaded = client.generate(model=NAME)
    assert (loaded.response, loaded.done, loaded.done_reason) == ("", True, "load")
    loaded = client.chat(model=NAME, messages=[], stream=False)
    assert (loaded.message.content, loaded.done, loaded.done_reason) == ("", True, "load")


def test_stop_options_and_unknown_options(served):
    client = _client(served)
    whole = client.chat(model=NAME, messages=MESSAGES, stream=False, options={"num_predict": 16})
    text = whole.message.content
    assert len(text) > 4
    stops = [text[2:4], "never", "seen", "here", "at all"]  # more than OpenAI's 4: Ollama takes any number
    cut = client.chat(model=NAME, messages=MESSAGES, stream=False, options={"num_predict": 16, "stop": stops})
    assert cut.message.content == text[:text.index(text[2:4])]
    # an option Ollama does not know is ignored (Ollama warns, "invalid option provided"), load settings change
    # nothing here, and samplers set off are taken
    same = client.chat(model=NAME, messages=MESSAGES, stream=False,
                       options={"num_predict": 16, "rope_frequency_base": 5, "num_gpu": 1, "num_thread": 2,
                                "mirostat": 0, "typical_p": 1.0, "temperature": 0, "seed": 1, "top_k": 1})
    assert same.message.content == text


def test_format_json_and_a_schema_are_the_chat_route_s_response_formats(served):
    client = _client(served)
    reference = _chat_route(served, MESSAGES, 24, response_format={"type": "json_object"})
    answer = client.chat(model=NAME, messages=MESSAGES, format="json", stream=False, options={"num_predict": 24})
    assert answer.message.content == reference["choices"][0]["message"]["content"]
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    reference = _chat_route(served, MESSAGES, 24, response_format={"type": "json_schema",
                                                                   "json_schema": {"name": "x", "schema": schema}})
    answer = client.chat(model=NAME, messages=MESSAGES, format=schema, stream=False, options={"num_predict": 24})
    assert answer.message.content == reference["choices"][0]["message"]["content"]
    plain = client.chat(model=NAME, messages=MESSAGES, stream=False, options={"num_predict": 24})
    assert plain.message.content != answer.message.content  # the format did shape the answer


def test_tags_show_ps_version_and_the_root_probe(served, tiny_bundle):
    client = _client(served)
    listed = client.list()
    assert [model.model for model in listed.models] == [NAME]
    entry = listed.models[0]
    manifest = tiny_bundle.manifest
    assert entry.size == sum(info["size"] for info in manifest["files"].values())
    assert (entry.details.family, entry.details.quantization_level) == ("llama", "F32")
    assert entry.details.parameter_size == f"{manifest['model']['after']['parameters'] / 1e3:.0f}K"
    shown = client.show(NAME)
    assert isinstance(shown, ollama.ShowResponse)
    assert shown.capabilities == ["completion", "tools"]
    assert shown.modelinfo["llama.context_length"] == 256
    assert shown.template == (tiny_bundle.path / "chat_template.jinja").read_text()
    assert client.show("tiny-host").details == shown.details  # the name without its tag is the same model
    running = client.ps()
    assert running.models[0].context_length == 256
    assert running.models[0].model == NAME
    status, version = served.post("/api/version", {})
    assert status == 405
    assert set(version) == {"error"}
    status, _, payload = served.request("GET", "/api/version")
    assert status == 200
    assert isinstance(json.loads(payload)["version"], str)
    for method in ("GET", "HEAD"):
        status, headers, payload = served.request(method, "/")
        assert status == 200
        assert headers["Content-Type"].startswith("text/plain")
        assert payload == (b"Ollama is running" if method == "GET" else b"")


@pytest.mark.parametrize(("path", "body", "status", "named"), [
    ("/api/chat", {"model": "llama3.2", "messages": MESSAGES}, 404, "model 'llama3.2' not found"),
    ("/api/show", {"model": "llama3.2"}, 404, "model 'llama3.2' not found"),
    ("/api/chat", {"messages": MESSAGES}, 400, "'model' is required"),
    ("/api/chat", {"model": NAME, "messages": MESSAGES, "options": {"temperature": "hot"}}, 400,
     "'options.temperature'"),
    ("/api/chat", {"model": NAME, "messages": MESSAGES, "options": {"num_predict": "3"}}, 400, "'options.num_predict'"),
    ("/api/chat", {"model": NAME, "messages": MESSAGES, "options": {"typical_p": 0.5}}, 400, "'options.typical_p'"),
    ("/api/chat", {"model": NAME, "messages": MESSAGES, "options": {"stop": "x"}}, 400, "'options.stop'"),
    ("/api/chat", {"model": NAME, "messages": MESSAGES, "options": {"num_ctx": "2048"}}, 400, "'options.num_ctx'"),
    ("/api/chat", {"model": NAME, "messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}, 400,
     "messages[0].images"),
    ("/api/chat", {"model": NAME, "messages": [{"role": 5, "content": "hi"}]}, 400, "messages[0].role"),
    ("/api/chat", {"model": NAME, "messages": MESSAGES, "format": "yaml"}, 400, "'format'"),
    ("/api/chat", {"model": NAME, "messages": MESSAGES, "think": True}, 400, "does not support thinking"),
    ("/api/chat", {"model": NAME, "messages": MESSAGES, "keep_alive": [5]}, 400, "'keep_alive'"),
    ("/api/generate", {"model": NAME, "prompt": "def f():", "suffix": "return 1"}, 400, "'suffix'"),
    ("/api/generate", {"model": NAME, "prompt": "hi", "images": ["aGk="]}, 400, "'images'"),
    ("/api/generate", {"model": NAME, "prompt": "hi", "context": [1, 2, 10**9]}, 400, "'context[2]' is 1000000000"),
    ("/api/generate", {"model": NAME, "prompt": "hi", "context": "1 2"}, 400, "'context'"),
    ("/api/generate", {"model": NAME, "prompt": "hi", "template": "{{ .Prompt }}"}, 400, "'template'"),
    ("/api/generate", {"model": NAME, "prompt": 5}, 400, "'prompt'"),
])
def test_bad_requests_get_ollama_s_error_naming_the_field(served, path, body, status, named):
    got, payload = _error(served, path, body)
    assert got == status, payload
    assert named in payload["error"], payload


def test_the_client_raises_ollama_s_errors(served):
    client = _client(served)
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model="llama3.2", messages=MESSAGES)
    assert caught.value.status_code == 404
    assert "not found" in caught.value.error
    with pytest.raises(ollama.ResponseError) as caught:
        client.generate(model=NAME, prompt="hi", options={"top_p": "high"}, stream=False)
    assert caught.value.status_code == 400
    assert "'options.top_p'" in caught.value.error


def test_num_ctx_above_the_context_is_capped_and_below_it_bounds_the_answer(served):
    client = _client(served)
    whole = client.chat(model=NAME, messages=MESSAGES, stream=False, options={"num_predict": 12})
    capped = client.chat(model=NAME, messages=MESSAGES, stream=False, options={"num_predict": 12, "num_ctx": 8192})
    assert capped.message.content == whole.message.content
    window = whole.prompt_eval_count + 3
    # Ollama's runner shifts a full num_ctx and goes on (the default); with shift false the answer ends there
    shifted = client.chat(model=NAME, messages=MESSAGES, stream=False, options={"num_predict": 12, "num_ctx": window})
    assert (shifted.eval_count, shifted.done_reason) == (12, "length")
    status, short = served.post("/api/chat", {"model": NAME, "messages": MESSAGES, "stream": False, "shift": False,
                                              "options": {"num_predict": 12, "num_ctx": window}})
    assert status == 200, short
    assert (short["eval_count"], short["done_reason"]) == (3, "length")
    assert whole.message.content.startswith(short["message"]["content"])
    assert shifted.message.content.startswith(short["message"]["content"])
    # a prompt that fills num_ctx: with truncate false Ollama's 400; with truncate on (its default) cut as its
    # runner cuts the input, leaving the answer's first token its room (tests/unit/test_ollama49c.py)
    status, payload = _error(served, "/api/chat", {"model": NAME, "messages": MESSAGES, "truncate": False,
                                                   "options": {"num_ctx": whole.prompt_eval_count}})
    assert status == 400
    assert "'options.num_ctx'" in payload["error"]
    status, cut = served.post("/api/chat", {"model": NAME, "messages": MESSAGES, "stream": False,
                                            "options": {"num_ctx": whole.prompt_eval_count}})
    assert status == 200, cut
    assert cut["prompt_eval_count"] < whole.prompt_eval_count
    status, until_full = served.post("/api/chat", {"model": NAME, "messages": MESSAGES, "stream": False,
                                                   "shift": False, "options": {"num_predict": -2, "num_ctx": window}})
    assert (status, until_full["eval_count"]) == (200, 3)


def test_the_api_key_applies_and_the_root_probe_stays_open(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=4), api_key="sesame")
    try:
        with pytest.raises(ollama.ResponseError) as caught:
            _client(server).list()
        assert caught.value.status_code == 401
        status, payload = _error(server, "/api/chat", {"model": NAME, "messages": MESSAGES})
        assert status == 401
        keyed = _client(server, headers={"Authorization": "Bearer sesame"})
        assert keyed.list().models[0].model == NAME
        assert keyed.chat(model=NAME, messages=MESSAGES, stream=False).done
        status, _, payload = server.request("GET", "/")
        assert (status, payload) == (200, b"Ollama is running")
    finally:
        server.close()


TOOL_MESSAGES = [{"role": "user", "content": "Turn the lamp on."}]


@pytest.fixture(scope="module")
def calling(tmp_path_factory):
    """A lively tiny model (tests/_utils/builds.py) with 2,048 tokens of context that, offered the lamp tool, calls
    it unasked (Ollama's chat has no tool_choice: the model chooses)."""
    from edgesdk.runtime.session import open_runtime
    from tests._utils.builds import build_lively_bundle

    bundle = build_lively_bundle(tmp_path_factory.mktemp("ollama-tools"), seed=3, max_context=2048)
    server = Served(open_runtime(bundle.path, threads=1), ServeDefaults(max_tokens=120))
    yield server
    server.close()


def test_tool_calls_are_the_chat_route_s_with_arguments_as_an_object(calling):
    client = _client(calling)
    reference = _chat_route(calling, TOOL_MESSAGES, 120, tools=[LIGHT])
    assert reference["choices"][0]["finish_reason"] == "tool_calls"
    call = reference["choices"][0]["message"]["tool_calls"][0]["function"]
    expected = [(call["name"], json.loads(call["arguments"]))]
    whole = client.chat(model=NAME, messages=TOOL_MESSAGES, tools=[LIGHT], stream=False, options={"num_predict": 120})
    assert [(c.function.name, dict(c.function.arguments)) for c in whole.message.tool_calls] == expected
    assert (whole.message.content, whole.done_reason) == ("", "stop")
    assert (whole.prompt_eval_count, whole.eval_count) == (reference["usage"]["prompt_tokens"],
                                                           reference["usage"]["completion_tokens"])
    parts = list(client.chat(model=NAME, messages=TOOL_MESSAGES, tools=[LIGHT], stream=True,
                             options={"num_predict": 120}))
    streamed = [call for part in parts for call in (part.message.tool_calls or [])]
    assert [(c.function.name, dict(c.function.arguments)) for c in streamed] == expected
    assert "".join(part.message.content for part in parts) == ""
    assert parts[-1].done
    assert parts[-1].eval_count == whole.eval_count
    # the raw answer: arguments as a JSON object, not a string
    status, body = calling.post("/api/chat", {"model": NAME, "messages": TOOL_MESSAGES, "tools": [LIGHT],
                                              "stream": False, "options": {"num_predict": 120}})
    assert status == 200
    assert isinstance(body["message"]["tool_calls"][0]["function"]["arguments"], dict)


def test_an_earlier_call_and_its_result_render_as_on_the_chat_route(tools_server):  # noqa: F811
    client = _client(tools_server)
    # the id the Ollama route gives a call sent without one (call_<message>_<call>), which its result's text names
    openai_messages = [*TOOL_MESSAGES,
                       {"role": "assistant", "content": None,
                        "tool_calls": [{"id": "call_1_0", "type": "function",
                                        "function": {"name": "set_light", "arguments": "{\"on\": true}"}}]},
                       {"role": "tool", "tool_call_id": "call_1_0", "content": "done"}]
    reference = _chat_route(tools_server, openai_messages, 8, tools=[LIGHT])
    ollama_messages = [*TOOL_MESSAGES,
                       {"role": "assistant", "content": "",
                        "tool_calls": [{"function": {"name": "set_light", "arguments": {"on": True}}}]},
                       {"role": "tool", "tool_name": "set_light", "content": "done"}]
    whole = client.chat(model=NAME, messages=ollama_messages, tools=[LIGHT], stream=False, options={"num_predict": 8})
    assert whole.prompt_eval_count == reference["usage"]["prompt_tokens"]
    assert whole.eval_count == reference["usage"]["completion_tokens"]
    # a result without its tool's name answers the call before it, as a tool message with that call's id does
    unnamed = [*ollama_messages[:2], {"role": "tool", "content": "done"}]
    again = client.chat(model=NAME, messages=unnamed, tools=[LIGHT], stream=False, options={"num_predict": 8})
    assert again.prompt_eval_count == reference["usage"]["prompt_tokens"]
