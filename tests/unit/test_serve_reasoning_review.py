"""Review of the reasoning split and chat_template_kwargs: refusals that were 500s, llama-server's handling of the
reasoning's whitespace, a begun answer's block, deepseek-legacy, and the splitter under any piece boundaries."""

from __future__ import annotations

import pytest

from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_cli import invoke
from tests.unit.test_serve import Served
from tests.unit.test_serve_reasoning import ASK, THINKING_TEMPLATE, no_whitespace

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


BEGUN = [*ASK, {"role": "assistant", "content": "<think>\nThe fox"}]


def test_an_answer_that_goes_on_inside_a_begun_block_is_reasoning_up_to_its_close(served, thinking_runtime):
    """A begun assistant message that opened the block and began thinking: the model's text goes on inside the
    block. Only a begun message of exactly '<think>' was taken so; with any thought after it, the rest of the
    thought, the '</think>' and the answer all came back as content."""
    from edgesdk.serve.api import parse_chat_request
    from edgesdk.serve.reasoning import split_answer

    splitter = served.completer.reasoning_splitter(parse_chat_request({"messages": BEGUN}))
    assert split_answer(splitter, " runs.\n</think>\n\nIt jumps.") == (" runs.", "It jumps.")
    closed = [*ASK, {"role": "assistant", "content": "<think>\nThe fox runs.\n</think>\n\nIt"}]
    splitter = served.completer.reasoning_splitter(parse_chat_request({"messages": closed}))
    assert split_answer(splitter, " jumps.") == ("", " jumps.")
    plain = [*ASK, {"role": "assistant", "content": "The fox"}]
    splitter = served.completer.reasoning_splitter(parse_chat_request({"messages": plain}))
    assert split_answer(splitter, " runs.</think>") == ("", " runs.</think>")
    # the served answer (the tiny model never closes the block in 6 tokens): all of it reasoning, whole and streamed
    bias = no_whitespace(thinking_runtime)
    plain_answer = served.post("/v1/chat/completions", {"messages": BEGUN, "reasoning_format": "none",
                                                        "logit_bias": bias})[1]
    text = plain_answer["choices"][0]["message"]["content"].rstrip()  # the block goes on: only its end is stripped
    assert text
    status, body = served.post("/v1/chat/completions", {"messages": BEGUN, "logit_bias": bias})
    assert status == 200, body
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "", "reasoning_content": text}
    deltas = [event["choices"][0]["delta"]
              for event in served.stream("/v1/chat/completions", {"messages": BEGUN, "logit_bias": bias})[:-1]]
    assert "".join(delta.get("reasoning_content", "") for delta in deltas) == text
    assert "".join(delta.get("content", "") for delta in deltas) == ""


def test_deepseek_legacy_answers_as_deepseek_and_streams_the_block_in_the_content(served, thinking_runtime):
    """llama-server's fourth reasoning_format (and --reasoning-format value) was refused with a 400: deepseek-legacy
    answers whole as deepseek does, and streams the block inside the content deltas between its tags (its
    reasoning_in_content). The block is cut open by max_tokens here, and stays open as llama-server leaves it (an
    answer not ended by end-of-generation is parsed as partial; tests/unit/test_tools52.py)."""
    bias = no_whitespace(thinking_runtime)
    plain = served.post("/v1/chat/completions", {"messages": ASK, "reasoning_format": "none", "logit_bias": bias})[1]
    text = plain["choices"][0]["message"]["content"].strip()  # the reasoning, stripped as llama.cpp strips it
    assert text
    status, body = served.post("/v1/chat/completions", {"messages": ASK, "reasoning_format": "deepseek-legacy",
                                                        "logit_bias": bias})
    assert status == 200, body
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "", "reasoning_content": text}
    events = served.stream("/v1/chat/completions", {"messages": ASK, "reasoning_format": "deepseek-legacy",
                                                    "logit_bias": bias})
    deltas = [event["choices"][0]["delta"] for event in events[:-1]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert not any("reasoning_content" in delta for delta in deltas)
    assert "".join(delta.get("content", "") for delta in deltas) == f"<think>{text}"
    assert events[-2]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(("answer", "opened", "inline"), [
    ("<think>\nThe fox.\n</think>\n\nIt jumps.", False, "<think>The fox.</think>It jumps."),
    ("The fox.</think>It", True, "<think>The fox.</think>It"),
    ("The fox, never closed", True, "<think>The fox, never closed</think>"),
    ("<think></think>\nIt", False, "It"),
    ("No block <think>x</think>", False, "No block <think>x</think>"),
])
def test_an_inline_split_streams_the_same_in_any_pieces(answer, opened, inline):
    from edgesdk.serve.reasoning import ReasoningSplitter, split_answer

    assert split_answer(ReasoningSplitter(opened, inline=True), answer) == ("", inline)
    for cut in range(1, len(answer)):
        splitter, text = ReasoningSplitter(opened, inline=True), ""
        for piece in (answer[:cut], answer[cut:]):
            text += splitter.push(piece)[1]
        assert text + splitter.flush()[1] == inline, cut
    begun = ReasoningSplitter(inline=True).begun("<think>\nThe fox")
    assert split_answer(begun, " runs.</think>\n\nIt") == ("", " runs.</think>It")


def test_serve_takes_reasoning_format_deepseek_legacy():
    from edgesdk.serve.completion import ServeDefaults

    assert ServeDefaults(reasoning_format="deepseek-legacy").reasoning_format == "deepseek-legacy"
    result = invoke("serve", "nowhere", "--reasoning-format", "hidden")
    assert result.exit_code != 0
    assert "'deepseek-legacy'" in result.stderr


def test_the_messages_route_takes_chat_template_kwargs_as_llama_server_passes_them_on(served):
    """llama-server's Messages route passes chat_template_kwargs on to the chat request; here they were dropped
    without a word, so enable_thinking false left a Qwen3 answer thinking. The count of a prompt whose block the
    template closed is the count of that rendering."""
    tokenizer = served.completer.runtime.tokenizer
    body = {"model": "tiny", "max_tokens": 4, "messages": ASK}
    closed = tokenizer.render_chat(ASK, template_kwargs={"enable_thinking": False})
    status, counted = served.post("/v1/messages/count_tokens", {**body, "chat_template_kwargs": {"enable_thinking": False}})
    assert status == 200, counted
    assert counted["input_tokens"] == len(tokenizer.encode(closed, add_special_tokens=False))
    assert counted["input_tokens"] > served.post("/v1/messages/count_tokens", body)[1]["input_tokens"]
    status, error = served.post("/v1/messages", {**body, "chat_template_kwargs": [1]})
    assert status == 400, error
    assert error["type"] == "error"
    assert "must be a JSON object of template variables" in error["error"]["message"]
