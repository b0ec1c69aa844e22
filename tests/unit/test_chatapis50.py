"""serve's chat APIs (edgesdk/serve/anthropic.py, ollama.py, tools.py) against what real clients send and read, on a
real server over a tiny bundle:

* Anthropic's refusal of a prompt past the context, worded as Anthropic words it ("prompt is too long: N tokens > M
  maximum"), which Claude Code and other agent loops read as the context overflowing;
* tool names as MCP clients send them: ollmcp (the MCP client for Ollama) names each tool SERVER.TOOL, the MCP
  specification's names (SEP-986) take '.' and '/', and Anthropic's API takes names up to 128 characters (Claude
  Code's mcp__SERVER__TOOL often passes 64); Ollama and llama-server check no name."""

from __future__ import annotations

import json

import pytest

from edgesdk.serve.anthropic import parse_messages_request
from edgesdk.serve.completion import ServeDefaults
from edgesdk.serve.tools import AnswerStream, ToolError, parse_tools
from tests.unit.test_serve import Served

LONG = "word " * 400  # past the tiny bundle's context of 256 tokens
DOTTED = "filesystem.read_file"  # ollmcp's SERVER.TOOL
READ = {"type": "function", "function": {"name": DOTTED, "description": "Read a file.",
                                         "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                        "required": ["path"]}}}
CALL = json.dumps({"tool_call": {"name": DOTTED, "arguments": {"path": "a.txt"}}})


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


@pytest.fixture
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=4))
    yield server
    server.close()


# ------------------------------------------------------------------------------------------------ Anthropic's overflow


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_past_the_context_is_anthropic_s_prompt_is_too_long(served, stream):
    """Anthropic refuses a prompt past the context with a 400 invalid_request_error worded "prompt is too long: N
    tokens > M maximum" (anthropics/claude-code issue 12186), the words Claude Code and other agent loops read as an
    overflow to compact the conversation; the completer's own message and fix follow."""
    status, body = served.post("/v1/messages", {"model": "tiny-host", "max_tokens": 4, "stream": stream,
                                                "messages": [{"role": "user", "content": LONG}]})
    assert status == 400, body
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    message = body["error"]["message"]
    tokenizer = served.completer.runtime.tokenizer
    counted = len(tokenizer.chat_ids(tokenizer.render_chat([{"role": "user", "content": LONG}])))
    assert message.startswith(f"prompt is too long: {counted} tokens > 256 maximum; This model's maximum context "
                              f"length is 256 tokens. However, your messages resulted in {counted} tokens: "), message
    # the tiny bundle is 256 tokens of a 512-position model, fewer than the prompt's
    assert message.endswith(f"resulted in {counted} tokens: shorten the messages to fewer tokens (POST /tokenize "
                            f"counts them): the model's max_position_embeddings is 512, fewer than the {counted} "
                            "tokens, and no build of the model goes past it ('edgesdk build --max-context 512' gives "
                            "the most)"), message


def test_other_refusals_keep_their_words(served):
    """Only the context's refusal is reworded."""
    status, body = served.post("/v1/messages", {"model": "tiny-host", "max_tokens": 4, "temperature": 3,
                                                "messages": [{"role": "user", "content": "hi"}]})
    assert status == 400
    assert body["error"]["message"].startswith("'temperature' must be"), body


# ------------------------------------------------------------------------------------------------ tool names


@pytest.fixture(scope="module")
def wide(tiny_model_dir, tmp_path_factory):
    """A server over a tiny bundle with room for a tools prompt (1024 tokens), its model steered to write CALL."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.runtime.session import open_runtime
    from tests._utils.tiny import save_tiny_model_dir
    from tests.unit.test_think48 import Steered

    model = save_tiny_model_dir(tmp_path_factory.mktemp("models") / "tiny-wide", max_positions=1024)
    bundle = build(BuildConfig(target="host", model=str(model), out=tmp_path_factory.mktemp("bundles") / "tiny-host",
                               export=ExportConfig(max_context=1024), progress=False))
    runtime = open_runtime(bundle.path, threads=1)
    runtime.backend = Steered(runtime.backend, runtime.tokenizer, (CALL,))
    server = Served(runtime, ServeDefaults(max_tokens=80, prompt_cache=False))
    yield server
    server.close()


ASK = [{"role": "user", "content": "Read a.txt"}]


def test_ollama_answers_a_tool_named_as_ollmcp_names_it(wide):
    """ollmcp sends its MCP tools to /api/chat as SERVER.TOOL; Ollama takes any name. The call comes back under that
    name, whole and streamed (given out once whole), and the turn after it renders."""
    status, body = wide.post("/api/chat", {"model": "tiny-host", "stream": False, "tools": [READ], "messages": ASK})
    assert status == 200, body
    assert [(call["function"]["name"], call["function"]["arguments"]) for call in body["message"]["tool_calls"]] == \
        [(DOTTED, {"path": "a.txt"})]
    status, _, payload = wide.request("POST", "/api/chat", {"model": "tiny-host", "tools": [READ], "messages": ASK})
    assert status == 200
    lines = [json.loads(line) for line in payload.decode().splitlines()]
    calls = [call for line in lines for call in line["message"].get("tool_calls", [])]
    assert [(call["function"]["name"], call["function"]["arguments"]) for call in calls] == [(DOTTED, {"path": "a.txt"})]
    assert lines[-1]["done"] is True
    assert "tool_calls" not in lines[-1]["message"]
    after = [*ASK, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": DOTTED,
                                                                                      "arguments": {"path": "a.txt"}}}]},
             {"role": "tool", "tool_name": DOTTED, "content": "hello"}]
    status, body = wide.post("/api/chat", {"model": "tiny-host", "stream": False, "tools": [READ], "messages": after,
                                           "options": {"num_predict": 2}})
    assert status == 200, body


def test_anthropic_streams_a_tool_named_as_mcp_names_it(wide):
    """Anthropic's tool_use block of a SERVER.TOOL name opens once the name is whole, before the input's pieces."""
    tool = {"name": DOTTED, "input_schema": READ["function"]["parameters"]}
    status, _, payload = wide.request("POST", "/v1/messages", {"model": "tiny-host", "max_tokens": 80, "stream": True,
                                                               "tools": [tool], "messages": ASK})
    assert status == 200
    events = [json.loads(block.split("data: ", 1)[1]) for block in payload.decode().split("\n\n") if "data: " in block]
    starts = [event for event in events if event["type"] == "content_block_start"]
    assert [event["content_block"]["name"] for event in starts] == [DOTTED]
    pieces = "".join(event["delta"]["partial_json"] for event in events
                     if event["type"] == "content_block_delta" and event["delta"]["type"] == "input_json_delta")
    assert json.loads(pieces) == {"path": "a.txt"}
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


@pytest.mark.parametrize("name", [DOTTED, "github/create_issue", "mcp__" + "s" * 60 + "__" + "t" * 60, "ns:tool"])
def test_tool_names_of_mcp_anthropic_and_gemini_are_taken(name):
    """MCP's '.' and '/', Gemini's ':', Anthropic's 128 characters; a stream gives the call out once its name is
    whole, before its arguments end."""
    tools = parse_tools({"tools": [{"type": "function", "function": {"name": name}}]})
    assert tools.names == (name,)
    anthropic = parse_messages_request({"max_tokens": 4, "tools": [{"name": name, "input_schema": {"type": "object"}}],
                                        "messages": ASK})
    assert anthropic.tools.names == (name,)
    stream = AnswerStream()
    deltas = stream.push(json.dumps({"tool_call": {"name": name, "arguments": {"path": "a"}}})[:-3])
    assert deltas[0]["tool_calls"][0]["function"]["name"] == name


@pytest.mark.parametrize("name", ["a b", "", "x" * 129, "naïve", "a,b"])
def test_other_names_are_still_refused(name):
    with pytest.raises(ToolError, match="must be 1-128 letters, digits, '_', '-', '.', '/' or ':'; rename the tool"):
        parse_tools({"tools": [{"type": "function", "function": {"name": name}}]})
