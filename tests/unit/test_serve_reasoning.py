"""A thinking model's <think> block as reasoning_content, and chat_template_kwargs (enable_thinking), as
llama-server gives them: the splitter on its own, then a real server over the tiny bundle whose chat template
thinks as Qwen3's does (the block opened in the prompt, or closed empty with enable_thinking false)."""

from __future__ import annotations

import json

import pytest

from edgesdk.serve.completion import ServeDefaults
from edgesdk.serve.reasoning import ReasoningSplitter, prompt_opens_thinking, split_answer
from tests.unit.test_cli import assert_ok, invoke
from tests.unit.test_serve import Served

THINKING_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% else %}<think>\n"
    "{% endif %}{% endif %}"
)
ASK = [{"role": "user", "content": "Tell me about the fox."}]

ANSWERS = [  # (answer, opened in the prompt) -> (reasoning, content)
    ("<think>\nThe fox is quick.\n</think>\n\nIt jumps.", False, ("The fox is quick.", "It jumps.")),
    ("  <think>a</think>b", False, ("a", "b")),
    ("No thinking here <think>x</think>", False, ("", "No thinking here <think>x</think>")),
    ("The fox.\n</think>\n\nIt jumps.", True, ("The fox.", "It jumps.")),
    ("<think>never closed, the limit came first", False, ("never closed, the limit came first", "")),
    ("reasoning only </thi", True, ("reasoning only", "")),  # the limit cut the tag: its start is dropped
    ("<thin", False, ("", "<thin")),
    ("", True, ("", "")),
    ("<think></think>", False, ("", "")),
    ("a < b </think>c", True, ("a < b", "c")),
    ("<think>\n\n</think>\n\nNo thought.", False, ("", "No thought.")),  # enable_thinking false
    ("\n  two \n\n lines  \n", True, ("two \n\n lines", "")),  # stripped, inner whitespace kept
]


@pytest.mark.parametrize(("answer", "opened", "expected"), ANSWERS)
def test_an_answer_splits_the_same_whole_and_streamed_in_any_pieces(answer, opened, expected):
    assert split_answer(ReasoningSplitter(opened), answer) == expected
    for size in (1, 2, 3, 7):
        splitter, reasoning, content = ReasoningSplitter(opened), "", ""
        for start in range(0, len(answer), size):
            r, c = splitter.push(answer[start:start + size])
            reasoning, content = reasoning + r, content + c
        r, c = splitter.flush()
        assert (reasoning + r, content + c) == expected, size


def test_a_prompt_that_ends_inside_an_open_block_is_thinking_forced_open():
    assert prompt_opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def thinking_runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(tiny_bundle.path, threads=1)
    runtime.tokenizer.template_source, runtime.tokenizer._template = THINKING_TEMPLATE, None
    return runtime


@pytest.fixture
def served(thinking_runtime):
    server = Served(thinking_runtime, ServeDefaults(max_tokens=10))
    yield server
    server.close()


def no_whitespace(runtime) -> dict:
    """A logit_bias banning every token whose text is only whitespace (the tiny model's favourite answer is a
    run of newlines, which a stripped reasoning would leave empty)."""
    tokenizer = runtime.tokenizer
    size = tokenizer.tokenizer.get_vocab_size(with_added_tokens=True)
    return {str(token): -100 for token in range(size) if not tokenizer.decode([token]).strip()}


def _chat(server: Served, **fields) -> dict:
    status, body = server.post("/v1/chat/completions", {"messages": ASK, **fields})
    assert status == 200, body
    return body["choices"][0]["message"]


def test_a_block_the_template_opened_comes_back_as_reasoning_content(served, thinking_runtime):
    """The template opens <think> in the prompt and the model never closes it in 10 tokens: the whole answer
    is reasoning (llama-server's deepseek format, which auto picks for a template that thinks); with
    reasoning_format none the same tokens are the content."""
    bias = no_whitespace(thinking_runtime)
    plain = _chat(served, reasoning_format="none", logit_bias=bias)
    assert "reasoning_content" not in plain
    assert plain["content"]
    thought = _chat(served, logit_bias=bias)
    assert plain["content"].strip()  # the tiny model's answer is not all whitespace
    # stripped of the whitespace around it, as llama.cpp gives reasoning_content
    assert thought == {"role": "assistant", "content": "", "reasoning_content": plain["content"].strip()}
    events = served.stream("/v1/chat/completions", {"messages": ASK, "logit_bias": bias})
    deltas = [event["choices"][0]["delta"] for event in events[:-1]]
    assert "".join(delta.get("reasoning_content", "") for delta in deltas) == plain["content"].strip()
    assert "".join(delta.get("content", "") for delta in deltas) == ""


def test_chat_template_kwargs_reach_the_template_and_enable_thinking_false_closes_the_block(served):
    status, rendered = served.post("/apply-template", {"messages": ASK, "chat_template_kwargs": {"enable_thinking": False}})
    assert status == 200, rendered
    assert rendered["prompt"].endswith("<think>\n\n</think>\n\n")
    answer = _chat(served, chat_template_kwargs={"enable_thinking": False})
    assert "reasoning_content" not in answer
    assert answer["content"]


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ([1], "must be a JSON object of template variables"),
    ({"messages": []}, "sets messages, which the rendering sets itself"),
])
def test_bad_chat_template_kwargs_are_refused_by_name(served, kwargs, fragment):
    status, body = served.post("/v1/chat/completions", {"messages": ASK, "chat_template_kwargs": kwargs})
    assert status == 400, body
    assert body["error"]["param"] == "chat_template_kwargs"
    assert fragment in body["error"]["message"]


def test_an_unknown_reasoning_format_is_refused(served):
    status, body = served.post("/v1/chat/completions", {"messages": ASK, "reasoning_format": "hidden"})
    assert status == 400, body
    assert "'reasoning_format' must be one of auto, none, deepseek" in body["error"]["message"]


def test_a_constrained_answer_keeps_its_text_as_content(served):
    """JSON mode shapes the answer from its first token, so no block is looked for."""
    answer = _chat(served, response_format={"type": "json_object"})
    assert "reasoning_content" not in answer


def test_run_passes_chat_template_kwargs_and_refuses_bad_ones(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "--prompt", "Hello", "-n", 4, "--chat-template-kwargs",
                    '{"add_generation_prompt": false}')
    assert result.exit_code != 0
    assert "sets add_generation_prompt, which the rendering sets itself" in result.stderr
    result = invoke("run", tiny_bundle.path, "--prompt", "Hello", "-n", 4, "--chat-template-kwargs", "{nope")
    assert result.exit_code != 0
    assert "is not JSON" in result.stderr
    assert_ok(invoke("run", tiny_bundle.path, "--prompt", "Hello", "-n", 4, "--chat-template-kwargs",
                     '{"enable_thinking": false}'))


def _message_events(server: Served, body: dict) -> list[tuple[str, dict]]:
    status, _, payload = server.request("POST", "/v1/messages", {**body, "stream": True})
    assert status == 200, payload
    events = []
    for chunk in payload.decode().split("\n\n"):
        if chunk:
            name, data = chunk.split("\n", 1)
            events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def test_the_messages_api_gives_the_reasoning_as_a_thinking_block_whole_and_streamed(terse):
    """Anthropic's extended-thinking shape: a thinking block (its signature empty: nothing here signs) before the
    text; streamed, thinking_delta events in block 0. The tiny model never closes the block in 10 tokens, so
    there is no text block, whole or streamed."""
    served = terse
    body = {"model": "m", "max_tokens": 10, "messages": ASK}
    plain = _chat(served, reasoning_format="none", max_tokens=10)["content"]
    assert plain.strip()
    status, whole = served.post("/v1/messages", body)
    assert status == 200, whole
    assert [block["type"] for block in whole["content"]] == ["thinking"]
    assert whole["content"][0]["signature"] == ""
    events = _message_events(served, body)
    starts = [data["content_block"]["type"] for name, data in events if name == "content_block_start"]
    assert starts == ["thinking"]
    thought = "".join(data["delta"]["thinking"] for name, data in events
                      if name == "content_block_delta" and data["delta"]["type"] == "thinking_delta")
    assert thought == whole["content"][0]["thinking"]
    assert thought == plain.strip()  # the chat route's answer with the block left in, stripped as llama.cpp does
    assert [name for name, _ in events][-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_the_messages_api_with_thinking_off_answers_in_one_text_block(served):
    body = {"model": "m", "max_tokens": 10, "messages": ASK, "chat_template_kwargs": {"enable_thinking": False}}
    status, whole = served.post("/v1/messages", body)
    assert status == 200, whole
    assert [block["type"] for block in whole["content"]] == ["text"]
    events = _message_events(served, body)
    starts = [data["content_block"]["type"] for name, data in events if name == "content_block_start"]
    assert starts == ["text"]
    text = "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta")
    assert text == whole["content"][0]["text"]


def test_a_streamed_answer_closes_the_thinking_block_when_its_text_begins():
    from edgesdk.serve.anthropic import ThinkingStream

    blocks = ThinkingStream()
    events = blocks.pieces("The fox", "") + blocks.pieces(" runs.", "It") + blocks.pieces("", " jumps.") + blocks.close()
    shapes = [(name, data.get("index"), (data.get("content_block") or data.get("delta") or {}).get("type"))
              for name, data in events]
    assert shapes == [("content_block_start", 0, "thinking"), ("content_block_delta", 0, "thinking_delta"),
                      ("content_block_delta", 0, "thinking_delta"), ("content_block_delta", 0, "signature_delta"),
                      ("content_block_stop", 0, None), ("content_block_start", 1, "text"), ("content_block_delta", 1, "text_delta"),
                      ("content_block_delta", 1, "text_delta"), ("content_block_stop", 1, None)]
    empty = ThinkingStream()
    assert [name for name, _ in empty.close()] == ["content_block_start", "content_block_stop"]  # one empty text block


def test_the_messages_api_s_thinking_switch_is_the_template_s_enable_thinking(served, terse):
    """thinking disabled closes Qwen3-style templates' block (a text answer), enabled leaves it open (a thinking
    block); a request's own chat_template_kwargs win over the switch."""
    base = {"model": "m", "max_tokens": 10, "messages": ASK}
    status, rendered = served.post("/v1/messages/count_tokens", {**base, "thinking": {"type": "disabled"}})
    assert status == 200, rendered
    status, closed = served.post("/v1/messages/count_tokens", {**base, "chat_template_kwargs": {"enable_thinking": False}})
    assert rendered == closed  # the same prompt as enable_thinking false
    status, off = terse.post("/v1/messages", {**base, "thinking": {"type": "disabled"}})
    assert status == 200, off
    assert [block["type"] for block in off["content"]] == ["text"]
    # an enabled budget must be below max_tokens (Anthropic's rule): adaptive renders as enabled does, with no budget
    status, on = terse.post("/v1/messages", {**base, "thinking": {"type": "adaptive"}})
    assert status == 200, on
    assert [block["type"] for block in on["content"]] == ["thinking"]
    status, theirs = terse.post("/v1/messages", {**base, "thinking": {"type": "adaptive"},
                                                 "chat_template_kwargs": {"enable_thinking": False}})
    assert [block["type"] for block in theirs["content"]] == ["text"]
