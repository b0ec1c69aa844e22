"""Review of the reasoning split and chat_template_kwargs: refusals that were 500s, llama-server's handling of the
reasoning's whitespace, a begun answer's block, deepseek-legacy, and the splitter under any piece boundaries."""

from __future__ import annotations

import pytest

from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served
from tests.unit.test_serve_reasoning import ASK, THINKING_TEMPLATE

# the thinking template, refusing messages that do not start with a user's as Qwen3's refuses a chat without a
# user query, and using namespace() as Qwen3's does
REFUSING_TEMPLATE = THINKING_TEMPLATE.replace(
    "{% for message in messages %}",
    "{% if messages[0]['role'] != 'user' %}{{ raise_exception('No user query found in messages.') }}{% endif %}"
    "{% set ns = namespace(n=0) %}{% for message in messages %}")


@pytest.fixture(scope="module")
def thinking_runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(tiny_bundle.path, threads=1)
    runtime.tokenizer.template_source, runtime.tokenizer._template = REFUSING_TEMPLATE, None
    return runtime


@pytest.fixture
def served(thinking_runtime):
    server = Served(thinking_runtime, ServeDefaults(max_tokens=6))
    yield server
    server.close()


def test_a_streamed_chat_the_template_refuses_is_a_400_as_the_whole_one(served):
    """The splitter renders the prompt before the stream's turn: a template that refuses the messages was a 500
    (an internal error naming BundleError) there, while the same request unstreamed got its 400."""
    messages = [{"role": "system", "content": "Be brief."}]
    for stream in (False, True):
        status, body = served.post("/v1/chat/completions", {"messages": messages, "stream": stream})
        assert status == 400, (stream, body)
        assert body["error"]["param"] == "messages"
        assert "No user query found in messages." in body["error"]["message"]


def test_template_kwargs_the_template_cannot_use_are_a_400_naming_them(served, thinking_runtime):
    """A variable that replaces what the template calls (Qwen3's namespace()) made the template raise a TypeError,
    which came back as a 500 internal error; it is a 400 naming the variable, and the next request is answered."""
    status, body = served.post("/v1/chat/completions", {"messages": ASK, "chat_template_kwargs": {"namespace": 1}})
    assert status == 400, body
    assert "failed with the template variables namespace (chat_template_kwargs): TypeError" in body["error"]["message"]
    status, body = served.post("/apply-template", {"messages": ASK, "chat_template_kwargs": {"namespace": 1}})
    assert status == 400, body
    thinking_runtime.tokenizer.template_kwargs = {"namespace": "x"}  # serve --chat-template-kwargs
    try:
        status, body = served.post("/v1/chat/completions", {"messages": ASK, "stream": True})
        assert status == 400, body
        assert "template variables namespace" in body["error"]["message"]
    finally:
        thinking_runtime.tokenizer.template_kwargs = {}
    status, body = served.post("/v1/chat/completions", {"messages": ASK})
    assert status == 200, body
