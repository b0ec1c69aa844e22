"""Tools beside a response format (OpenAI's ``response_format``, llama-server's ``json_schema``), as llama.cpp's
generic tool format takes them (common/chat.cpp, ``common_chat_params_init_generic``): the answer is a call or
``{"response": <an instance of the schema>}``, whose content is that instance's JSON text.

On the tiny served bundle the answer is made deterministic with ``logit_bias``: banning whitespace, and banning
every token holding the letter that one option starts with ("t" of ``tool_call``, "r" of ``response``), so the
other is taken where the two part (a bias moves the choice between allowed tokens, not what the schema forces).
"""

from __future__ import annotations

import json
from typing import Literal

import pytest

from edgesdk.runtime.json_schema import SchemaConstraint
from edgesdk.serve.api import ApiError, parse_chat_request
from edgesdk.serve.tools import answer_message, parse_tools, read_answer
from tests.unit.test_openai_client37 import client, no_whitespace, runtime, server  # noqa: F401 (fixtures)

openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")

USER = [{"role": "user", "content": "Is it noon in Oslo?"}]
# a call of this tool is written without an "r", an instance of this schema without a "t" (the biases below)
TICK = {"type": "function", "function": {"name": "tick", "description": "A clock's tick",
                                         "parameters": {"type": "object", "properties": {}}}}
ANSWER = {"type": "object", "properties": {"answer": {"const": "yes"}, "n": {"type": "integer", "minimum": 0,
                                                                             "maximum": 9}},
          "required": ["answer", "n"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}


def _accepts(schema, text: str) -> bool:
    constraint = SchemaConstraint([bytes([b]) for b in range(256)], schema)
    for byte in text.encode():
        if not constraint.allows(byte):
            return False
        constraint.advance(byte)
    return constraint.complete


def _banning(runtime, letter: str) -> dict[str, int]:  # noqa: F811
    tokenizer = runtime.tokenizer.tokenizer
    return {str(token): -100 for token in range(tokenizer.get_vocab_size()) if letter in tokenizer.decode([token])}


# ------------------------------------------------------------------------------------------- the request


def test_the_response_option_takes_an_instance_of_the_schema_and_nothing_else():
    request = parse_chat_request({"messages": USER, "tools": [TICK], "response_format": FORMAT})
    tools = request.tools
    assert tools.structured
    assert _accepts(tools.schema, '{"response": {"answer": "yes", "n": 4}}')
    assert not _accepts(tools.schema, '{"response": {"answer": "no", "n": 4}}')
    assert not _accepts(tools.schema, '{"response": "yes"}')  # no longer text
    assert _accepts(tools.schema, '{"tool_call": {"name": "tick", "arguments": {}}}')
    assert json.dumps(ANSWER) in tools.instructions  # the model is told the schema its answer follows
    assert request.messages[0]["content"] == tools.instructions


def test_llama_server_s_json_schema_given_as_text_shapes_the_response_too():
    request = parse_chat_request({"messages": USER, "tools": [TICK], "json_schema": json.dumps(ANSWER)})
    assert _accepts(request.tools.schema, '{"response": {"answer": "yes", "n": 0}}')
    assert not _accepts(request.tools.schema, '{"response": {"answer": "yes"}}')


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "tick"}}])
def test_with_only_calls_allowed_the_response_format_does_not_apply(choice):
    request = parse_chat_request({"messages": USER, "tools": [TICK], "tool_choice": choice, "response_format": FORMAT})
    assert not request.tools.structured
    assert not _accepts(request.tools.schema, '{"response": {"answer": "yes", "n": 4}}')
    assert _accepts(request.tools.schema, '{"tool_call": {"name": "tick", "arguments": {}}}')
    assert '"response"' not in request.tools.instructions


def test_tool_choice_none_leaves_the_response_format_over_the_whole_answer():
    request = parse_chat_request({"messages": USER, "tools": [TICK], "tool_choice": "none", "response_format": FORMAT})
    assert request.tools is None
    assert _accepts(request.json_schema, '{"answer": "yes", "n": 4}')


def test_definitions_of_one_name_in_the_schema_and_a_tool_stay_apart():
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"u": {"$ref": "#/$defs/U"}}, "required": ["u"],
        "$defs": {"U": {"type": "integer"}}}}}
    schema = {"type": "object", "properties": {"u": {"$ref": "#/$defs/U"}}, "required": ["u"],
              "$defs": {"U": {"type": "string"}}}
    tools = parse_tools({"tools": [tool]}, schema)
    assert _accepts(tools.schema, '{"tool_call": {"name": "f", "arguments": {"u": 1}}}')
    assert not _accepts(tools.schema, '{"tool_call": {"name": "f", "arguments": {"u": "a"}}}')
    assert _accepts(tools.schema, '{"response": {"u": "a"}}')
    assert not _accepts(tools.schema, '{"response": {"u": 1}}')


def test_a_grammar_beside_tools_is_refused_by_name():
    with pytest.raises(ApiError) as refused:
        parse_chat_request({"messages": USER, "tools": [TICK], "grammar": 'root ::= "x"'})
    assert (refused.value.status, refused.value.param) == (400, "grammar")
    assert "'tools' and 'grammar'" in refused.value.message
    assert "response_format" in refused.value.message  # what to send instead


def test_the_content_is_the_instance_s_json_text_as_written():
    text = '{"response": {"answer": "yes",\n  "n": 4}\n}'
    assert read_answer(text, True, structured=True) == ('{"answer": "yes",\n  "n": 4}', None)
    assert answer_message(text, "stop", True) == ({"content": '{"answer": "yes",\n  "n": 4}'}, "stop")
    assert read_answer('{"response": {"answer": "y', False, structured=True) == ('{"response": {"answer": "y', None)
    assert read_answer('{"response": "hi"}', True) == ("hi", None)  # no response format: text, as before


# ------------------------------------------------------------------------------------------- served


@pytest.fixture(scope="module")
def answering(runtime, no_whitespace):  # noqa: F811
    """``logit_bias`` that leaves the {"response": ...} option only."""
    return {**no_whitespace, **_banning(runtime, "t")}


@pytest.fixture(scope="module")
def calling(runtime, no_whitespace):  # noqa: F811
    """``logit_bias`` that leaves the {"tool_call": ...} option only."""
    return {**no_whitespace, **_banning(runtime, "r")}


@pytest.mark.parametrize("extra", [{"response_format": FORMAT}, {"json_schema": ANSWER}])
def test_an_answer_in_the_schema_whole_and_streamed(server, answering, extra):  # noqa: F811
    body = {"messages": USER, "tools": [TICK], "logit_bias": answering, **extra}
    status, whole = server.post("/v1/chat/completions", body)
    assert status == 200, whole
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert "tool_calls" not in choice["message"]
    answer = json.loads(choice["message"]["content"])
    assert answer["answer"] == "yes"
    assert 0 <= answer["n"] <= 9

    events = server.stream("/v1/chat/completions", body)
    deltas = [event["choices"][0] for event in events[:-1]]
    assert "".join(d["delta"].get("content") or "" for d in deltas) == choice["message"]["content"]
    assert deltas[-1]["finish_reason"] == "stop"


def test_the_tool_call_path_is_unchanged_beside_a_response_format(server, calling):  # noqa: F811
    body = {"messages": USER, "tools": [TICK], "response_format": FORMAT, "logit_bias": calling}
    status, whole = server.post("/v1/chat/completions", body)
    assert status == 200, whole
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert [call["function"] for call in choice["message"]["tool_calls"]] == [{"name": "tick", "arguments": "{}"}]


def test_the_openai_client_parses_the_answer_into_its_model_beside_tools(client, answering, calling):  # noqa: F811
    class Answer(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        answer: Literal["yes"]
        n: int = pydantic.Field(ge=0, le=9)

    class Tick(pydantic.BaseModel):
        pass

    asked = dict(model="tiny", messages=USER, response_format=Answer, tools=[openai.pydantic_function_tool(Tick)])
    message = client.chat.completions.parse(logit_bias=answering, **asked).choices[0].message
    assert isinstance(message.parsed, Answer)
    assert Answer.model_validate_json(message.content) == message.parsed
    assert not message.tool_calls

    with client.chat.completions.stream(logit_bias=answering, **asked) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.parsed == message.parsed
    assert final.choices[0].message.content == message.content

    called = client.chat.completions.parse(logit_bias=calling, **asked).choices[0]
    assert called.finish_reason == "tool_calls"
    assert called.message.parsed is None
    (call,) = called.message.tool_calls
    assert call.function.name == "Tick"
    assert isinstance(call.function.parsed_arguments, Tick)
