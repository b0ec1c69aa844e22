"""serve's Ollama API (edgesdk/serve/ollama.py) against what Ollama's clients send and read: ``logprobs`` and
``top_logprobs``, a thinking model's ``thinking``, the request shapes of Home Assistant's Ollama integration, Open
WebUI's Ollama proxy and the ``ollama`` Python client with every argument, on a real server over tiny bundles."""

from __future__ import annotations

import json
import socket
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ollama = pytest.importorskip("ollama")

from edgesdk.serve.completion import ServeDefaults  # noqa: E402
from tests.unit.test_serve import HeldHook, Served  # noqa: E402
from tests.unit.test_serve_ollama39 import MESSAGES, NAME, _client  # noqa: E402
from tests.unit.test_tools import LIGHT  # noqa: E402
from tests.unit.test_tools import server as tools_server  # noqa: E402, F401 (a fixture: 2,048 tokens of context)

ASK = [{"role": "user", "content": "Tell me about the fox."}]  # tests/unit/test_serve_reasoning.py's question


@pytest.fixture(scope="module")
def served(runtime):
    """A server answering 24 tokens unless asked otherwise, over the tiny bundle's runtime (tests/unit/conftest.py)."""
    server = Served(runtime, ServeDefaults(max_tokens=24))
    yield server
    server.close()


def _lines(server: Served, path: str, body: dict) -> list[dict]:
    """The objects of an Ollama stream, each line one JSON object, the last one ``done`` (or an error)."""
    status, headers, payload = server.request("POST", path, {**body, "stream": True})
    assert status == 200, payload
    assert headers["Content-Type"] == "application/x-ndjson"
    assert payload.endswith(b"\n")
    return [json.loads(line) for line in payload.decode().split("\n")[:-1]]


def _ollama_form(entries: list[dict]) -> list[dict]:
    """The chat route's ``logprobs.content`` (or POST /completion's ``completion_probabilities``) as Ollama lists
    them: ``token``, ``logprob``, ``bytes``, and ``top_logprobs`` where there are any."""
    def shown(entry: dict) -> dict:
        return {"token": entry["token"], "logprob": entry["logprob"], "bytes": entry["bytes"]}

    return [{**shown(e), **({"top_logprobs": [shown(t) for t in e["top_logprobs"]]} if e["top_logprobs"] else {})}
            for e in entries]


def _same(got: list[dict], expected: list[dict]) -> None:
    """The same entries: tokens and bytes exactly, log-probabilities to within float rounding (a prompt evaluated
    again from the prompt cache's reused prefix sums in another order: float32 logits of a few units, which differ
    in their sixth or seventh significant digit)."""
    def rounded(entries: list[dict]) -> list[dict]:
        return [{**e, "logprob": pytest.approx(e["logprob"], abs=1e-5),
                 **({"top_logprobs": rounded(e["top_logprobs"])} if "top_logprobs" in e else {})} for e in entries]

    assert got == rounded(expected)


# ------------------------------------------------------------------------------------------------ logprobs


def test_logprobs_are_the_chat_route_s_whole_and_streamed(served):
    status, reference = served.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 8, "logprobs": True,
                                                             "top_logprobs": 3})
    assert status == 200, reference
    expected = _ollama_form(reference["choices"][0]["logprobs"]["content"])
    assert len(expected) == 8
    assert all(len(entry["top_logprobs"]) == 3 for entry in expected)
    client = _client(served)
    whole = client.chat(model=NAME, messages=MESSAGES, stream=False, logprobs=True, top_logprobs=3,
                        options={"num_predict": 8})
    assert isinstance(whole.logprobs[0], ollama._types.Logprob)  # the client's types read them
    assert whole.message.content == reference["choices"][0]["message"]["content"]
    status, raw = served.post("/api/chat", {"model": NAME, "messages": MESSAGES, "stream": False, "logprobs": True,
                                            "top_logprobs": 3, "options": {"num_predict": 8}})
    assert status == 200, raw
    _same(raw["logprobs"], expected)
    assert "logprobs" not in raw["message"]  # at the top, beside the message, as Ollama answers
    lines = _lines(served, "/api/chat", {"model": NAME, "messages": MESSAGES, "logprobs": True, "top_logprobs": 3,
                                         "options": {"num_predict": 8}})
    _same([entry for line in lines for entry in line.get("logprobs", [])], expected)
    assert lines[-1]["done"] is True
    # each streamed object lists the tokens of its own text
    for line in lines[:-1]:
        assert "".join(entry["token"] for entry in line["logprobs"]) == line["message"]["content"]
    # top_logprobs 0: each token's own log-probability alone, no empty top_logprobs (Ollama leaves it out)
    status, alone = served.post("/api/chat", {"model": NAME, "messages": MESSAGES, "stream": False, "logprobs": True,
                                              "options": {"num_predict": 8}})
    assert status == 200, alone
    _same(alone["logprobs"], [{key: e[key] for key in ("token", "logprob", "bytes")} for e in expected])


def test_generate_logprobs_templated_and_raw(served):
    status, reference = served.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 6, "logprobs": True,
                                                             "top_logprobs": 2})
    assert status == 200, reference
    body = {"model": NAME, "prompt": "Say something.", "system": "Be brief.", "logprobs": True, "top_logprobs": 2,
            "options": {"num_predict": 6}}
    status, whole = served.post("/api/generate", {**body, "stream": False})
    assert status == 200, whole
    _same(whole["logprobs"], _ollama_form(reference["choices"][0]["logprobs"]["content"]))
    _same([e for line in _lines(served, "/api/generate", body) for e in line.get("logprobs", [])], whole["logprobs"])
    # raw: the text as given, its tokens' log-probabilities those of llama-server's POST /completion
    status, native = served.post("/completion", {"prompt": "Once upon", "n_predict": 5, "n_probs": 2})
    assert status == 200, native
    answer = _client(served).generate(model=NAME, prompt="Once upon", raw=True, stream=False, logprobs=True,
                                      top_logprobs=2, options={"num_predict": 5})
    assert answer.response == native["content"].rstrip("\ufffd")  # Ollama trims a character its end cut short
    assert [entry.token for entry in answer.logprobs] == [e["token"] for e in native["completion_probabilities"]]
    status, raw = served.post("/api/generate", {"model": NAME, "prompt": "Once upon", "raw": True, "stream": False,
                                                "logprobs": True, "top_logprobs": 2, "options": {"num_predict": 5}})
    assert status == 200, raw
    _same(raw["logprobs"], _ollama_form(native["completion_probabilities"]))


def test_no_logprobs_unless_asked_and_bad_values_are_refused_by_name(served):
    status, plain = served.post("/api/chat", {"model": NAME, "messages": MESSAGES, "stream": False, "top_logprobs": 3,
                                              "options": {"num_predict": 4}})
    assert status == 200, plain  # top_logprobs without logprobs: nothing listed, as Ollama answers it
    assert "logprobs" not in plain
    for field, value in (("top_logprobs", 21), ("top_logprobs", -1), ("top_logprobs", 2.5), ("top_logprobs", True),
                         ("logprobs", "yes"), ("logprobs", 1)):
        for path, body in (("/api/chat", {"messages": MESSAGES}), ("/api/generate", {"prompt": "hi"})):
            status, payload = served.post(path, {"model": NAME, **body, "logprobs": True, field: value})
            assert status == 400, (path, field, value, payload)
            assert set(payload) == {"error"}
            assert f"'{field}'" in payload["error"]


# ------------------------------------------------------------------------------------------------ thinking


def _reference(server: Served, **fields) -> tuple[dict, dict]:
    status, body = server.post("/v1/chat/completions", {"messages": ASK, **fields})
    assert status == 200, body
    return body["choices"][0]["message"], body["usage"]


def test_thinking_is_the_chat_route_s_reasoning_content_whole_and_streamed(terse):
    """The template opens <think> and the tiny model thinks in characters (the ``terse`` server): its reasoning is
    ``message.thinking`` (``thinking`` on /api/generate), as the chat route's ``reasoning_content``."""
    message, usage = _reference(terse)
    assert message["reasoning_content"]
    client = _client(terse)
    for think in (None, True, "high"):  # a template that thinks, thinks unless told not to; any level is on
        whole = client.chat(model=NAME, messages=ASK, stream=False, think=think)
        assert (whole.message.thinking, whole.message.content) == (message["reasoning_content"], message["content"])
        assert whole.prompt_eval_count == usage["prompt_tokens"]
    parts = list(client.chat(model=NAME, messages=ASK, stream=True, think=True))
    assert "".join(part.message.thinking or "" for part in parts) == message["reasoning_content"]
    assert "".join(part.message.content for part in parts) == message["content"]
    assert parts[-1].done
    generated = client.generate(model=NAME, prompt=ASK[0]["content"], stream=False, think=True)
    assert (generated.thinking, generated.response) == (message["reasoning_content"], message["content"])
    streamed = list(client.generate(model=NAME, prompt=ASK[0]["content"], stream=True, think=True))
    assert "".join(part.thinking or "" for part in streamed) == message["reasoning_content"]


def test_think_false_renders_as_enable_thinking_false(terse):
    message, usage = _reference(terse, chat_template_kwargs={"enable_thinking": False})
    assert "reasoning_content" not in message
    status, rendered = terse.post("/apply-template", {"messages": ASK, "chat_template_kwargs": {"enable_thinking": False}})
    assert status == 200, rendered
    assert rendered["prompt"].endswith("<think>\n\n</think>\n\n")  # the template closed the block itself
    whole = _client(terse).chat(model=NAME, messages=ASK, stream=False, think=False)
    # Ollama trims a character the token limit cut short (U+FFFD), which the chat route keeps as llama-server does
    assert (whole.message.thinking, whole.message.content) == (None, message["content"].rstrip("\ufffd"))
    assert whole.prompt_eval_count == usage["prompt_tokens"]
    lines = _lines(terse, "/api/chat", {"model": NAME, "messages": ASK, "think": False})
    assert all("thinking" not in line["message"] for line in lines)
    assert "".join(line["message"]["content"] for line in lines) == message["content"].rstrip("\ufffd")


# ------------------------------------------------------------------------------------------------ clients' shapes

# Home Assistant's Assist tools as its Ollama integration sends them (homeassistant/components/ollama/entity.py,
# _format_tool: voluptuous-openapi's OpenAPI 3.0 schemas, where vol.Maybe is "nullable")
HA_TOOLS = [{"type": "function", "function": {
    "name": "HassTurnOn", "description": "Turns on/opens a device or entity",
    "parameters": {"type": "object", "properties": {
        "name": {"type": "string"}, "area": {"type": "string", "nullable": True},
        "domain": {"type": "array", "items": {"type": "string"}},
        "brightness": {"type": "integer", "minimum": 0, "maximum": 100, "description": "percent"}},
        "required": []}}},
    {"type": "function", "function": {"name": "GetLiveContext", "description": "The live state",
                                      "parameters": {"type": "object", "properties": {}, "required": []}}}]
HA_FORMAT = {"type": "object", "properties": {"answer": {"type": "string"},
                                              "room": {"type": "string", "nullable": True}}, "required": ["answer"]}


def _openapi_free(schema: dict) -> dict:
    """HA's schemas as JSON schema writes them: a nullable string is ["string", "null"]."""
    text = json.dumps(schema).replace('"type": "string", "nullable": true', '"type": ["string", "null"]')
    assert "nullable" not in text
    return json.loads(text)


def test_home_assistant_s_requests(tools_server):  # noqa: F811
    """What Home Assistant's Ollama integration sends /api/chat: ollama.Message turns (an earlier answer's thinking
    and its call, the tool's result as JSON text without tool_name), keep_alive -1 or "<n>s", options.num_ctx 8192
    (above this model's context: capped), its tools and format in OpenAPI 3.0 form, stream true."""
    message = ollama.Message
    call = message.ToolCall(function=message.ToolCall.Function(name="HassTurnOn", arguments={"name": "lamp"}))
    history = [message(role="system", content="You are a voice assistant."),
               message(role="user", content="Turn on the lamp"),
               message(role="assistant", content=None, thinking="The lamp.", tool_calls=[call]),
               message(role="tool", content=json.dumps({"data": {"success": ["lamp"]}, "error": None}))]
    reference_messages = [{"role": "system", "content": "You are a voice assistant."},
                          {"role": "user", "content": "Turn on the lamp"},
                          {"role": "assistant", "content": None,
                           "tool_calls": [{"id": "call_2_0", "type": "function",  # the id the Ollama route gives
                                           "function": {"name": "HassTurnOn", "arguments": "{\"name\": \"lamp\"}"}}]},
                          {"role": "tool", "tool_call_id": "call_2_0", "content": history[3].content}]
    # the tools as the client sends them (its Tool type keeps type, items, description and enum of a property)
    tools = [_openapi_free(tool) for tool in ollama._types.ChatRequest(model=NAME, tools=HA_TOOLS)
             .model_dump(exclude_none=True)["tools"]]
    status, reference = tools_server.post("/v1/chat/completions", {"messages": reference_messages, "tools": tools,
                                                                   "max_tokens": 6})
    assert status == 200, reference
    client = _client(tools_server)
    for keep_alive in (-1, "300s"):
        parts = list(client.chat(model=NAME, messages=history, tools=HA_TOOLS, stream=True, keep_alive=keep_alive,
                                 options={"num_ctx": 8192, "num_predict": 6}, think=None, format=None))
        assert parts[-1].done
        assert parts[-1].prompt_eval_count == reference["usage"]["prompt_tokens"]
        assert parts[-1].eval_count == reference["usage"]["completion_tokens"]
    # the same tools sent as they are (a client without the ollama package's types): nullable read as null's type
    status, direct = tools_server.post("/v1/chat/completions", {"messages": reference_messages, "max_tokens": 6,
                                                                "tools": [_openapi_free(tool) for tool in HA_TOOLS]})
    assert status == 200, direct
    status, whole = tools_server.post("/api/chat", {"model": NAME, "stream": False, "tools": HA_TOOLS,
                                                    "messages": [turn.model_dump(exclude_none=True) for turn in history],
                                                    "options": {"num_ctx": 8192, "num_predict": 6}})
    assert status == 200, whole
    assert whole["prompt_eval_count"] == direct["usage"]["prompt_tokens"]
    # an AI task's structure as format (beside the tools, and alone)
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": _openapi_free(HA_FORMAT)}}
    status, shaped = tools_server.post("/v1/chat/completions", {"messages": reference_messages[:2], "max_tokens": 24,
                                                                "response_format": schema})
    assert status == 200, shaped
    parts = list(client.chat(model=NAME, messages=history[:2], stream=True, format=HA_FORMAT,
                             options={"num_ctx": 8192, "num_predict": 24}))
    assert "".join(part.message.content for part in parts) == shaped["choices"][0]["message"]["content"]
    parts = list(client.chat(model=NAME, messages=history, tools=HA_TOOLS, stream=True, format=HA_FORMAT,
                             options={"num_ctx": 8192, "num_predict": 6}))
    assert parts[-1].done


def test_a_schema_s_error_names_format(served):
    status, payload = served.post("/api/chat", {"model": NAME, "messages": MESSAGES, "stream": False,
                                                "format": {"type": "object", "not": {}}})
    assert status == 400, payload
    assert payload["error"].startswith("'format': "), payload


def test_open_webui_s_and_the_python_client_s_requests(tools_server):  # noqa: F811
    """Open WebUI's Ollama proxy (backend/open_webui/routers/ollama.py, utils/payload.py): its own fields beside
    Ollama's (metadata, a root system), options it maps (mirostat 0, tfs_z 1, num_keep, use_mlock), a tool turn with
    tool_call_id; and the ollama client's chat and generate with every argument they take."""
    body = {"model": NAME, "stream": True, "keep_alive": "5m", "format": "", "think": False, "system": "x",
            "metadata": {"chat_id": "1"}, "tools": [LIGHT],
            "options": {"temperature": 0.8, "num_predict": 4, "stop": ["\n\n\n\n"], "mirostat": 0, "tfs_z": 1,
                        "num_keep": 24, "use_mlock": False},
            "messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "",
                          "tool_calls": [{"index": 0, "id": "call_x",
                                          "function": {"name": "set_light", "arguments": {"on": True}}}]},
                         {"role": "tool", "tool_call_id": "call_x", "content": "ok"}]}
    lines = _lines(tools_server, "/api/chat", body)
    assert lines[-1]["done"] is True

    def add(a: int, b: int) -> int:
        """Add two numbers.

        Args:
          a: the first
          b: the second
        """
        return a + b

    client = _client(tools_server)
    options = ollama.Options(num_predict=4, temperature=0.5, seed=3, top_k=5, top_p=0.9, min_p=0.1, repeat_penalty=1.1,
                             num_ctx=4096, stop=["x"], num_keep=5, typical_p=1.0, penalize_newline=True, numa=False,
                             num_batch=8, num_gpu=0, main_gpu=0, use_mmap=True, num_thread=2, repeat_last_n=64,
                             presence_penalty=0.0, frequency_penalty=0.0)
    answer = client.chat(model=NAME, messages=[{"role": "user", "content": "add"}], tools=[add], stream=False,
                         think=False, logprobs=True, top_logprobs=2, format="json", options=options, keep_alive="5m")
    assert answer.done
    # under tools the tokens listed are those of what the answer gives out, not of the JSON this server wraps a text
    # in: cut by num_predict inside that JSON, the answer says nothing (no text, no call) and lists no token
    assert (answer.eval_count, answer.message.content, answer.message.tool_calls, answer.logprobs) == (4, "", None, [])
    generated = client.generate(model=NAME, prompt="hi", suffix="", system="be", template="", context=None,
                                stream=False, think=False, logprobs=True, top_logprobs=2, raw=False, format="",
                                images=None, options=options, keep_alive=1.5)
    assert generated.done
    assert len(generated.logprobs) == generated.eval_count


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}


def test_a_tool_result_answers_the_call_its_tool_call_id_names(tools_server):  # noqa: F811
    """Two calls answered in the other order, each result naming its call by ``tool_call_id`` (Open WebUI's form,
    with the ids this server's answer gave the calls): each renders with its own tool's name, as on the chat route.
    The prompt's fingerprint is its first token's ``top_logprobs``, the model's distribution after the prompt (a
    log-probability is the model's before the tools' constraint picks a token): POST /completion's for the chat
    route's rendering, and /api/chat's first listed token's (a call's tokens are all listed, as Ollama lists them)."""
    calls = [{"id": "call_a", "function": {"name": "set_light", "arguments": {"on": True}}},
             {"id": "call_b", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]
    results = [{"role": "tool", "tool_call_id": "call_b", "content": "rain"},
               {"role": "tool", "tool_call_id": "call_a", "content": "done"}]
    messages = [{"role": "user", "content": "Lamp on, and the weather?"},
                {"role": "assistant", "content": "", "tool_calls": calls}, *results]

    def chat_route(answers: list[dict]) -> tuple[str, list[dict]]:
        """The chat route's prompt for these results, and its first token's top_logprobs in Ollama's form."""
        openai_calls = [{"id": c["id"], "type": "function",
                         "function": {"name": c["function"]["name"], "arguments": json.dumps(c["function"]["arguments"])}}
                        for c in calls]
        status, rendered = tools_server.post("/apply-template", {
            "messages": [messages[0], {"role": "assistant", "content": None, "tool_calls": openai_calls}, *answers],
            "tools": [LIGHT, WEATHER]})
        assert status == 200, rendered
        status, body = tools_server.post("/completion", {"prompt": rendered["prompt"], "n_predict": 1, "n_probs": 3})
        assert status == 200, body
        top = body["completion_probabilities"][0]["top_logprobs"]
        return rendered["prompt"], [{key: t[key] for key in ("token", "logprob", "bytes")} for t in top]

    prompt, expected = chat_route(results)
    swapped_prompt, swapped = chat_route([{**results[0], "tool_call_id": "call_a"},
                                          {**results[1], "tool_call_id": "call_b"}])
    assert '"tool": "get_weather", "content": "rain"' in prompt
    assert '"tool": "set_light", "content": "rain"' in swapped_prompt
    assert [e["logprob"] for e in swapped] != pytest.approx([e["logprob"] for e in expected], abs=1e-5)  # order tells
    status, whole = tools_server.post("/api/chat", {"model": NAME, "messages": messages, "tools": [LIGHT, WEATHER],
                                                    "stream": False, "logprobs": True, "top_logprobs": 3,
                                                    "options": {"num_predict": 40}})
    assert status == 200, whole
    status, tokens = tools_server.post("/tokenize", {"content": prompt, "parse_special": True})
    assert status == 200, tokens
    assert whole["prompt_eval_count"] == len(tokens["tokens"])
    first = whole["logprobs"][0]  # the answer's first token: the call's JSON, which Ollama lists
    assert whole["message"].get("tool_calls") or whole["message"]["content"].startswith(first["token"]), whole
    _same(first["top_logprobs"], expected)
    status, payload = tools_server.post("/api/chat", {"model": NAME, "messages": [*messages[:2], {**results[0],
                                                                                                  "tool_call_id": 7}]})
    assert status == 400, payload
    assert "messages[2].tool_call_id" in payload["error"]


# ------------------------------------------------------------------------------------------------ the seams

TEXT = st.text(max_size=8) | st.sampled_from(["", "\ud800", "<think>", "</think>", "<|im_end|>", "\x00", "\u2028"])
NUMBER = st.integers(min_value=-2**70, max_value=2**70) | st.floats(allow_nan=False) | st.sampled_from([0, -1, -2, 1e308])
JSON = st.recursive(st.none() | st.booleans() | NUMBER | TEXT,
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3), max_leaves=6)
OPTION_NAMES = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "num_predict", "num_ctx", "repeat_penalty",
                "repeat_last_n", "presence_penalty", "frequency_penalty", "mirostat", "typical_p", "num_gpu", "unknown")
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool"]), "content": TEXT},
                                optional={"tool_name": st.just("set_light"), "thinking": TEXT,
                                          "tool_calls": st.just([{"function": {"name": "set_light",
                                                                               "arguments": {"on": True}}}])})
# A plausible body of each route's fields, then one field (or an option, or a message's field) anything at all:
# types, nulls, nesting, unicode, huge and negative numbers, empty strings.
PLAUSIBLE = {"stream": st.booleans(), "messages": st.lists(MESSAGE, min_size=1, max_size=3), "prompt": TEXT,
             "system": TEXT, "raw": st.booleans(), "format": st.sampled_from(["json", "", {"type": "object"}]),
             "think": st.sampled_from([True, False, "high", "low"]), "keep_alive": st.sampled_from(["5m", -1, 0, "0s"]),
             "tools": st.just([LIGHT]), "logprobs": st.booleans(), "top_logprobs": st.integers(0, 20),
             "options": st.dictionaries(st.sampled_from(OPTION_NAMES), NUMBER | TEXT, max_size=2)}


@st.composite
def bodies(draw) -> dict:
    body = {"model": NAME, **{name: draw(value) for name, value in PLAUSIBLE.items() if draw(st.booleans())}}
    options = body.setdefault("options", {})
    options["num_predict"] = options.get("num_predict") if draw(st.booleans()) else 3
    where = draw(st.sampled_from(["options.", "messages.", *PLAUSIBLE, "images", "suffix", "context", "model"]))
    if where == "options.":
        options[draw(st.sampled_from(OPTION_NAMES))] = draw(JSON)
    elif where == "messages." and body.get("messages"):
        body["messages"][0][draw(st.sampled_from(["role", "content", "tool_calls", "tool_name", "images"]))] = draw(JSON)
    elif where != "messages.":
        body[where] = draw(JSON)
    return body


def _check_answer(status: int, headers: dict, payload: bytes) -> None:
    """No 500; an error is Ollama's ``{"error": "..."}``; a stream is lines of JSON ending in ``done`` or an error."""
    assert status != 500, payload
    if status != 200:
        body = json.loads(payload)
        assert set(body) == {"error"}, body
        assert isinstance(body["error"], str)
        assert body["error"]
        return
    if headers["Content-Type"] == "application/x-ndjson":
        assert payload.endswith(b"\n")
        lines = [json.loads(line) for line in payload.decode().split("\n")[:-1]]
        assert lines
        assert lines[-1].get("done") is True or set(lines[-1]) == {"error"}, lines[-1]
        assert all(line.get("done") is False for line in lines[:-1]), lines
    else:
        assert json.loads(payload)["done"] is True


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(["/api/chat", "/api/generate"]), body=bodies() | JSON)
def test_any_body_gets_an_answer_or_ollama_s_error(served, path, body):
    _check_answer(*served.request("POST", path, body))


@pytest.mark.parametrize(("path", "body"), [("/api/chat", {"messages": MESSAGES}), ("/api/generate", {"prompt": "Hi"})])
def test_a_client_leaving_mid_stream_frees_the_board(runtime, path, body):
    hook = HeldHook()
    hook.release.set()
    server = Served(runtime, ServeDefaults(max_tokens=200), hook=hook)
    try:
        client = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        data = json.dumps({"model": NAME, **body, "options": {"num_predict": 200}}).encode()  # streamed: the default
        client.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (path.encode(), len(data), data))
        received = b""
        while b'"done": false' not in received:  # the headers, then the first object
            chunk = client.recv(4096)
            assert chunk, "the server closed the stream before its first object"
            received += chunk
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # reset on close
        client.close()
        deadline = time.monotonic() + 30  # a bound on the wait, not a check of its length
        while not hook.ends and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hook.ends == [None]  # the answer ended early, through the hook's end of request
        assert hook.steps < 200
        status, answer = server.post(path, {"model": NAME, **body, "stream": False, "options": {"num_predict": 2}})
        assert (status, answer["done"]) == (200, True)
    finally:
        server.close()


def test_the_api_key_head_and_options_on_the_ollama_routes(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=4), api_key="sesame")
    try:
        for path in ("/api/chat", "/api/generate"):
            status, headers, payload = server.request("POST", path, {"model": NAME, "prompt": "hi",
                                                                     "messages": MESSAGES})
            assert (status, json.loads(payload).keys()) == (401, {"error"})
            assert headers["WWW-Authenticate"] == "Bearer"
            lines = _lines_keyed(server, path, {"model": NAME, "prompt": "hi", "messages": MESSAGES})
            assert lines[-1]["done"] is True
        status, _, payload = server.request("HEAD", "/api/tags")
        assert (status, payload) == (401, b"")
        status, headers, payload = server.request("HEAD", "/api/tags", headers={"Authorization": "Bearer sesame"})
        assert (status, payload, headers["Content-Type"]) == (200, b"", "application/json")
        status, headers, payload = server.request("HEAD", "/api/chat", headers={"Authorization": "Bearer sesame"})
        assert (status, headers["Allow"], payload) == (405, "POST", b"")
        # a browser's preflight carries no key (Open WebUI in a browser, a web page calling the board)
        status, headers, _ = server.request("OPTIONS", "/api/chat", headers={"Origin": "http://localhost:8080",
                                                                             "Access-Control-Request-Method": "POST"})
        assert status in (200, 204)
        assert "POST" in headers["Access-Control-Allow-Methods"]
    finally:
        server.close()


def _lines_keyed(server: Served, path: str, body: dict) -> list[dict]:
    status, _, payload = server.request("POST", path, body, headers={"Authorization": "Bearer sesame"})
    assert status == 200, payload
    return [json.loads(line) for line in payload.decode().splitlines()]
