"""An answer under tools shaped by a response format keeps its value's JSON text as written, a number past a double
(which the answer's schema admits) too, so its stream gives out nothing its message does not hold; a call's
arguments holding such a number are still returned as the text written."""

from __future__ import annotations

import json

import pytest

from edgesdk.serve.tools import ANY_OBJECT, AnswerStream, answer_message, parse_tools, read_answer
from tests.unit.test_tools import _accepts

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "b": {"type": "number"}}}}}


def _streamed(text: str, structured: bool) -> tuple[list[dict], dict, str]:
    stream = AnswerStream(structured, opened=False)
    deltas = [delta for char in text for delta in stream.push(char)]
    rest, fields, finish_reason = stream.finish("stop")
    return deltas + rest, fields, finish_reason


@pytest.mark.parametrize(("response", "value"), [
    (ANY_OBJECT, '{"a": 1e999}'),
    (ANY_OBJECT, '{"a": [1, -1E400, 2.5]}'),
    ({"type": "number"}, "1e999"),
])
def test_a_structured_answer_holding_a_number_past_a_double_is_its_value_as_written(response, value):
    tools = parse_tools({"tools": [TOOL]}, response)
    text = f'{{"response": {value}}}'
    assert _accepts(tools, text)
    deltas, fields, finish_reason = _streamed(text, structured=True)
    assert "".join(delta.get("content", "") for delta in deltas) == value
    assert (fields, finish_reason) == ({"content": value}, "stop")
    assert answer_message(text, "stop", structured=True) == ({"content": value}, "stop")
    assert read_answer(text, True, structured=True) == (value, None)


def test_a_structured_answer_still_reads_whole_numbers_as_before():
    text = '{"response": {"a": 1.50, "b": -0, "c": 1e5}}'
    assert answer_message(text, "stop", structured=True) == ({"content": '{"a": 1.50, "b": -0, "c": 1e5}'}, "stop")


def test_a_text_answer_beside_a_number_past_a_double_is_not_read_as_structured():
    text = '{"response": 1e999}'  # no response format: the envelope's text answer is a string, so this is no answer
    assert read_answer(text, True) == (text, None)


def test_a_calls_arguments_holding_a_number_past_a_double_are_still_the_text_written():
    tools = parse_tools({"tools": [TOOL]}, ANY_OBJECT)
    text = '{"tool_call": {"name": "f", "arguments": {"b": 1e999}}}'
    assert _accepts(tools, text)
    assert read_answer(text, True, structured=True) == (text, None)
    fields, finish_reason = answer_message(text, "stop", structured=True)
    assert (fields, finish_reason) == ({"content": text}, "stop")
    assert json.loads(fields["content"])["tool_call"]["name"] == "f"
