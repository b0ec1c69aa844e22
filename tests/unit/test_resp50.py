"""Review 50, area resp: OpenAI's Responses API's ``truncation``, schema-constrained JSON's first character, and
``perplexity()`` leaving the prompt cache as it found it.

* ``truncation: "auto"`` was read and repeated but changed nothing: a conversation past the context was the 400
  ``context_length_exceeded`` that ``"disabled"`` gives. OpenAI's API reference ("truncation"): "auto: If the input
  to this Response exceeds the model's context window size, the model will truncate the response to fit the
  context window by dropping items from the beginning of the conversation."
* A JSON-schema-constrained answer could start with whitespace ('\n{...'); llama.cpp's schema grammar
  (``root ::= object``, ``object ::= "{" space ...``) and Ollama's ``format`` start at the value.
* ``Model.perplexity`` threw away the KV cache the last answer left: ``save_prompt_cache`` then wrote nothing and the
  next chat turn prefilled its whole prompt again.
"""

from __future__ import annotations

import json

import pytest

PAIRS = [item for index in range(8) for item in (
    {"role": "user", "content": f"{index}: The quick brown fox jumps over the lazy dog."},
    {"role": "assistant", "content": "Edge boards run small language models."})]
LAST = {"role": "user", "content": "Tell me about the fox."}
CONTEXT = 256  # the tiny bundle's max_context
ROOM = 4


def _counted(served, body: dict) -> int:
    status, counted = served.post("/v1/responses/input_tokens", {**body, "truncation": "disabled"})
    assert status == 200, counted
    return counted["input_tokens"]


def _kept_suffix(served, body: dict, items: list) -> tuple[int, int]:
    """(where the newest items that fit with the answer's room begin, their prompt's tokens)."""
    for start in range(len(items)):
        tokens = _counted(served, {**body, "input": items[start:]})
        if tokens + ROOM <= CONTEXT:
            return start, tokens
    raise AssertionError("not even the last item fits")


@pytest.mark.parametrize("instructions", [None, "Answer in one word."])
def test_truncation_auto_drops_the_oldest_items_until_the_conversation_fits(served, instructions):
    items = [*PAIRS, LAST]
    body = {"model": "m", "input": items, "max_output_tokens": ROOM,
            **({"instructions": instructions} if instructions else {})}
    assert _counted(served, body) > CONTEXT
    status, refused = served.post("/v1/responses", body)  # "disabled", the default: OpenAI's 400
    assert (status, refused["error"]["code"]) == (400, "context_length_exceeded"), refused
    status, refused = served.post("/v1/responses", {**body, "truncation": "disabled"})
    assert (status, refused["error"]["code"]) == (400, "context_length_exceeded"), refused

    start, tokens = _kept_suffix(served, body, items)
    assert 0 < start < len(items) - 1  # some items dropped, more than the last kept
    status, answer = served.post("/v1/responses", {**body, "truncation": "auto"})
    assert status == 200, answer
    assert answer["truncation"] == "auto"
    assert answer["usage"]["input_tokens"] == tokens  # what was run: the newest items, instructions kept
    status, counted = served.post("/v1/responses/input_tokens", {**body, "truncation": "auto"})
    assert (status, counted["input_tokens"]) == (200, tokens)
    # the response keeps the whole conversation it was asked with: the next turn cuts again
    status, _, payload = served.request("GET", f"/v1/responses/{answer['id']}/input_items?order=asc&limit=100")
    listed = json.loads(payload)
    assert status == 200
    assert [item["content"][0]["text"] for item in listed["data"]] == [item["content"] for item in items]
    status, following = served.post("/v1/responses", {"model": "m", "previous_response_id": answer["id"],
                                                      "input": "And the dog?", "max_output_tokens": ROOM,
                                                      "truncation": "auto"})
    assert status == 200, following


def test_truncation_auto_streamed_runs_the_kept_items(served):
    items = [*PAIRS, LAST]
    body = {"model": "m", "input": items, "max_output_tokens": ROOM}
    _, tokens = _kept_suffix(served, body, items)
    status, _, payload = served.request("POST", "/v1/responses", {**body, "truncation": "auto", "stream": True})
    assert status == 200, payload
    last = json.loads(payload.decode().strip().split("\n\n")[-1].split("\n", 1)[1].removeprefix("data: "))
    assert last["type"] in ("response.completed", "response.incomplete"), last
    assert last["response"]["usage"]["input_tokens"] == tokens


def test_truncation_auto_keeps_a_function_call_output_with_its_call(served):
    call = {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city": "Paris"}'}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "Sunny. " * 6}
    items = [*PAIRS, call, output]  # no tools: the tiny context holds no tools' description
    body = {"model": "m", "input": items, "max_output_tokens": ROOM}
    whole = _counted(served, {**body, "input": [call, output]})
    assert whole + ROOM <= CONTEXT
    status, answer = served.post("/v1/responses", {**body, "truncation": "auto"})
    assert status == 200, answer
    # the output's call is kept with it: never the output alone
    assert answer["usage"]["input_tokens"] >= whole
    start, tokens = _kept_suffix(served, body, items)
    assert answer["usage"]["input_tokens"] == tokens


def test_truncation_auto_changes_nothing_where_the_conversation_fits(served):
    body = {"model": "m", "input": [*PAIRS[:2], LAST], "max_output_tokens": ROOM}
    status, plain = served.post("/v1/responses", body)
    status_auto, auto = served.post("/v1/responses", {**body, "truncation": "auto"})
    assert (status, status_auto) == (200, 200)
    assert auto["usage"]["input_tokens"] == plain["usage"]["input_tokens"] == _counted(served, body)
    assert auto["output"][0]["content"][0]["text"] == plain["output"][0]["content"][0]["text"]


def test_truncation_auto_never_keeps_a_function_call_output_without_its_call(served):
    """A call too long to keep: the output alone would fit, but it answers nothing without its call (OpenAI: "No
    tool call found for function call output"), so the conversation is past the context, as without truncation."""
    call = {"type": "function_call", "call_id": "call_1", "name": "weather",
            "arguments": json.dumps({"city": "Paris " * 60})}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "Sunny."}
    body = {"model": "m", "input": [*PAIRS, call, output], "max_output_tokens": ROOM, "truncation": "auto"}
    assert _counted(served, {**body, "input": [call, output]}) + ROOM > CONTEXT
    status, refused = served.post("/v1/responses", body)
    assert (status, refused["error"]["code"]) == (400, "context_length_exceeded"), refused


# ------------------------------------------------------------------------------ a schema's answer starts at its value
# llama.cpp's json-schema-to-grammar (common/json-schema-to-grammar.cpp, examples/json_schema_to_grammar.py):
# ``root ::= object``, ``object ::= "{" space ...``: whitespace comes only after a token, never before the value; so
# do Ollama's ``format`` (converted by llama.cpp's code) and llama.cpp's tool-call grammars.

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
BYTES = [bytes((byte,)) for byte in range(256)] + [b"\n{", b" {", b"{\n", b"{ "]


@pytest.mark.parametrize("schema", [SCHEMA, {"type": "array", "items": {"type": "integer"}},
                                    {"anyOf": [SCHEMA, {"type": "array"}]}])
def test_a_schema_constraint_allows_no_whitespace_before_the_value(schema):
    from edgesdk.runtime.json_schema import SchemaConstraint, compile_schema

    constraint = SchemaConstraint(BYTES, compile_schema(schema))
    for text in (b" ", b"\n", b"\t", b"\r", b"\n{", b" {"):
        assert not constraint.allows(BYTES.index(text)), text
    opening = b"[" if schema.get("type") == "array" else b"{"
    assert constraint.allows(BYTES.index(opening))
    constraint.advance(BYTES.index(opening))
    # after a token, llama.cpp's spacing: one space, or a newline and indentation
    assert constraint.allows(BYTES.index(b" "))
    assert constraint.allows(BYTES.index(b"\n"))


def test_json_mode_without_a_schema_starts_at_its_object_too():
    """JSON mode (``json_object``, edgesdk/runtime/json_mode.py) starts at the ``{`` as a schema does, as llama.cpp's
    json.gbnf root (``root ::= object``) does: no whitespace before the value."""
    from edgesdk.runtime.json_mode import JsonConstraint

    assert not JsonConstraint(BYTES).allows(BYTES.index(b"\n{"))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_schema_answers_start_with_their_value_on_every_route(served, seed):
    """At temperature 1 the tiny model starts its answers with newlines and tabs where it may."""
    ask = [{"role": "user", "content": "hi"}]
    response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    status, chat = served.post("/v1/chat/completions", {"messages": ask, "seed": seed, "temperature": 1.0,
                                                        "max_tokens": 12, "response_format": response_format})
    assert status == 200, chat
    status, native = served.post("/completion", {"prompt": "hi", "json_schema": SCHEMA, "seed": seed,
                                                 "temperature": 1.0, "n_predict": 12})
    assert status == 200, native
    status, ollama = served.post("/api/chat", {"model": "tiny-host", "messages": ask, "format": SCHEMA,
                                               "stream": False, "options": {"seed": seed, "temperature": 1.0,
                                                                            "num_predict": 12}})
    assert status == 200, ollama
    status, responses = served.post("/v1/responses", {"model": "m", "input": "hi", "temperature": 1.0, "seed": seed,
                                                      "max_output_tokens": 12, "text": {"format": {
                                                          "type": "json_schema", "name": "person", "schema": SCHEMA}}})
    assert status == 200, responses
    for text in (chat["choices"][0]["message"]["content"], native["content"], ollama["message"]["content"],
                 responses["output"][0]["content"][0]["text"]):
        assert text.startswith("{"), repr(text)


# ------------------------------------------------------------------------------ perplexity leaves the prompt cache
# save_prompt_cache writes "the KV cache the last answer left", and the next chat turn reuses it; a perplexity in
# between threw it away (save then wrote nothing, and the next turn prefilled its whole prompt again).

CHAT = [{"role": "user", "content": "Tell me about the fox."}]
TEXT = "The tide came in over the harbour wall. " * 4
# A question whose greedy answer is text that tokenizes back to the tokens the model gave: the tiny model answers
# CHAT with bytes that are no UTF-8 ("\ufffd" once decoded), which the next turn's prompt cannot hold as they were.
ROUND_TRIP_CHAT = [{"role": "user", "content": "Tell me about the brown fox."}]


def test_perplexity_leaves_the_prompt_cache_as_it_found_it(tiny_bundle, tmp_path):
    import numpy as np

    import edgesdk

    with edgesdk.load(tiny_bundle.path, threads=1) as model:
        first = model.create_chat_completion(ROUND_TRIP_CHAT, max_tokens=4)
        assert "\ufffd" not in first["choices"][0]["message"]["content"]
        before = model.save_prompt_cache(tmp_path / "before.cache")
        assert before > 0
        figure = model.perplexity(TEXT, context=16)
        after = model.save_prompt_cache(tmp_path / "after.cache")
        assert after == before  # the answer's cache, not nothing
        with np.load(tmp_path / "before.cache") as old, np.load(tmp_path / "after.cache") as new:
            assert sorted(old.files) == sorted(new.files)
            for name in old.files:
                assert np.array_equal(old[name], new[name]), name
        # the next turn reuses it: all but the tokens its new text adds come from the cache
        turn = [*ROUND_TRIP_CHAT, first["choices"][0]["message"], {"role": "user", "content": "And the dog?"}]
        second = model.create_chat_completion(turn, max_tokens=8, ignore_eos=True)
        assert model._completer.prompt_cache.reused >= before - 2
        assert model.perplexity(TEXT, context=16) == figure  # the cache put back changes no figure
    with edgesdk.load(tiny_bundle.path, threads=1) as fresh:  # the cache put back is the one the answer left
        expected = fresh.create_chat_completion(turn, max_tokens=8, ignore_eos=True)
    assert second["choices"][0]["message"]["content"] == expected["choices"][0]["message"]["content"]


def test_perplexity_with_nothing_answered_leaves_nothing(tiny_bundle, tmp_path):
    import edgesdk

    with edgesdk.load(tiny_bundle.path, threads=1) as model:
        model.perplexity(TEXT, context=16)
        assert model.save_prompt_cache(tmp_path / "prompt.cache") == 0
        assert not (tmp_path / "prompt.cache").exists()
        answer = model.create_chat_completion(CHAT, max_tokens=4)
        assert answer["choices"][0]["message"]["content"] is not None
