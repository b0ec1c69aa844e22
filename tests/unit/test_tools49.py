"""Review 49 of tool calls and constraint errors on the chat routes (edgesdk/serve/tools.py, api.py, completion.py).

* An answer under tools cut (by max_tokens or a stop string) before its call's name was whole or its text had begun
  is an empty content and no call, whole and streamed: the JSON written so far is this server's envelope
  (``{"tool_call"``), never the model's words, and llama-server's partial parse of its generic format gives nothing
  for it (common/chat.cpp ``common_chat_parse_generic``; server-context.cpp ``update_chat_msg``).
* A constraint refused mid-answer names the field the client wrote: llama-server's ``json_schema`` is not called
  ``response_format``.
* A grammar or schema completed by the token limit's last token ends at the limit, as llama-server's (its
  ``has_budget`` check stops the slot with STOP_TYPE_LIMIT before the end-of-text token is sampled) and Ollama's (its
  runner stops at numPredict with DoneReasonLength): finish_reason ``length``, stop_type ``limit``, Anthropic's
  ``max_tokens``, Ollama's done_reason ``length``.
"""

from __future__ import annotations

import json

import pytest

from edgesdk.serve.completion import ServeDefaults
from edgesdk.serve.tools import AnswerStream, answer_message
from tests._utils.chat_stream import accumulated_message
from tests.unit.test_serve import Served

USER = [{"role": "user", "content": "Hi"}]
PING = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}
NAME = "tiny-host:latest"
# nested optional repetitions: the pattern's matcher meets its walk cap once the answer reaches the string
NESTED = "^(((((a?){0,10}){0,10}){0,10}){0,10}){0,10}$"
CAPPED = {"type": "object", "properties": {"s": {"type": "string", "pattern": NESTED}}, "required": ["s"]}
GRAMMAR = 'root ::= "ab"'


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    """The tiny model with a context that holds the tools' description and an answer."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.runtime.session import open_runtime
    from tests._utils.tiny import save_tiny_model_dir

    root = tmp_path_factory.mktemp("tools49")
    model = save_tiny_model_dir(root / "model", hidden=64, heads=4, kv_heads=2, max_positions=1024)
    bundle = build(BuildConfig(target="host", model=str(model), out=root / "b", export=ExportConfig(max_context=1024),
                               progress=False))
    return open_runtime(bundle.path, threads=1)


@pytest.fixture
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=16))
    yield server
    server.close()


@pytest.fixture(scope="module")
def no_whitespace(runtime) -> dict[str, int]:
    """``logit_bias`` banning every token whose text is only whitespace, so a JSON answer reaches its values."""
    tokenizer = runtime.tokenizer.tokenizer
    return {str(token): -100 for token in range(tokenizer.get_vocab_size())
            if (text := tokenizer.decode([token])) and not text.strip()}


# ----------------------------------------------------------------------- 1. an answer cut before anything of it


ENVELOPES = ['{"tool_call": {"name": "get_ti', '{"tool_call"', '{"tool_calls": [{"name": "pi', '{"tool_calls": [',
             '{"resp', '{"response": ', '{', '']


@pytest.mark.parametrize("text", ENVELOPES)
@pytest.mark.parametrize("reason", ["length", "stop"])
def test_an_answer_cut_before_its_call_or_text_began_is_empty_not_the_envelope(text, reason):
    assert answer_message(text, reason) == ({"content": ""}, reason)
    stream = AnswerStream()
    deltas = [{"role": "assistant", "content": None}]
    for char in text:
        deltas += stream.push(char)
    rest, fields, finish = stream.finish(reason)
    assert (fields, finish) == ({"content": ""}, reason)
    assert accumulated_message(deltas + rest) == {"role": "assistant", "content": ""}


def test_an_empty_text_answer_cut_at_its_end_is_empty_too():
    assert answer_message('{"response": ""', "length") == ({"content": ""}, "length")


def test_a_call_cut_before_its_name_on_the_chat_route_gives_no_envelope(served):
    body = {"messages": USER, "tools": [PING], "tool_choice": "required", "max_tokens": 2, "temperature": 0}
    status, answer = served.post("/v1/chat/completions", body)
    assert status == 200, answer
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] == ""
    assert "tool_calls" not in choice["message"]
    events = served.stream("/v1/chat/completions", body)
    deltas = [chunk["choices"][0]["delta"] for chunk in events[:-1] if chunk["choices"]]
    assert accumulated_message(deltas) == {"role": "assistant", "content": ""}
    # Anthropic's text block and Ollama's content are empty alike
    status, message = served.post("/v1/messages", {"model": "tiny", "messages": USER, "max_tokens": 2,
                                                   "tools": [{"name": "ping", "input_schema": {"type": "object"}}],
                                                   "tool_choice": {"type": "any"}})
    assert status == 200, message
    assert message["content"] == [{"type": "text", "text": ""}]
    assert message["stop_reason"] == "max_tokens"
    status, chat = served.post("/api/chat", {"model": NAME, "messages": USER, "tools": [PING], "stream": False,
                                             "options": {"num_predict": 2, "temperature": 0}})
    assert status == 200, chat
    assert chat["message"]["content"] == ""
    assert chat["done_reason"] == "length"


# ------------------------------------------------------------------ 2. a refused constraint names its own field


def test_a_schema_refused_mid_answer_names_llama_server_s_json_schema_field(served, no_whitespace):
    status, answer = served.post("/v1/chat/completions", {"messages": USER, "json_schema": CAPPED,
                                                          "logit_bias": no_whitespace, "temperature": 0})
    assert status == 400, answer
    assert answer["error"]["param"] == "json_schema"
    assert answer["error"]["message"].startswith("json_schema: ")
    assert "parses at once" in answer["error"]["message"]
    status, answer = served.post("/completion", {"prompt": "Hi", "json_schema": CAPPED, "logit_bias": no_whitespace,
                                                 "temperature": 0})
    assert status == 400, answer
    assert answer["error"]["param"] == "json_schema"
    # OpenAI's response_format is still named so
    status, answer = served.post("/v1/chat/completions", {
        "messages": USER, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": CAPPED}},
        "logit_bias": no_whitespace, "temperature": 0})
    assert status == 400, answer
    assert answer["error"]["param"] == "response_format"


# ------------------------------------------------------------------ 3. a grammar completed by the token limit


def _grammar_tokens(served) -> int:
    status, answer = served.post("/completion", {"prompt": "Hi", "n_predict": 8, "grammar": GRAMMAR,
                                                 "temperature": 0, "return_tokens": True})
    assert status == 200, answer
    assert (answer["content"], answer["stop_type"]) == ("ab", "eos")
    # tokens lists the end-of-text token the grammar's end samples, as llama-server's process_token does
    assert answer["tokens_predicted"] == len(answer["tokens"])
    return len(answer["tokens"]) - 1


def test_a_grammar_completed_by_the_limit_s_last_token_ends_at_the_limit(served):
    limit = _grammar_tokens(served)
    status, answer = served.post("/completion", {"prompt": "Hi", "n_predict": limit, "grammar": GRAMMAR,
                                                 "temperature": 0})
    assert status == 200, answer
    assert (answer["content"], answer["stop_type"], answer["tokens_predicted"]) == ("ab", "limit", limit)
    status, body = served.post("/v1/completions", {"prompt": "Hi", "max_tokens": limit, "grammar": GRAMMAR,
                                                   "temperature": 0})
    assert status == 200, body
    assert (body["choices"][0]["text"], body["choices"][0]["finish_reason"]) == ("ab", "length")
    # one token more leaves room for the end-of-text token the grammar's end allows: a stop
    status, answer = served.post("/completion", {"prompt": "Hi", "n_predict": limit + 1, "grammar": GRAMMAR,
                                                 "temperature": 0})
    assert (answer["content"], answer["stop_type"]) == ("ab", "eos")


def test_a_tool_call_completed_by_the_limit_ends_at_the_limit_on_every_route(served, no_whitespace):
    body = {"messages": USER, "tools": [PING], "tool_choice": "required", "temperature": 0,
            "logit_bias": no_whitespace}
    status, free = served.post("/v1/chat/completions", {**body, "max_tokens": 64})
    assert status == 200, free
    assert free["choices"][0]["finish_reason"] == "tool_calls"
    used = free["usage"]["completion_tokens"] - 1  # the call's tokens; the end-of-text token after them counted
    status, cut = served.post("/v1/chat/completions", {**body, "max_tokens": used})
    assert status == 200, cut
    choice = cut["choices"][0]
    assert choice["finish_reason"] == "length"  # llama-server: "length" where the slot stopped at its limit
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "ping", "arguments": "{}"}
    assert cut["usage"]["completion_tokens"] == used
    events = served.stream("/v1/chat/completions", {**body, "max_tokens": used})
    finishes = [chunk["choices"][0]["finish_reason"] for chunk in events[:-1]
                if chunk["choices"] and chunk["choices"][0]["finish_reason"]]
    assert finishes == ["length"]


def test_an_ollama_format_completed_by_num_predict_is_done_for_length(served):
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}

    def generate(limit: int) -> dict:
        status, body = served.post("/api/generate", {"model": NAME, "prompt": "Hi", "stream": False, "format": schema,
                                                     "options": {"temperature": 0, "num_predict": limit,
                                                                 "repeat_penalty": 1.5}})
        assert status == 200, body
        return body

    free = generate(200)
    assert free["done_reason"] == "stop", free
    at_limit = generate(free["eval_count"] - 1)
    assert at_limit["response"] == free["response"]
    assert json.loads(at_limit["response"]) == json.loads(free["response"])
    assert at_limit["done_reason"] == "length"  # Ollama's runner: DoneReasonLength at numPredict


def test_ollama_s_format_is_the_field_a_schema_refusal_names():
    """Ollama's renaming of errors runs while the request is parsed; a schema refused mid-answer named
    'response_format', a field an Ollama client never sent."""
    from edgesdk.serve import ollama

    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    asked = ollama.parse_chat({"model": "tiny-host", "messages": [{"role": "user", "content": "hi"}],
                               "format": schema}, "tiny-host")
    assert asked.request.schema_param == "format"
