"""Ollama's /api/chat (edgesdk/serve/ollama.py) where a thinking model answers a ``format`` in two passes, and where
``format`` reads OpenAPI 3.0's ``nullable``:

* the second pass's prompt (the messages and the model's thinking) fitted to the context again, as Ollama's
  ChatHandler renders it with ``chatPrompt`` over the messages and the thinking (server/routes.go,
  ``structuredOutputsState_Applying``): the oldest messages dropped where the thinking pushed it past the context,
  not a 400 after the thinking ran;
* the whole answer's logprobs list each token once, the first content token not twice at the join of the passes,
  and are those its stream gives out;
* ``format``'s ``nullable`` read as the chat route's tools read it (json_schema.openapi_nullable): a nullable enum
  admits null on /api/chat as on /v1/chat/completions.

A real server over the tiny bundle (256 tokens of context), its logits steered toward scripted answers
(tests/unit/test_think48.py's Steered)."""

from __future__ import annotations

import json

import pytest

from edgesdk.runtime.json_schema import SchemaConstraint
from edgesdk.serve import ollama
from edgesdk.serve.api import parse_chat_request
from tests.unit.test_think48 import JSON_ANSWER, NAME, SCHEMA, THOUGHT, steered  # noqa: F401 (a fixture)

BYTES = [bytes([b]) for b in range(256)]
CONTEXT = 256  # the tiny bundle's


def _conversation(turns: int) -> list[dict]:
    messages = [{"role": "system", "content": "You answer in JSON."}]
    for index in range(turns):
        messages += [{"role": "user", "content": f"Question number {index} about the quick brown fox?"},
                     {"role": "assistant", "content": f"Answer number {index}: the fox is brown."}]
    return messages + [{"role": "user", "content": "Is the fox quick?"}]


def _ask(server, stream: bool, **fields) -> tuple[int, bytes]:
    body = {"model": NAME, "format": SCHEMA, "stream": stream, "options": {"temperature": 0}, **fields}
    status, _, payload = server.request("POST", "/api/chat", body)
    return status, payload


def _lines(payload: bytes) -> list[dict]:
    return [json.loads(line) for line in payload.decode().splitlines() if line]


@pytest.mark.parametrize("options", [{"num_predict": -1}, {"num_predict": -1, "num_ctx": 200}])
def test_the_second_pass_is_fitted_to_the_context_after_long_thinking(steered, options):  # noqa: F811
    """The first pass's prompt fits, with the room of one token of answer (num_predict -1); the thinking then
    pushes the second prompt past the context (268 tokens of 256 here): it was a 400 (a stream's last line); past
    ``num_ctx``, it ran past it."""
    window = options.get("num_ctx", CONTEXT)
    messages = _conversation(4) if window == CONTEXT else _near_the_context(steered, window - 12, window - 4, turns=1)
    status, payload = _ask(steered, False, messages=messages, options={"temperature": 0, **options})
    assert status == 200, payload
    body = json.loads(payload)
    assert body["message"]["content"] == JSON_ANSWER
    assert body["message"]["thinking"] == THOUGHT
    assert body["prompt_eval_count"] < window  # the second prompt leaves room for the answer, which may shift
    status, payload = _ask(steered, True, messages=messages, options={"temperature": 0, **options})
    assert status == 200, payload
    lines = _lines(payload)
    assert "error" not in lines[-1], lines[-1]
    assert "".join(line["message"]["content"] for line in lines) == JSON_ANSWER
    assert lines[-1]["prompt_eval_count"] == body["prompt_eval_count"]


def _first_prompt(server, messages: list[dict]) -> int:
    """The tokens of the first pass's prompt: the same messages answered without a format (no prompt cache)."""
    status, body = server.post("/api/chat", {"model": NAME, "messages": messages, "stream": False, "truncate": False,
                                             "options": {"temperature": 0, "num_predict": 1}})
    assert status == 200, body
    return body["prompt_eval_count"]


def _near_the_context(server, low: int, high: int, turns: int = 2) -> list[dict]:
    """A conversation whose prompt has between ``low`` and ``high`` tokens (a longer system message each try)."""
    for words in range(0, 80):
        messages = _conversation(turns)
        messages[0] = {"role": "system", "content": "You answer in JSON." + " Be brief." * words}
        if low <= _first_prompt(server, messages) <= high:
            return messages
    pytest.fail(f"no conversation of {low} to {high} tokens")


def test_the_second_pass_keeps_every_message_it_can(steered):  # noqa: F811
    """Only what the thinking needs is dropped: a conversation whose first pass fits with its thinking is answered
    from all of it, its prompt the first one and the thinking."""
    messages = _conversation(1)
    status, payload = _ask(steered, False, messages=messages, options={"temperature": 0, "num_predict": -1})
    assert status == 200, payload
    body = json.loads(payload)
    assert body["prompt_eval_count"] > _first_prompt(steered, messages) + len(THOUGHT.split())


def test_truncate_false_refuses_a_second_prompt_past_the_context_as_ollama_does(steered):  # noqa: F811
    """``truncate`` false: Ollama's chatPrompt keeps every message and its runner refuses a prompt longer than the
    context (runner.go ``NewSequence``: errorInputTooLong, "the input length exceeds the context length", a 400). A
    first prompt that fits, the thinking (run on past the context, which shifts) pushing the second past it: it
    was this server's other 400 ("the prompt has N tokens; this model's context holds 256")."""
    messages = _near_the_context(steered, 236, 248)
    status, payload = _ask(steered, False, messages=messages, truncate=False,
                           options={"temperature": 0, "num_predict": -1})
    assert status == 400, payload
    error = json.loads(payload)["error"]
    assert error.startswith("the input length exceeds the context length"), error
    assert "'truncate' is false" in error
    # streamed: the thinking, then the error as the stream's last line (it was a second HTTP response written into
    # the stream)
    status, payload = _ask(steered, True, messages=messages, truncate=False,
                           options={"temperature": 0, "num_predict": -1})
    assert status == 200, payload
    lines = _lines(payload)
    assert lines[-1]["error"] == error
    assert "".join(line["message"].get("thinking", "") for line in lines[:-1]) == THOUGHT
    # truncate on: the oldest messages go, and the answer is given
    status, payload = _ask(steered, False, messages=messages, options={"temperature": 0, "num_predict": -1})
    assert status == 200, payload
    assert json.loads(payload)["message"]["content"] == JSON_ANSWER


def test_the_whole_answer_lists_each_token_s_logprob_once(steered):  # noqa: F811
    """The first pass is cut at the token where the content begins, which the second pass writes again: its logprob
    was listed twice ('{' '{'). The tokens listed spell the thinking block and the content, and the whole answer's
    logprobs are its stream's."""
    status, payload = _ask(steered, False, messages=[{"role": "user", "content": "Is the fox quick?"}],
                           logprobs=True)
    assert status == 200, payload
    body = json.loads(payload)
    tokens = [entry["token"] for entry in body["logprobs"]]
    assert "".join(tokens) == f"<think>\n{THOUGHT}\n</think>\n\n{JSON_ANSWER}"
    assert len(tokens) == len(body["logprobs"])
    status, payload = _ask(steered, True, messages=[{"role": "user", "content": "Is the fox quick?"}],
                           logprobs=True)
    assert status == 200, payload
    streamed = [entry for line in _lines(payload) for entry in line.get("logprobs", [])]
    assert streamed == body["logprobs"]


NULLABLE_ENUM = {"type": "object", "properties": {"kind": {"type": "string", "enum": ["a", "b"], "nullable": True}},
                 "required": ["kind"], "additionalProperties": False}


def _accepts(schema, text: str) -> bool:
    constraint = SchemaConstraint(BYTES, schema)
    for byte in text.encode():
        if not constraint.allows(byte):
            return False
        constraint.advance(byte)
    return constraint.complete


def test_format_reads_a_nullable_enum_as_the_chat_route_s_tools_do():
    """A nullable enum admitted null in a tool's parameters on /v1/chat/completions (json_schema.openapi_nullable)
    but not in /api/chat's format, whose own reading left the enum without null."""
    asked = ollama.parse_chat({"model": NAME, "messages": [{"role": "user", "content": "hi"}],
                               "format": NULLABLE_ENUM}, NAME)
    schema = asked.request.json_schema
    assert _accepts(schema, '{"kind":null}')
    assert _accepts(schema, '{"kind":"a"}')
    assert not _accepts(schema, '{"kind":"c"}')
    tools = [{"type": "function", "function": {"name": "f", "parameters": NULLABLE_ENUM}}]
    chat = parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "tools": tools})
    call = json.dumps({"tool_call": {"name": "f", "arguments": {"kind": None}}})
    assert _accepts(chat.tools.schema, call)
    # the same reading of each schema on both routes
    nested = {"type": "object", "properties": {"n": {"type": "integer", "nullable": True}, "free": {
        "description": "no type", "nullable": True}, "list": {"type": "array", "items": {
            "enum": [1, 2], "nullable": True}}}}
    assert ollama.json_schema(nested) == {"type": "object", "properties": {
        "n": {"type": ["integer", "null"]}, "free": {"description": "no type"},
        "list": {"type": "array", "items": {"enum": [1, 2, None]}}}}
