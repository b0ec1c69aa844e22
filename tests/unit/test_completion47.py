"""The completer's core against a real runtime of the tiny bundle and a real server.

- What no request can mend is the server's 500, not the request's 400: a jinja2 too old to render chat templates in
  a safe sandbox (edgesdk/runtime/text.py, chat_environment) and a bundle template that does not compile were
  answered 400 ``invalid_request_error`` naming ``messages``, telling the client to change messages that were never
  at fault (llama-server: an invalid argument of the request is its 400, any other failure its 500, tools/server
  server.cpp ``ex_wrapper``). A template that refuses the messages (``raise_exception``) stays a 400.
- An answer that stops at a full context (no context shift) says so (``Completion.context_full``), as llama-server
  marks it ``truncated`` (tools/server/server-context.cpp, process_token: "stopped due to running out of context
  capacity"); a shift says so through ``context_shifts``, a token limit through neither.
- A prompt past the context is refused with its fix named.
"""

from __future__ import annotations

import pytest

from edgesdk.runtime.session import open_runtime
from edgesdk.serve.api import ApiError, parse_chat_request, parse_text_request
from edgesdk.serve.completion import Completer, ServeDefaults
from tests.unit.test_serve import Served

USER = [{"role": "user", "content": "Where is the lamp?"}]


@pytest.fixture
def own(tiny_bundle):
    """A runtime of its own: the tests change its chat template."""
    return open_runtime(tiny_bundle.path, threads=1)


@pytest.fixture
def server(own):
    served = Served(own, ServeDefaults(max_tokens=4))
    yield served
    served.close()


def _old_jinja(monkeypatch):
    import jinja2

    monkeypatch.setattr(jinja2, "__version__", "3.1.5")


def test_a_jinja_too_old_for_chat_templates_is_the_server_s_500_naming_the_fix(server, monkeypatch):
    _old_jinja(monkeypatch)
    status, body = server.post("/v1/chat/completions", {"messages": USER})
    assert status == 500, body
    error = body["error"]
    assert error["type"] == "server_error"
    assert error["code"] == "chat_template_unavailable"
    assert error["param"] is None  # the messages are not at fault
    assert "jinja2 3.1.5 is installed" in error["message"]
    assert "pip install -U 'jinja2>=3.1.6'" in error["message"]
    # a stream is refused before its headers, with the same 500
    status, _, payload = server.request("POST", "/v1/chat/completions", {"messages": USER, "stream": True})
    assert status == 500, payload
    # Ollama's chat route renders the template through the same completer
    status, _, payload = server.request("POST", "/api/chat", {"model": "tiny-host", "messages": USER, "stream": False})
    assert status == 500, payload


def test_a_bundle_template_that_does_not_compile_is_a_500(server, own):
    own.tokenizer.template_source = "{% for message in messages %}{{ message['content'] }"  # "}}" cut short
    own.tokenizer._template = None
    status, body = server.post("/v1/chat/completions", {"messages": USER})
    assert status == 500, body
    assert body["error"]["code"] == "chat_template_unavailable"
    assert "TemplateSyntaxError" in body["error"]["message"]
    assert "rebuild the bundle" in body["error"]["message"]


def test_a_template_that_refuses_the_messages_stays_the_request_s_400(server, own):
    own.tokenizer.template_source = ("{% if messages[0]['role'] != 'system' %}{{ raise_exception('a system message "
                                     "must come first') }}{% endif %}{% for message in messages %}"
                                     "{{ message['content'] }}{% endfor %}")
    own.tokenizer._template = None
    status, body = server.post("/v1/chat/completions", {"messages": USER})
    assert status == 400, body
    assert body["error"]["param"] == "messages"
    assert "a system message must come first" in body["error"]["message"]


def test_the_completer_s_own_refusal_is_a_500_too(own, monkeypatch):
    """The Python API's path (no HTTP): the ApiError itself."""
    _old_jinja(monkeypatch)
    completer = Completer(own, ServeDefaults(max_tokens=4))
    with pytest.raises(ApiError) as refused:
        completer.prompt_ids(parse_chat_request({"messages": USER}))
    assert refused.value.status == 500
    assert refused.value.kind == "server_error"


def _prompt(completer: Completer, tokens: int) -> list[int]:
    """A prompt of exactly ``tokens`` token ids (the tokenizer's own, repeated)."""
    seed = completer.runtime.tokenizer.prompt_ids("The quick brown fox jumps over the lazy dog. ", raw=True)
    return (seed * (tokens // len(seed) + 1))[:tokens]


def test_an_answer_stopped_by_a_full_context_says_so(own):
    completer = Completer(own, ServeDefaults(max_tokens=4))
    context = own.backend.max_context
    ids = _prompt(completer, context - 3)
    full = completer.complete(parse_text_request({"prompt": ids, "max_tokens": 50, "ignore_eos": True}))
    assert full.finish_reason == "length"
    assert full.context_full
    assert full.context_shifts == 0
    assert full.completion_tokens < 50
    limited = completer.complete(parse_text_request({"prompt": ids, "max_tokens": 2, "ignore_eos": True}))
    assert limited.finish_reason == "length"
    assert not limited.context_full


def test_a_shifted_answer_is_not_one_stopped_by_a_full_context(own):
    completer = Completer(own, ServeDefaults(max_tokens=4, context_shift=True, n_keep=4))
    ids = _prompt(completer, own.backend.max_context - 3)
    shifted = completer.complete(parse_text_request({"prompt": ids, "max_tokens": 8, "ignore_eos": True}))
    assert shifted.context_shifts > 0
    assert not shifted.context_full
    assert shifted.completion_tokens == 8


def test_a_prompt_past_the_context_is_refused_naming_the_fix(server, own):
    completer = server.completer
    ids = _prompt(completer, own.backend.max_context + 5)
    status, body = server.post("/v1/completions", {"prompt": ids, "max_tokens": 2})
    assert status == 400, body
    message = body["error"]["message"]
    assert body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["param"] == "prompt"
    assert message.startswith(f"This model's maximum context length is {own.backend.max_context} tokens. However, "
                              f"your prompt resulted in {len(ids)} tokens: "), message
    # the tiny bundle is 256 tokens of a 512-position model
    assert message.endswith("shorten the prompt to fewer tokens (POST /tokenize counts them), or rebuild the bundle "
                            "with 'edgesdk build --max-context 512', the most the model's max_position_embeddings "
                            "(512) allows"), message
