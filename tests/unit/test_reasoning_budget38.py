"""Thinking switched off as llama-server switches it: --reasoning-budget 0 (ServeDefaults.reasoning_budget) renders
the chat template with enable_thinking false unless chat_template_kwargs set it, and a template that opens the
<think> block whatever enable_thinking says (DeepSeek-R1's distills) gets the block closed in the prompt, so the
answer is content, not reasoning forced open (common/chat.cpp)."""

from __future__ import annotations

import pytest

from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served
from tests.unit.test_serve_reasoning import ASK, THINKING_TEMPLATE, no_whitespace

# DeepSeek-R1-Distill's generation prompt: the block opened whatever the variables say
ALWAYS_OPEN = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
               "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")


def _runtime(bundle, template: str):
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(bundle.path, threads=1)
    runtime.tokenizer.template_source, runtime.tokenizer._template = template, None
    return runtime


@pytest.fixture(scope="module")
def always_open(tiny_bundle):
    return _runtime(tiny_bundle, ALWAYS_OPEN)


@pytest.fixture(scope="module")
def qwen_like(tiny_bundle):
    return _runtime(tiny_bundle, THINKING_TEMPLATE)


def _prompt(server: Served, **fields) -> str:
    status, rendered = server.post("/apply-template", {"messages": ASK, **fields})
    assert status == 200, rendered
    return rendered["prompt"]


def test_enable_thinking_false_closes_a_block_the_template_always_opens(always_open):
    server = Served(always_open, ServeDefaults(max_tokens=6))
    try:
        off = {"chat_template_kwargs": {"enable_thinking": False}}
        assert _prompt(server).endswith("assistant\n<think>\n")
        assert _prompt(server, **off).endswith("assistant\n<think>\n</think>")
        bias = no_whitespace(always_open)
        status, thinking = server.post("/v1/chat/completions", {"messages": ASK, "logit_bias": bias})
        assert status == 200, thinking
        assert thinking["choices"][0]["message"]["reasoning_content"]  # forced open: the answer is reasoning
        status, answer = server.post("/v1/chat/completions", {"messages": ASK, "logit_bias": bias, **off})
        assert status == 200, answer
        message = answer["choices"][0]["message"]
        assert "reasoning_content" not in message
        assert message["content"]
        events = server.stream("/v1/chat/completions", {"messages": ASK, "logit_bias": bias, **off})
        deltas = [event["choices"][0]["delta"] for event in events[:-1]]
        assert not any("reasoning_content" in delta for delta in deltas)
        assert "".join(delta.get("content") or "" for delta in deltas) == message["content"]
    finally:
        server.close()


def test_a_reasoning_budget_of_0_renders_with_enable_thinking_false_unless_kwargs_set_it(qwen_like, always_open):
    server = Served(qwen_like, ServeDefaults(max_tokens=6, reasoning_budget=0))
    try:
        assert _prompt(server).endswith("<think>\n\n</think>\n\n")
        assert _prompt(server, chat_template_kwargs={"enable_thinking": True}).endswith("assistant\n<think>\n")
        qwen_like.tokenizer.template_kwargs = {"enable_thinking": True}  # the server's --chat-template-kwargs
        try:
            assert _prompt(server).endswith("assistant\n<think>\n")
        finally:
            qwen_like.tokenizer.template_kwargs = {}
    finally:
        server.close()
    server = Served(always_open, ServeDefaults(max_tokens=6, reasoning_budget=0))
    try:
        assert _prompt(server).endswith("assistant\n<think>\n</think>")
    finally:
        server.close()


@pytest.mark.parametrize("budget", [5, -2, True, "0"])
def test_a_reasoning_budget_llama_server_does_not_take_is_refused_by_name(budget):
    with pytest.raises(ValueError, match=r"reasoning_budget must be -1 \(thinking without limit\) or 0"):
        ServeDefaults(reasoning_budget=budget)
