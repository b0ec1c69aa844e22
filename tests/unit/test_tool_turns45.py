"""Several tool results in a row become one user turn, so a chat template that wants the roles to alternate takes them.

An answer of several calls is answered by several results: OpenAI's chat sends a ``tool`` message each, Anthropic's
Messages API one user turn of several ``tool_result`` blocks (and text), Ollama's /api/chat a ``tool`` message each,
the Responses API a ``function_call_output`` item each. Each result is a user turn of llama.cpp's generic tool
format (``{"tool_response": ...}``, minja's ``polyfill_tool_responses``), and llama.cpp merges none of them, so the
prompt has several user turns in a row; Llama 2's and Mistral's templates refuse that with "Conversation roles must
alternate user/assistant/user/assistant/...". edgesdk/serve/api.py, ``chat_turns``, joins them (and a user message
after them) into one user turn, in order. Driven through the real HTTP server over the tiny bundle, its chat
template swapped for one modelled on Llama 2's.
"""

from __future__ import annotations

import json

import pytest

from edgesdk.serve.api import chat_turns, parse_chat_request
from edgesdk.serve.completion import ServeDefaults
from edgesdk.serve.tools import is_tool_result, tool_result_text
from tests._utils.tiny import CHAT_TEMPLATE
from tests.unit.test_serve import Served

# Llama 2's check (meta-llama/Llama-2-7b-chat-hf's tokenizer_config.json), around the tiny model's ChatML turns
LLAMA2_CHECK = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% else %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% endfor %}" + CHAT_TEMPLATE)

# short call ids: each call and each result carries the call's id (as llama.cpp's polyfills write them), and the
# conversations below pass the session's tiny bundle's 256 tokens (the fixture below builds one of 512)
CALLS = [{"id": "a", "type": "function", "function": {"name": "tick", "arguments": "{}"}},
         {"id": "b", "type": "function", "function": {"name": "ping", "arguments": "{}"}}]
TOOLS = [{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
         for name in ("tick", "ping")]
CHAT = [{"role": "user", "content": "Time?"},
        {"role": "assistant", "content": None, "tool_calls": CALLS},
        {"role": "tool", "tool_call_id": "a", "content": "12:00"},
        {"role": "tool", "tool_call_id": "b", "content": "pong"},
        {"role": "user", "content": "Words?"}]
# the one user turn the two results and the question make, in order
JOINED = "\n".join([tool_result_text("tick", "12:00", "a"), tool_result_text("ping", "pong", "b"), "Words?"])


@pytest.fixture(scope="module")
def alternating(tiny_model_dir, tmp_path_factory):
    """A server whose chat template refuses two user turns in a row, as Llama 2's and Mistral's do, over the tiny
    model built with a context that holds the conversations below."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.runtime.session import open_runtime

    bundle = build(BuildConfig(target="host", model=str(tiny_model_dir), out=tmp_path_factory.mktemp("turns45") / "b",
                               export=ExportConfig(max_context=512), progress=False))
    runtime = open_runtime(bundle.path, threads=1)
    runtime.tokenizer.template_source = LLAMA2_CHECK
    runtime.tokenizer._template = None
    server = Served(runtime, ServeDefaults(max_tokens=4))
    yield server
    server.close()


def _turns(server: Served, messages: list, **fields) -> str:
    """The prompt the chat route renders (llama-server's /apply-template)."""
    status, rendered = server.post("/apply-template", {"messages": messages, **fields})
    assert status == 200, rendered
    return rendered["prompt"]


def test_the_template_refuses_user_turns_in_a_row(alternating):
    status, refused = alternating.post("/apply-template", {"messages": [CHAT[0], CHAT[0]]})
    assert status == 400
    assert "Conversation roles must alternate" in refused["error"]["message"]


def test_chat_turns_join_results_and_the_user_message_after_them_in_order():
    request = parse_chat_request({"messages": CHAT})
    turns = chat_turns(request.messages)
    assert [turn["role"] for turn in turns] == ["user", "assistant", "user"]
    assert turns[2] == {"role": "user", "content": JOINED}
    # plain user turns in a row stay apart, as llama-server keeps them; a result after a user turn joins it
    plain = parse_chat_request({"messages": [CHAT[0], CHAT[4]]})
    assert chat_turns(plain.messages) == [{"role": "user", "content": CHAT[0]["content"]},
                                          {"role": "user", "content": CHAT[4]["content"]}]
    last = chat_turns(parse_chat_request({"messages": CHAT[:4]}).messages)
    assert last[-1] == {"role": "user", "content": "\n".join(JOINED.split("\n")[:2])}
    # a user text that merely looks like a result is one too (it joins), but not text around such JSON
    assert is_tool_result(tool_result_text(None, "x"))
    assert not is_tool_result(tool_result_text("tick", "x") + " and more")
    assert not is_tool_result('{"tool_response": 1}')


def test_chat_route_renders_several_results_as_one_user_turn(alternating):
    prompt = _turns(alternating, CHAT)
    assert prompt.count("<|im_start|>user\n") == 2
    offered = _turns(alternating, CHAT, tools=TOOLS, parallel_tool_calls=True)  # the tools' system message first
    assert offered.startswith("<|im_start|>system\n")
    assert offered.count("<|im_start|>user\n") == 2
    assert f"<|im_start|>user\n{JOINED}<|im_end|>\n<|im_start|>assistant\n" in offered
    assert f"<|im_start|>user\n{JOINED}<|im_end|>\n<|im_start|>assistant\n" in prompt
    status, answer = alternating.post("/v1/chat/completions", {"messages": CHAT, "max_tokens": 4})
    assert status == 200, answer


def test_anthropic_turn_of_several_tool_results_and_text(alternating):
    body = {"max_tokens": 4, "messages": [{"role": "user", "content": "Time?"},
                         {"role": "assistant", "content": [
                             {"type": "tool_use", "id": "a", "name": "tick", "input": {}},
                             {"type": "tool_use", "id": "b", "name": "ping", "input": {}}]},
                         {"role": "user", "content": [
                             {"type": "tool_result", "tool_use_id": "a", "content": "12:00"},
                             {"type": "tool_result", "tool_use_id": "b", "content": [
                                 {"type": "text", "text": "pong"}]},
                             {"type": "text", "text": "Words?"}]}]}
    status, answer = alternating.post("/v1/messages", body)
    assert status == 200, answer
    assert answer["type"] == "message"
    # the same prompt as the chat route's for the same conversation
    _, counted = alternating.post("/v1/messages/count_tokens", {k: v for k, v in body.items() if k != "max_tokens"})
    status, chat = alternating.post("/v1/chat/completions", {"messages": CHAT, "max_tokens": 1})
    assert status == 200, chat
    assert counted["input_tokens"] == chat["usage"]["prompt_tokens"]


def test_ollama_several_tool_messages(alternating):
    messages = [{"role": "user", "content": "Time?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "tick", "arguments": {}}},
                    {"function": {"name": "ping", "arguments": {}}}]},
                {"role": "tool", "tool_name": "tick", "content": "12:00"},
                {"role": "tool", "tool_name": "ping", "content": "pong"},
                {"role": "user", "content": "Words?"}]
    status, answer = alternating.post("/api/chat", {"model": "tiny-host", "messages": messages, "stream": False,
                                                     "options": {"num_predict": 2}})
    assert status == 200, answer
    assert answer["done"]


def test_responses_several_function_call_outputs(alternating):
    items = [{"role": "user", "content": "Time?"},
             {"type": "function_call", "call_id": "a", "name": "tick", "arguments": "{}"},
             {"type": "function_call", "call_id": "b", "name": "ping", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "a", "output": "12:00"},
             {"type": "function_call_output", "call_id": "b", "output": "pong"},
             {"role": "user", "content": "Words?"}]
    status, answer = alternating.post("/v1/responses", {"input": items, "max_output_tokens": 16, "store": False})
    assert status == 200, answer
    assert answer["usage"]["input_tokens"] == _count(alternating, CHAT)


def _count(server: Served, messages: list) -> int:
    status, tokens = server.post("/tokenize", {"content": _turns(server, messages)})
    assert status == 200, tokens
    return len(tokens["tokens"])


def test_a_template_that_takes_every_role_gets_the_joined_turn_too(served):
    """The tiny model's ChatML template would render a ``tool`` role, but tool messages never reach a template as
    ``tool`` here (every template gets llama.cpp's generic user-turn form), so it gets the same one user turn."""
    prompt = _turns(served, CHAT)
    assert "<|im_start|>tool" not in prompt
    assert f"<|im_start|>user\n{JOINED}<|im_end|>\n" in prompt
    assert json.loads(JOINED.split("\n")[1]) == {"tool_response": {"tool": "ping", "content": "pong",
                                                                    "tool_call_id": "b"}}
