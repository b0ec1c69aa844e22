"""JSON nested deeper than Python's JSON reads or writes (:data:`DEPTH` arrays in one another), where tools meet
it: a model's answer whose free argument the schema lets nest (a whole call is still its call, streamed or not), a
replayed call's arguments (kept as their text, or refused naming the field), a tool's parameters holding such a
value, and a user's text that looks like a tool result. Each failed the request with a RecursionError (a 500)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from edgesdk.serve.api import ApiError, chat_turns, parse_chat_request
from edgesdk.serve.tools import (
    ANY_OBJECT,
    AnswerStream,
    ToolError,
    answer_message,
    arguments_text,
    call_text,
    is_tool_result,
    parse_tools,
    read_answer,
)
from tests.unit.test_tools import _accepts


def _deep_list(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def _past_python_s_json() -> int:
    """The fewest levels of arrays in one another, of 1000 doubled, that this Python's json neither reads nor writes
    (a RecursionError both ways): 1000 on 3.10 and 3.11 (``sys.getrecursionlimit()``), 2000 on 3.12 (which reads and
    writes 1,450), 16000 on 3.13 (which reads and writes 9,950)."""
    depth = 1000
    while depth <= 1_024_000:
        if _json_refuses(json.dumps, _deep_list(depth)) and _json_refuses(json.loads, "[" * depth + "]" * depth):
            return depth
        depth *= 2
    raise AssertionError("Python's json read and wrote 1,024,000 levels of arrays; these tests need a depth it refuses")


def _json_refuses(step: Callable[[object], object], value: object) -> bool:
    try:
        step(value)
    except RecursionError:
        return True
    return False


DEPTH = _past_python_s_json()
NEAR = range(DEPTH // 2, DEPTH + 1, 4 * max(1, DEPTH // 1000))  # depths around the last this Python's json takes
DEEP = "[" * DEPTH + "]" * DEPTH
FREE = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {}}}}}
CALL = '{"tool_call": {"name": "f", "arguments": {"a": ' + DEEP + "}}}"


def _streamed(text: str, finish_reason: str, structured: bool = False) -> tuple[list[dict], dict, str]:
    stream = AnswerStream(structured, opened=False)
    deltas = [delta for index in range(0, len(text), 7) for delta in stream.push(text[index:index + 7])]
    rest, fields, reason = stream.finish(finish_reason)
    return deltas + rest, fields, reason


def _arguments_sent(deltas: list[dict]) -> dict[int, str]:
    sent: dict[int, str] = {}
    for delta in deltas:
        for call in delta.get("tool_calls", []):
            sent[call["index"]] = sent.get(call["index"], "") + call["function"].get("arguments", "")
    return sent


def test_a_whole_call_nested_past_python_s_json_is_still_its_call():
    """The schema leaves ``a`` free, so the constraint admits any nesting; the whole answer's message and finish
    reason are a call's, as its stream gave it out, rather than a RecursionError once the answer ended."""
    tools = parse_tools({"tools": [FREE]})
    assert _accepts(tools, CALL)
    fields, finish_reason = answer_message(CALL, "stop")
    assert finish_reason == "tool_calls"
    assert fields["content"] is None
    [call] = fields["tool_calls"]
    assert call["function"] == {"name": "f", "arguments": '{"a": ' + DEEP + "}"}
    deltas, streamed, reason = _streamed(CALL, "stop")
    assert reason == "tool_calls"
    assert _arguments_sent(deltas) == {0: streamed["tool_calls"][0]["function"]["arguments"]}
    assert streamed["tool_calls"][0]["function"] == call["function"]


def test_deep_calls_of_the_list_form_are_each_their_call():
    text = ('{"tool_calls": [{"name": "f", "arguments": {"a": ' + DEEP + '}}, {"name": "f", "arguments": {"a": 1}}]}')
    tools = parse_tools({"tools": [FREE], "parallel_tool_calls": True})
    assert _accepts(tools, text)
    deltas, fields, reason = _streamed(text, "stop")
    assert reason == "tool_calls"
    assert [call["function"]["arguments"] for call in fields["tool_calls"]] == ['{"a": ' + DEEP + "}", '{"a": 1}']
    assert _arguments_sent(deltas) == {0: '{"a": ' + DEEP + "}", 1: '{"a": 1}'}


@pytest.mark.parametrize("finish_reason", ["stop", "length"])
def test_a_deep_call_cut_short_keeps_what_was_given_out(finish_reason):
    text = CALL[:-2]  # a stop string (or max_tokens) cut the envelope's close
    deltas, fields, reason = _streamed(text, finish_reason)
    assert reason == finish_reason
    assert fields["tool_calls"][0]["function"]["arguments"] == '{"a": ' + DEEP + "}"
    assert answer_message(text, finish_reason)[0]["tool_calls"][0]["function"] == fields["tool_calls"][0]["function"]


def test_a_deep_structured_answer_is_its_value_as_written():
    value = '{"a": ' + DEEP + "}"
    text = '{"response": ' + value + "}"
    tools = parse_tools({"tools": [FREE]}, ANY_OBJECT)
    assert _accepts(tools, text)
    assert answer_message(text, "stop", structured=True) == ({"content": value}, "stop")
    deltas, fields, reason = _streamed(text, "stop", structured=True)
    assert "".join(delta.get("content", "") for delta in deltas) == value
    assert (fields, reason) == ({"content": value}, "stop")


def test_read_answer_gives_a_deep_answer_as_its_text():
    assert read_answer(CALL, True) == (CALL, None)


def _conversation(arguments: object) -> dict:
    return {"messages": [
        {"role": "user", "content": "nest"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                                                               "function": {"name": "f", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"}], "tools": [FREE]}


def test_replayed_arguments_too_deep_for_python_s_json_are_kept_as_their_text():
    """A JSON string in the request, so the body reads; reading it into a value failed the request."""
    request = parse_chat_request(_conversation(DEEP))
    turn = next(message for message in request.messages if message["role"] == "assistant")
    assert json.loads(turn["content"]) == {"tool_call": {"name": "f", "arguments": DEEP, "id": "call_1"}}


@pytest.mark.parametrize("parallel", [False, True])
def test_replayed_arguments_near_python_s_depth_limit_are_their_value_or_their_text(parallel):
    """Around the depth Python's JSON reads, arguments it reads but cannot write back inside the call's line are
    kept as their text too: every depth gives a line, each call's arguments the value written or that text."""
    for depth in NEAR:
        text = "[" * depth + "]" * depth
        line = call_text([{"function": {"name": "f", "arguments": text}}], "m", parallel)
        [call] = [json.loads(line)["tool_call"]] if not parallel else json.loads(line)["tool_calls"]
        assert call["arguments"] == text or json.dumps(call["arguments"], separators=(",", ":")) == text


def test_replayed_arguments_given_as_a_value_too_deep_to_write_are_refused_naming_them():
    with pytest.raises(ApiError) as caught:
        parse_chat_request(_conversation({"a": _deep_list(DEPTH)}))
    assert caught.value.status == 400
    assert caught.value.param == "messages[1].tool_calls[0].function.arguments"
    _names_no_depth(str(caught.value))


def test_a_tool_whose_parameters_hold_a_value_too_deep_to_write_is_refused_naming_it():
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "array", "default": _deep_list(DEPTH)}}}}}
    with pytest.raises(ToolError) as caught:
        parse_tools({"tools": [FREE, tool]})
    assert caught.value.param == "tools[1].function.parameters"
    _names_no_depth(caught.value.message)


def _names_no_depth(message: str) -> None:
    """A refusal of JSON nested too deeply says so and what to do, with no count of levels: the count depends on
    the Python the server runs on (about 1000 on 3.10 and 3.11, 1,450 on 3.12, 9,950 on 3.13)."""
    assert "nested too deeply" in message
    assert "deeper than this server's JSON reads and writes" in message
    assert "hundred" not in message
    assert "flatten" in message


def test_arguments_text_is_the_value_s_json_written_once():
    for value in ({}, {"a": [1, 2.5, None]}, {"name": "caf\u00e9 \u2603", "n": {"o": [[[]]]}}, {"a": _deep_list(50)}):
        assert arguments_text(value, "p") == json.dumps(value, ensure_ascii=False)
    with pytest.raises(ToolError) as caught:
        arguments_text({"a": _deep_list(DEPTH)}, "messages[3].tool_calls[1].function.arguments")
    assert caught.value.param == "messages[3].tool_calls[1].function.arguments"
    _names_no_depth(caught.value.message)


def test_a_user_text_like_a_tool_result_nested_deeply_is_no_tool_result():
    text = '{"tool_response": {"content": ' + DEEP + "}}"
    assert not is_tool_result(text)
    messages = [{"role": "user", "content": text}, {"role": "user", "content": "and?"}]
    assert chat_turns(messages) == messages
