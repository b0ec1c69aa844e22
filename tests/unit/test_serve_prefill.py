"""serve: a chat whose last message is the assistant's goes on from that message's text (a prefill, as
llama-server and Anthropic's Messages API take it), on a real server over the tiny bundle."""

from __future__ import annotations

import pytest

from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served

BEGUN = [{"role": "user", "content": "Tell me about the fox."}, {"role": "assistant", "content": "The quick brown"}]


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


@pytest.fixture
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=12))
    yield server
    server.close()


def _completion(server: Served, prompt: str) -> dict:
    status, body = server.post("/v1/completions", {"prompt": prompt, "max_tokens": 12})
    assert status == 200, body
    return body


def test_the_rendered_chat_stops_inside_the_assistant_s_begun_answer(runtime):
    tokenizer = runtime.tokenizer
    continued = tokenizer.render_chat(BEGUN, continue_final=True)
    assert continued.endswith("The quick brown")
    # what follows the begun text in a rendered conversation (the end of its turn) is cut
    assert continued == tokenizer.render_chat(BEGUN[:1]) + "The quick brown"
    with_space = [BEGUN[0], {"role": "assistant", "content": "The quick brown "}]
    assert tokenizer.render_chat(with_space, continue_final=True) == continued + " "  # kept, as the template keeps it
    empty = [BEGUN[0], {"role": "assistant", "content": ""}]
    assert tokenizer.render_chat(empty, continue_final=True) == tokenizer.render_chat(BEGUN[:1])


@pytest.mark.parametrize("begun", ["The quick brown", "The quick brown ", "a|b>", "  lead", "two\nlines\n"])
@pytest.mark.parametrize("trims", [False, True])
def test_the_rendering_is_transformers_continue_final_message(runtime, begun, trims):
    """transformers' apply_chat_template(continue_final_message=True) on the same template is the reference,
    for a template that keeps the text as given and for one that trims it."""
    from edgesdk.runtime.text import ChatTokenizer
    from tests._utils.tiny import tiny_tokenizer

    reference = tiny_tokenizer()
    if trims:
        reference.chat_template = reference.chat_template.replace("content']", "content'] | trim")
        assert "| trim" in reference.chat_template
    tokenizer = ChatTokenizer.__new__(ChatTokenizer)
    tokenizer.__dict__.update(runtime.tokenizer.__dict__)
    tokenizer.template_source, tokenizer._template = reference.chat_template, None
    messages = [BEGUN[0], {"role": "assistant", "content": begun}]
    expected = reference.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    assert tokenizer.render_chat(messages, continue_final=True) == expected


def test_a_chat_ending_with_an_assistant_message_continues_it(served, runtime):
    status, chat = served.post("/v1/chat/completions", {"messages": BEGUN, "max_tokens": 12})
    assert status == 200, chat
    # the same prompt as raw text gives the same greedy continuation: the model went on from "The quick brown"
    expected = _completion(served, runtime.tokenizer.render_chat(BEGUN, continue_final=True))
    assert chat["choices"][0]["message"]["content"] == expected["choices"][0]["text"]
    assert chat["usage"]["prompt_tokens"] == expected["usage"]["prompt_tokens"]


def test_the_messages_api_continues_a_final_assistant_turn_and_counts_its_prompt(served, runtime):
    body = {"model": "any", "max_tokens": 12, "messages": BEGUN}
    status, message = served.post("/v1/messages", body)
    assert status == 200, message
    expected = _completion(served, runtime.tokenizer.render_chat(BEGUN, continue_final=True))
    assert message["content"] == [{"type": "text", "text": expected["choices"][0]["text"]}]
    status, counted = served.post("/v1/messages/count_tokens", body)
    assert status == 200, counted
    assert counted["input_tokens"] == message["usage"]["input_tokens"] == expected["usage"]["prompt_tokens"]


def test_without_prefill_the_assistant_message_is_a_finished_turn(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=12, prefill_assistant=False))
    try:
        status, chat = server.post("/v1/chat/completions", {"messages": BEGUN, "max_tokens": 12,
                                                            "response_format": {"type": "json_object"}})
        assert status == 200, chat
        status, chat = server.post("/v1/chat/completions", {"messages": BEGUN, "max_tokens": 12})
        expected = _completion(server, runtime.tokenizer.render_chat(BEGUN))  # a new assistant turn after it
        assert chat["choices"][0]["message"]["content"] == expected["choices"][0]["text"]
    finally:
        server.close()


@pytest.mark.parametrize(("field", "value"), [
    ("response_format", {"type": "json_object"}),
    ("grammar", 'root ::= "yes"'),
])
def test_a_constraint_on_an_answer_the_client_began_is_refused(served, field, value):
    status, body = served.post("/v1/chat/completions", {"messages": BEGUN, "max_tokens": 4, field: value})
    assert status == 400, body
    error = body["error"]
    assert error["param"] == "messages"
    assert f"'{field}' shapes the answer from its start" in error["message"]
    assert "end the messages with a user message" in error["message"]


def test_a_template_that_rewrites_the_text_cannot_continue_it(runtime):
    from edgesdk.errors import BundleError
    from edgesdk.runtime.text import ChatTokenizer

    tokenizer = ChatTokenizer.__new__(ChatTokenizer)
    tokenizer.__dict__.update(runtime.tokenizer.__dict__)
    tokenizer.template_source = "{% for m in messages %}<{{ m.role }}>{{ m.content | upper }}\n{% endfor %}"
    tokenizer._template = None
    with pytest.raises(BundleError, match="does not write the final assistant message's text as given") as refused:
        tokenizer.render_chat(BEGUN, continue_final=True)
    assert "end the messages with a user message" in refused.value.fix


def test_apply_template_returns_the_prompt_a_chat_request_renders_to(served, runtime):
    """llama-server's POST /apply-template: the text the model would read, nothing generated."""
    tokenizer = runtime.tokenizer
    status, body = served.post("/apply-template", {"messages": BEGUN[:1]})
    assert (status, body) == (200, {"prompt": tokenizer.render_chat(BEGUN[:1])})
    status, body = served.post("/apply-template", {"messages": BEGUN})
    assert (status, body) == (200, {"prompt": tokenizer.render_chat(BEGUN, continue_final=True)})
    status, chat = served.post("/v1/chat/completions", {"messages": BEGUN, "max_tokens": 1})
    assert chat["usage"]["prompt_tokens"] == len(tokenizer.encode(body["prompt"], add_special_tokens=False))
    status, body = served.post("/apply-template", {"messages": [{"role": "robot", "content": "hi"}]})
    assert status == 400
    assert body["error"]["param"] == "messages[0].role"
    status, body = served.post("/apply-template", {"messages": [{"role": "user", "content": "\ud800"}]})
    assert status == 400
    assert body["error"]["param"] == "messages[0].content"
    assert "messages[0].content" in body["error"]["message"]


def test_apply_template_needs_the_key_like_the_other_routes(runtime):
    server = Served(runtime, api_key="sesame")
    try:
        status, body = server.post("/apply-template", {"messages": BEGUN[:1]})
        assert status == 401, body
        status, body = server.post("/apply-template", {"messages": BEGUN[:1]},
                                   headers={"Authorization": "Bearer sesame"})
        assert status == 200, body
    finally:
        server.close()
