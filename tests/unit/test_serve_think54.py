"""A thinking model under tools thinks first, then calls: its <think> block free of the tools' constraint
(completion.ThinkingFirst, as llama.cpp's lazy grammar for a thinking model), its reasoning split off beside the
parsed call (tools.AnswerStream), on the OpenAI chat route and Ollama's, whole and streamed."""

from __future__ import annotations

import json

import pytest

from edgesdk.serve.completion import ServeDefaults, ThinkingFirst
from edgesdk.serve.tools import AnswerStream, answer_message
from tests.unit.test_serve import Served
from tests.unit.test_serve_reasoning import ASK, THINKING_TEMPLATE, no_whitespace

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CALL = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}'
THOUGHT_ANSWERS = [  # (the answer, opened in the prompt or not)
    "<think>\nThe user wants Paris's weather.\n</think>\n\n" + CALL,
    "The user wants Paris's weather.\n</think>\n\n" + CALL,
]


@pytest.mark.parametrize("answer", THOUGHT_ANSWERS)
def test_a_call_after_a_think_block_is_parsed_with_its_reasoning_whole_and_streamed(answer):
    """The JSON after the block was never read as a call: the whole text (thinking, tags, JSON) came back as content."""
    fields, finish = answer_message(answer, "stop")
    assert finish == "tool_calls"
    assert fields["reasoning_content"] == "The user wants Paris's weather."
    assert fields["content"] is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in fields["tool_calls"]] == \
        [("get_weather", {"city": "Paris"})]
    for size in (1, 2, 5, 13):
        stream, deltas = AnswerStream(), []
        for start in range(0, len(answer), size):
            deltas += stream.push(answer[start:start + size])
        rest, streamed, _ = stream.finish("stop")
        deltas += rest
        assert "".join(d.get("reasoning_content", "") for d in deltas) == fields["reasoning_content"], size
        assert "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas if "tool_calls" in d) == \
            fields["tool_calls"][0]["function"]["arguments"], size
        assert streamed["reasoning_content"] == fields["reasoning_content"]


def test_an_answer_with_no_block_reads_as_before():
    fields, finish = answer_message(CALL, "stop")
    assert finish == "tool_calls"
    assert "reasoning_content" not in fields
    assert answer_message("", "length")[0] == {"content": ""}


@pytest.fixture(scope="module")
def thinking_runtime(tmp_path_factory):
    """A tiny model with room for the tools' description in its prompt, its chat template thinking as Qwen3's."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.runtime.session import open_runtime
    from tests._utils.tiny import save_tiny_model_dir

    root = tmp_path_factory.mktemp("think54")
    model = save_tiny_model_dir(root / "model", hidden=64, heads=4, kv_heads=2, max_positions=1024)
    bundle = build(BuildConfig(target="host", model=str(model), out=root / "b", export=ExportConfig(max_context=1024),
                               progress=False))
    runtime = open_runtime(bundle.path, threads=1)
    runtime.tokenizer.template_source, runtime.tokenizer._template = THINKING_TEMPLATE, None
    return runtime


@pytest.fixture
def served(thinking_runtime):
    server = Served(thinking_runtime, ServeDefaults(max_tokens=6))
    yield server
    server.close()


def _token_ids(runtime, text: str) -> list[int]:
    return runtime.tokenizer.encode(text, add_special_tokens=False)


def test_the_constraint_leaves_the_block_free_then_holds_the_call(thinking_runtime):
    """Opened in the prompt: any text until </think>, then only whitespace or the call's JSON."""
    from edgesdk.runtime.json_schema import SchemaConstraint
    from edgesdk.serve.tools import parse_tools

    tokens = thinking_runtime.tokenizer.token_bytes()
    schema = parse_tools({"tools": TOOLS}).schema
    word = _token_ids(thinking_runtime, "Paris")[0]
    brace = _token_ids(thinking_runtime, "{")[0]
    opened = ThinkingFirst(tokens, SchemaConstraint(tokens, schema), opened=True)
    assert opened.allows(word)
    assert opened.allows(brace)
    for token in _token_ids(thinking_runtime, "Paris it is.</think>\n\n"):
        assert opened.allows(token)
        opened.advance(token)
    assert not opened.allows(word)
    assert opened.allows(brace)
    for token in _token_ids(thinking_runtime, CALL):
        assert opened.allows(token)
        opened.advance(token)
    assert opened.complete
    # not opened: the block may open, or the call start at once; no other text
    fresh = ThinkingFirst(tokens, SchemaConstraint(tokens, schema), opened=False)
    assert not fresh.allows(word)
    assert fresh.allows(brace)
    assert fresh.allows(_token_ids(thinking_runtime, "<think>")[0])


SHORT_TOOL = [{"type": "function", "function": {"name": "w", "parameters": {"type": "object", "properties": {}}}}]


def test_a_thinking_model_thinks_before_its_call_on_the_chat_routes(served, thinking_runtime):
    """The tools' constraint held the answer from its first token, so the model could not think: its text was the
    call's JSON (cut by the limit: an empty content), with no reasoning. Now its block is free and comes back as the
    route's reasoning field, whole and streamed."""
    bias = no_whitespace(thinking_runtime)
    request = {"messages": ASK, "tools": SHORT_TOOL, "logit_bias": bias}
    status, body = served.post("/v1/chat/completions", request)
    assert status == 200, body
    message = body["choices"][0]["message"]
    thought = message.get("reasoning_content")
    assert thought, message
    assert "{" not in thought, message
    assert not message.get("content")
    assert not message.get("tool_calls")
    events = served.stream("/v1/chat/completions", {**request, "stream": True})
    deltas = [event["choices"][0]["delta"] for event in events if isinstance(event, dict) and event.get("choices")]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == thought


@pytest.mark.parametrize("stream", [False, True])
def test_ollama_gives_the_block_before_a_call_as_thinking(served, stream):
    """Ollama's /api/chat under tools gave the thinking model's block nowhere: the message had no ``thinking``."""
    from edgesdk.serve import ollama
    from edgesdk.serve.completion import Completion

    asked = ollama.parse_chat({"model": "tiny-host", "messages": ASK, "tools": TOOLS, "stream": stream}, "tiny-host")
    answer = ollama.Answer(served.completer, asked, ollama.windowed(served.completer, asked))
    text = THOUGHT_ANSWERS[1]
    completion = Completion(text, "stop", 10, 20, 0, None)
    if stream:
        lines = [line for size in range(0, len(text), 4) for line in answer.piece(text[size:size + 4])]
        lines += answer.closing(completion)
        messages = [line["message"] for line in lines]
    else:
        messages = [answer.whole(completion)["message"]]
    assert "".join(m.get("thinking", "") for m in messages) == "The user wants Paris's weather."
    calls = [call for m in messages for call in m.get("tool_calls", [])]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert "".join(m["content"] for m in messages) == ""
