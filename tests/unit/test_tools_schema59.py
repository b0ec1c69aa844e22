"""A tool's parameters that admit null beside an object are taken as the object, other roots refused in a tool's
words; a reasoning block cut partway through its ``</think>`` loses that start of the tag.

* ``{"type": ["object", "null"]}`` (pydantic's ``Optional[Model]``, OpenAPI's ``"nullable": true``) was refused
  with a response format's advice ("the schema's root is the value null ... wrap the value in an object");
  llama.cpp's tool grammar takes it. A call's arguments are an object (OpenAI's ``arguments`` is the JSON text of
  one), so the constraint keeps the object branch. A root that can be no object (``{"type": "string"}``) is refused
  saying what a tool's parameters must be, as an array root already was.
* llama-server parses an answer cut by ``max_tokens`` as partial, and ``try_find_literal`` takes a trailing prefix of
  ``</think>`` for the tag (common/chat-parser.cpp, ``string_find_partial_stop``): ``<think>abc</thi`` is the
  reasoning ``abc``, where ``reasoning_content`` kept ``abc</thi``.
"""

from __future__ import annotations

import json

import pytest

from edgesdk.runtime.json_schema import SchemaError, compile_schema
from edgesdk.serve.reasoning import ReasoningSplitter, split_answer
from edgesdk.serve.tools import ToolError, parse_tools
from tests.unit.test_tools import _accepts

ARGS = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": False}


def _tool(parameters: dict) -> dict:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


def _call(arguments: str) -> str:
    return '{"tool_call": {"name": "f", "arguments": ' + arguments + "}}"


NULLABLE = [
    {**ARGS, "type": ["object", "null"]},
    {**ARGS, "type": ["null", "object"]},
    {**ARGS, "nullable": True},  # OpenAPI 3.0 (FastAPI, Gemini-style)
    {"anyOf": [{"$ref": "#/$defs/Args"}, {"type": "null"}], "$defs": {"Args": ARGS}},  # pydantic's Optional[Args]
    {"oneOf": [ARGS, {"const": None, "description": "no arguments"}]},
    {"anyOf": [{**ARGS, "type": ["object", "null"]}, {"type": "array"}]},  # refused below for its array, not null
]


@pytest.mark.parametrize("parameters", NULLABLE[:-1])
def test_parameters_that_admit_null_beside_an_object_are_taken_as_the_object(parameters):
    tools = parse_tools({"tools": [_tool(parameters)], "tool_choice": "required"})
    assert _accepts(tools, _call('{"a": "x"}'))
    for arguments in ("null", "{}", '"x"', "5"):
        assert not _accepts(tools, _call(arguments)), arguments
    # the model reads the parameters as the client wrote them
    assert json.dumps(parameters, ensure_ascii=False) in tools.instructions


def test_a_union_holding_an_array_beside_the_nullable_object_is_still_refused_for_its_array():
    with pytest.raises(ToolError, match="must describe an object") as refused:
        parse_tools({"tools": [_tool(NULLABLE[-1])]})
    assert "root is array or object" in refused.value.message


@pytest.mark.parametrize(("parameters", "got"), [
    ({"type": "string"}, "root is string"),
    ({"type": ["string", "null"]}, "root is null or string"),
    ({"type": "null"}, "root is null"),
    ({"type": ["object", "integer"]}, "root is 'integer'"),
    ({"anyOf": [{"type": "null"}, {"const": None}]}, "root names no type"),
])
def test_parameters_that_can_be_no_object_are_refused_saying_what_tool_parameters_must_be(parameters, got):
    with pytest.raises(ToolError) as refused:
        parse_tools({"tools": [_tool(parameters)]})
    message = refused.value.message
    assert refused.value.param == "tools[0].function.parameters"
    assert message.startswith("tools[0].function.parameters must describe an object (the call's named arguments)")
    assert got in message
    assert '"type": "object"' in message
    assert '"properties"' in message
    assert "the answer must be an object or an array" not in message  # a response format's wording


def test_a_response_format_whose_root_may_be_null_is_still_refused_with_its_own_advice():
    with pytest.raises(SchemaError, match="the answer must be an object or an array") as refused:
        compile_schema({**ARGS, "type": ["object", "integer"]})
    assert "wrap the value in an object" in refused.value.fix


def test_a_served_call_of_a_nullable_tool_has_object_arguments(tmp_path):
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.runtime.session import open_runtime
    from edgesdk.serve.completion import ServeDefaults
    from tests._utils.tiny import save_tiny_model_dir
    from tests.unit.test_serve import Served
    from tests.unit.test_serve_reasoning import no_whitespace

    # room for the tools' description in the prompt (512 tokens of context)
    model = save_tiny_model_dir(tmp_path / "model", max_positions=512)
    bundle = build(BuildConfig(target="host", model=str(model), out=tmp_path / "b", export=ExportConfig(max_context=512),
                               progress=False))
    runtime = open_runtime(bundle.path, threads=1)
    served = Served(runtime, ServeDefaults(max_tokens=120))
    try:
        parameters = {"type": ["object", "null"], "properties": {}, "additionalProperties": False}
        body = {"messages": [{"role": "user", "content": "Go"}], "tools": [_tool(parameters)],
                "tool_choice": "required", "logit_bias": no_whitespace(runtime)}  # the call, without runs of spaces
        status, answer = served.post("/v1/chat/completions", body)
        assert status == 200, answer  # was 400: "the schema's root is the value null ..."
        choice = answer["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        (call,) = choice["message"]["tool_calls"]
        assert json.loads(call["function"]["arguments"]) == {}
    finally:
        served.close()


CUT = [  # (answer cut by the token limit, opened in the prompt) -> reasoning
    ("<think>abc</thi", False, "abc"),
    ("<think>abc </", False, "abc"),
    ("<think>abc\n<", False, "abc"),
    ("abc</think", True, "abc"),
    ("a</", True, "a"),
    ("<think>a</think>\n<think>b</th", False, "ab"),
    ("<think></thin", False, ""),
]


@pytest.mark.parametrize(("answer", "opened", "reasoning"), CUT)
def test_a_block_cut_inside_its_closing_tag_drops_the_tag_s_start_whole_and_streamed(answer, opened, reasoning):
    assert split_answer(ReasoningSplitter(opened), answer) == (reasoning, "")
    for cut in range(len(answer) + 1):
        for closed in (False, None):  # cut (an answer that ended at end-of-generation keeps it: test_compat_leads60)
            splitter, got = ReasoningSplitter(opened), ("", "")
            for piece in (answer[:cut], answer[cut:]):
                got = tuple(a + b for a, b in zip(got, splitter.push(piece), strict=True))
            got = tuple(a + b for a, b in zip(got, splitter.flush(closed=closed), strict=True))
            assert got == (reasoning, ""), (cut, closed)


def test_a_tag_that_is_not_cut_still_reads_as_before():
    assert split_answer(ReasoningSplitter(), "<think>a < b</think>c") == ("a < b", "c")
    assert split_answer(ReasoningSplitter(), "<think>a </thinking> b") == ("a </thinking> b", "")


def test_deepseek_legacy_closes_a_block_cut_inside_its_tag_as_llama_server_does():
    """``try_find_literal`` found the tag, so ``handle_reasoning`` writes the block closed; a block cut elsewhere
    stays open (tests/unit/test_serve_reasoning_review.py)."""
    for cut in range(1, len("<think>abc</thi")):
        splitter, text = ReasoningSplitter(inline=True), ""
        for piece in ("<think>abc</thi"[:cut], "<think>abc</thi"[cut:]):
            text += splitter.push(piece)[1]
        assert text + splitter.flush(closed=False)[1] == "<think>abc</think>", cut
    splitter = ReasoningSplitter(inline=True)
    assert splitter.push("<think>abc")[1] + splitter.flush(closed=False)[1] == "<think>abc"
    # a begun answer whose own text ended on the tag's start the client wrote: the model wrote none of it
    begun = ReasoningSplitter(inline=True).begun("<think>The fox</thi")
    assert begun.flush(closed=False) == ("", "")
    begun = ReasoningSplitter(inline=True).begun("<think>The fox</th")
    assert begun.push("i")[1] + begun.flush(closed=False)[1] == "</think>"
