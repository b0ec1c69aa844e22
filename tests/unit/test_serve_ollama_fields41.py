"""serve's Ollama API (edgesdk/serve/ollama.py) where a request field's default or refusal is Ollama's: ``think`` left
out on a model that thinks (thinking on, as routes.go's ChatHandler and GenerateHandler set it), ``truncate`` and
``shift`` (api/types.go; ``truncate`` false past the context is the runner's 400 "the input length exceeds the context
length"; a full context ends the answer with done_reason "length"), ``tools`` for a bundle without a chat template
(``<model> does not support tools``, before the model loads, as /api/show's capabilities say) and a ``format`` that is
neither "json" nor a JSON schema object (llm/server.go's "invalid format" message). Real servers over the tiny bundle
(256 tokens of context), driven by the ``ollama`` client where it can send the request; expected prompts come from the
server's own /apply-template and /tokenize routes and expected answers from its chat route."""

from __future__ import annotations

import json

import pytest

ollama = pytest.importorskip("ollama")

from edgesdk.runtime.session import open_runtime  # noqa: E402
from edgesdk.serve.completion import ServeDefaults  # noqa: E402
from tests._utils.ollama_calls import ollama_client as _client  # noqa: E402
from tests._utils.ollama_calls import post_error as _error  # noqa: E402
from tests._utils.ollama_calls import post_ok as _ok  # noqa: E402
from tests._utils.tiny import CHAT_TEMPLATE  # noqa: E402
from tests.unit.test_serve import Served  # noqa: E402

NAME = "tiny-host:latest"
ASK = [{"role": "user", "content": "Tell me about the fox."}]
# a template that thinks only when asked: <think> opened where enable_thinking is true (without a newline after it,
# the tiny model thinks in characters that are not whitespace), nothing otherwise
OFF_BY_DEFAULT = CHAT_TEMPLATE.replace(
    "<|im_start|>assistant\n{% endif %}",
    "<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking %}<think>{% endif %}{% endif %}")
LONG = "The quick brown fox jumps over the lazy dog. " * 4
TOOLS = [{"type": "function", "function": {"name": "set_light", "description": "Switch a light.",
                                           "parameters": {"type": "object", "properties": {}}}}]


def _server(tiny_bundle, template: str | None, max_tokens: int = 12) -> Served:
    """A server over the tiny bundle with its chat template replaced by ``template`` (None: a bundle without one)."""
    runtime = open_runtime(tiny_bundle.path, threads=1)
    runtime.tokenizer.template_source = template
    runtime.tokenizer._template = None
    return Served(runtime, ServeDefaults(max_tokens=max_tokens))


@pytest.fixture(scope="module")
def thinks_when_asked(tiny_bundle):
    server = _server(tiny_bundle, OFF_BY_DEFAULT)
    yield server
    server.close()


@pytest.fixture(scope="module")
def plain(tiny_bundle):
    server = _server(tiny_bundle, CHAT_TEMPLATE, max_tokens=24)
    yield server
    server.close()


@pytest.fixture(scope="module")
def templateless(tiny_bundle):
    server = _server(tiny_bundle, None)
    yield server
    server.close()


def _count(server: Served, messages: list, **fields) -> int:
    """The tokens of the prompt the chat route renders ``messages`` to."""
    rendered = _ok(server, "/apply-template", {"messages": messages, **fields})["prompt"]
    return len(_ok(server, "/tokenize", {"content": rendered, "add_special": False, "parse_special": True})["tokens"])


# ------------------------------------------------------------------------------------------------ think


def test_think_left_out_on_a_model_that_thinks_renders_thinking_on_not_the_template_default(thinks_when_asked):
    """routes.go: where the model has the thinking capability and ``think`` is nil, ``req.Think = true`` on both
    /api/chat and /api/generate, so the template renders thinking on; the answer is the chat route's with
    ``enable_thinking`` true, its reasoning split off as ``thinking``."""
    server = thinks_when_asked
    on = _count(server, ASK, chat_template_kwargs={"enable_thinking": True})
    assert on != _count(server, ASK)  # this template's own default is thinking off
    reference = _ok(server, "/v1/chat/completions", {"messages": ASK, "max_tokens": 8,
                                                     "chat_template_kwargs": {"enable_thinking": True}})
    message = reference["choices"][0]["message"]
    assert message["reasoning_content"]  # the tiny model thinks in characters after the opened <think>
    client = _client(server)
    chatted = client.chat(model=NAME, messages=ASK, stream=False, options={"num_predict": 8})
    assert chatted.prompt_eval_count == on
    assert (chatted.message.thinking, chatted.message.content) == (message["reasoning_content"], message["content"])
    streamed = list(client.chat(model=NAME, messages=ASK, stream=True, options={"num_predict": 8}))
    assert "".join(part.message.thinking or "" for part in streamed) == message["reasoning_content"]
    generated = client.generate(model=NAME, prompt=ASK[0]["content"], stream=False, options={"num_predict": 8})
    assert generated.prompt_eval_count == on
    assert (generated.thinking, generated.response) == (message["reasoning_content"], message["content"])
    # think false still renders the template with thinking off, and answers without a thinking part
    off = client.chat(model=NAME, messages=ASK, stream=False, think=False, options={"num_predict": 8})
    assert off.prompt_eval_count == _count(server, ASK, chat_template_kwargs={"enable_thinking": False})
    assert off.message.thinking is None


@pytest.mark.parametrize("operator", ["reasoning_budget", "chat_template_kwargs"])
def test_think_left_out_keeps_the_operator_s_thinking_off(tiny_bundle, operator):
    """Ollama's default (``think`` nil on a thinking model: on) stands in for the client, not for the operator:
    ``serve --reasoning-budget 0`` or ``--chat-template-kwargs '{"enable_thinking": false}'`` keep the Ollama routes'
    template rendered thinking off, as they keep the OpenAI route's."""
    runtime = open_runtime(tiny_bundle.path, threads=1)
    runtime.tokenizer.template_source, runtime.tokenizer._template = OFF_BY_DEFAULT, None
    if operator == "chat_template_kwargs":
        runtime.tokenizer.template_kwargs = {**runtime.tokenizer.template_kwargs, "enable_thinking": False}
    server = Served(runtime, ServeDefaults(max_tokens=8, reasoning_budget=0 if operator == "reasoning_budget" else -1))
    try:
        openai = _ok(server, "/v1/chat/completions", {"messages": ASK, "max_tokens": 4})
        chatted = _ok(server, "/api/chat", {"model": NAME, "messages": ASK, "stream": False,
                                            "options": {"num_predict": 4}})
        assert chatted["prompt_eval_count"] == openai["usage"]["prompt_tokens"]
        assert "thinking" not in chatted["message"]
        on = _ok(server, "/api/chat", {"model": NAME, "messages": ASK, "stream": False, "think": True,
                                       "options": {"num_predict": 4}})  # the client's own choice still counts
        assert on["prompt_eval_count"] != chatted["prompt_eval_count"]
    finally:
        server.close()


def test_think_left_out_on_a_model_that_does_not_think_changes_nothing(plain):
    """Without the thinking capability Ollama leaves ``think`` nil: the template renders as it is, no thinking."""
    chatted = _client(plain).chat(model=NAME, messages=ASK, stream=False, options={"num_predict": 4})
    assert chatted.prompt_eval_count == _count(plain, ASK)
    assert chatted.message.thinking is None


# ------------------------------------------------------------------------------------------------ truncate, shift


def test_truncate_false_past_the_context_is_ollamas_input_length_error(plain):
    """runner.go ``NewSequence``: with ``truncate`` false a prompt past the context is ``errorInputTooLong``, "the
    input length exceeds the context length", status 400, on /api/chat (no message dropped) and /api/generate, and
    within ``num_ctx`` where that is smaller; with ``truncate`` true or left out /api/chat drops its oldest messages
    and answers."""
    messages = [{"role": "user", "content": LONG}, {"role": "assistant", "content": LONG},
                {"role": "user", "content": LONG}, {"role": "user", "content": "And the dog?"}]
    assert _count(plain, messages) > 256
    status, error = _error(plain, "/api/chat", {"model": NAME, "messages": messages, "truncate": False,
                                                "stream": False, "options": {"num_predict": 4}})
    assert status == 400
    assert error.startswith("the input length exceeds the context length: ")
    assert "this model's context of 256" in error
    assert "'truncate': true" in error  # the fix: let the oldest messages go
    for truncate in (True, None):
        answered = _ok(plain, "/api/chat", {"model": NAME, "messages": messages, "truncate": truncate,
                                            "stream": False, "options": {"num_predict": 4}})
        assert answered["done"]
        assert answered["prompt_eval_count"] < 256

    status, error = _error(plain, "/api/generate", {"model": NAME, "prompt": LONG * 4, "truncate": False,
                                                    "stream": True})
    assert status == 400
    assert error.startswith("the input length exceeds the context length: ")
    assert "'truncate': true" not in error  # the generate route has no messages to drop

    short = [{"role": "user", "content": LONG}]
    fits = _count(plain, short)
    assert fits < 256
    status, error = _error(plain, "/api/chat", {"model": NAME, "messages": short, "truncate": False,
                                                "options": {"num_ctx": fits, "num_predict": 4}})
    assert status == 400
    assert error.startswith("the input length exceeds the context length: ")
    assert f"'options.num_ctx' {fits}" in error
    assert "raise num_ctx" in error
    answered = _ok(plain, "/api/chat", {"model": NAME, "messages": short, "truncate": False, "stream": False,
                                        "shift": False, "options": {"num_ctx": fits + 3, "num_predict": 8}})
    assert (answered["prompt_eval_count"], answered["eval_count"]) == (fits, 3)
    shifted = _ok(plain, "/api/chat", {"model": NAME, "messages": short, "truncate": False, "stream": False,
                                       "options": {"num_ctx": fits + 3, "num_predict": 8}})
    assert (shifted["prompt_eval_count"], shifted["eval_count"]) == (fits, 8)  # shifted within num_ctx


@pytest.mark.parametrize("route", ["/api/chat", "/api/generate"])
@pytest.mark.parametrize(("field", "value"), [("truncate", "no"), ("truncate", 0), ("shift", "false"), ("shift", 1)])
def test_truncate_and_shift_must_be_booleans(plain, route, field, value):
    """api/types.go: ``Truncate *bool`` and ``Shift *bool`` on both requests: anything but a boolean (or null) is
    refused, as Go's JSON decoding refuses it, naming the field."""
    body = {"model": NAME, "stream": False, field: value,
            **({"messages": ASK} if route == "/api/chat" else {"prompt": ASK[0]["content"]})}
    status, error = _error(plain, route, body)
    assert status == 400
    assert f"'{field}' must be true or false" in error
    for fine in (True, False, None):
        assert _ok(plain, route, {**body, field: fine, "options": {"num_predict": 2}})["done"]


@pytest.mark.parametrize("shift", [None, True, False])
def test_a_full_num_ctx_shifts_unless_shift_is_false(plain, shift):
    """Ollama's runner shifts a full ``num_ctx``-long cache and goes on unless ``shift`` is false, when the answer
    ends there with ``DoneReasonLength`` ("length"); ``num_predict`` -1 runs to ten times ``num_ctx`` shifting
    (llm/server.go), and the answer, shifted or not, is whole in a stream too."""
    prompt = _count(plain, ASK)
    window = prompt + 6
    body = {"model": NAME, "messages": ASK, "stream": False, "options": {"num_ctx": window, "num_predict": -1},
            **({} if shift is None else {"shift": shift})}
    answered = _ok(plain, "/api/chat", body)
    tokens = 6 if shift is False else 10 * window
    assert (answered["done_reason"], answered["prompt_eval_count"], answered["eval_count"]) == \
        ("length", prompt, tokens)
    _, _, payload = plain.request("POST", "/api/chat", {**body, "stream": True})
    streamed = [json.loads(line) for line in payload.splitlines()]
    assert streamed[-1]["done_reason"] == "length"
    assert "".join(part["message"]["content"] for part in streamed) == answered["message"]["content"]


# ------------------------------------------------------------------------------------------------ tools


def test_tools_for_a_bundle_without_a_chat_template_are_refused_before_it_loads(templateless, plain):
    """images.go ``CheckCapabilities``: /api/chat with ``tools`` for a model without the tools capability is
    ``<model> does not support tools`` (400, routes.go ``handleScheduleError``), checked before the model loads, so a
    load request with tools too. /api/show lists no "tools" for such a bundle, and a bundle with a chat template, which
    renders tools in llama.cpp's generic form whatever the template says of them, lists and takes them."""
    client = _client(templateless)
    assert "tools" not in client.show(NAME).capabilities
    for messages in (ASK, []):
        with pytest.raises(ollama.ResponseError) as caught:
            client.chat(model=NAME, messages=messages, tools=TOOLS, stream=False)
        assert caught.value.status_code == 400
        assert caught.value.error.startswith(f"{NAME} does not support tools: ")
    assert _ok(templateless, "/api/chat", {"model": NAME, "messages": []})["done_reason"] == "load"
    # think true on a model that does not think is refused first, as routes.go checks it before the capabilities
    status, error = _error(templateless, "/api/chat", {"model": NAME, "messages": ASK, "tools": TOOLS, "think": True})
    assert status == 400
    assert "does not support thinking" in error

    assert "tools" in _client(plain).show(NAME).capabilities
    assert _ok(plain, "/api/chat", {"model": NAME, "messages": [], "tools": TOOLS})["done_reason"] == "load"


# ------------------------------------------------------------------------------------------------ format


@pytest.mark.parametrize(("form", "quoted"), [
    ("xml", r'"\"xml\""'),
    ("JSON", r'"\"JSON\""'),
    (5, '"5"'),
    (True, '"true"'),
    (["json"], r'"[\"json\"]"'),
])
@pytest.mark.parametrize("route", ["/api/chat", "/api/generate"])
def test_a_format_neither_json_nor_a_schema_object_is_refused_with_ollamas_message(plain, route, form, quoted):
    """llm/server.go ``Completion``: a format that is not null, "", "json" or a JSON object is ``invalid format: %q;
    expected "json" or a valid JSON Schema object`` (its raw JSON quoted as Go's %q quotes it); Ollama answers it 500
    once the model is loaded, here it is a 400 before anything runs. null and "" are no format."""
    body = {"model": NAME, "stream": False, "format": form, "options": {"num_predict": 2},
            **({"messages": ASK} if route == "/api/chat" else {"prompt": ASK[0]["content"]})}
    status, error = _error(plain, route, body)
    assert status == 400
    assert error.startswith(f'invalid format: {quoted}; expected "json" or a valid JSON Schema object: ')
    assert "'format'" in error
    for none in ("", None):
        assert _ok(plain, route, {**body, "format": none})["done"]
