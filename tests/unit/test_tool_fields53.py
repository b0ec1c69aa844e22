"""The fields of tool calls and tool results that reach the prompt: text that is not UTF-8 in one of them is a 400
naming that field (not the message's content, which the prompt's own check would blame); a call that is not a
``function`` call (OpenAI's custom tools) is refused by its ``type``, as llama-server refuses it; and an assistant
message whose ``content`` is null with no calls (a replayed refusal) is read as empty, as llama-server reads it."""

from __future__ import annotations

import json

import pytest

from edgesdk.serve.api import parse_chat_request
from edgesdk.serve.tools import call_text

BAD = "\ud800 a lone surrogate"  # what a JSON "\ud800" escape decodes to
CALL = {"id": "call_a", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Oslo"}'}}
ASKED = {"role": "user", "content": "Time in Oslo?"}


def _refused(served, path: str, messages: list[dict], **fields) -> dict | str:
    status, body = served.post(path, {"messages": messages, "max_tokens": 1, **fields})
    assert status == 400, body
    return body["error"]


@pytest.mark.parametrize(("message", "param"), [
    ({"role": "tool", "tool_call_id": BAD, "content": "09:00"}, "messages[1].tool_call_id"),
    ({"role": "tool", "tool_call_id": "call_z", "name": BAD, "content": "09:00"}, "messages[1].name"),
    ({"role": "assistant", "content": None, "tool_calls": [{**CALL, "id": BAD}]}, "messages[1].tool_calls[0].id"),
    ({"role": "assistant", "content": None, "tool_calls": [{**CALL, "function": {"name": BAD, "arguments": "{}"}}]},
     "messages[1].tool_calls[0].function.name"),
    ({"role": "assistant", "content": None, "tool_calls": [{**CALL, "function": {"name": "get_time",
                                                                                 "arguments": BAD}}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"role": "assistant", "content": None, "tool_calls": [{**CALL, "function": {"name": "get_time",
                                                                                 "arguments": {"city": BAD}}}]},
     "messages[1].tool_calls[0].function.arguments"),
])
def test_a_tool_field_that_is_not_utf8_is_a_400_naming_that_field(served, message, param):
    error = _refused(served, "/v1/chat/completions", [ASKED, message])
    assert error["param"] == param
    assert error["message"].startswith(f"{param} is not valid UTF-8 (U+D800")
    assert "half of a UTF-16 surrogate pair" in error["message"]  # a lone \ud800 escape: its whole character, the fix
    assert "send each character whole" in error["message"]


def test_arguments_holding_an_escaped_lone_surrogate_are_read_as_the_text_they_are():
    """JSON text whose escape decodes to a lone surrogate is text llama.cpp's JSON parser refuses, so minja keeps the
    arguments as the string written ("Failed to parse arguments"); the prompt then holds that text, UTF-8 throughout."""
    written = '{"city": "\\ud800"}'
    text = call_text([{**CALL, "function": {"name": "get_time", "arguments": written}}], "tool_calls")
    assert json.loads(text)["tool_call"]["arguments"] == written
    text.encode("utf-8")


def test_ollama_names_a_tool_result_field_that_is_not_utf8(served):
    for result, field in (({"tool_name": BAD}, "tool_name"), ({"tool_name": "get_time", "tool_call_id": BAD},
                                                               "tool_call_id")):
        error = _refused(served, "/api/chat", [ASKED, {"role": "tool", "content": "09:00", **result}],
                         model="tiny-host", stream=False)
        assert error.startswith(f"messages[1].{field} is not valid UTF-8 (U+D800"), error


@pytest.mark.parametrize("call", [
    {"id": "call_c", "type": "custom", "custom": {"name": "grep", "input": "needle"}},
    {"id": "call_c", "type": "custom", "function": {"name": "get_time", "arguments": "{}"}},
])
def test_a_call_that_is_not_a_function_call_is_refused_by_its_type(served, call):
    error = _refused(served, "/v1/chat/completions", [ASKED, {"role": "assistant", "content": None,
                                                              "tool_calls": [call]}])
    assert error["param"] == "messages[1].tool_calls[0].type"
    assert "'custom'" in error["message"]
    assert '"function"' in error["message"]


def test_a_replayed_refusal_with_null_content_is_an_empty_assistant_turn(served):
    refusal = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
    messages = [ASKED, refusal, {"role": "user", "content": "Then the date?"}]
    status, body = served.post("/apply-template", {"messages": messages})
    assert status == 200, body
    empty = parse_chat_request({"messages": [ASKED, {"role": "assistant", "content": ""}, messages[2]]})
    assert parse_chat_request({"messages": messages}).messages == empty.messages
    status, answer = served.post("/v1/chat/completions", {"messages": messages, "max_tokens": 1})
    assert status == 200, answer


def test_null_content_stays_refused_outside_the_assistant_role():
    with pytest.raises(Exception, match=r"messages\[0\]\.content must be a string"):
        parse_chat_request({"messages": [{"role": "user", "content": None}]})


@pytest.mark.parametrize(("block", "field"), [
    ({"type": "tool_use", "id": "\ud800x", "name": "w", "input": {}}, "id"),
    ({"type": "tool_use", "id": "t1", "name": "w\ud800", "input": {}}, "name"),
    ({"type": "tool_use", "id": "t1", "name": "w", "input": {"c": "\ud800"}}, "input"),
])
def test_an_anthropic_tool_field_that_is_not_utf8_is_named_as_the_client_sent_it(block, field):
    """The chat route's names (messages[1].tool_calls[0].id) are no field of an Anthropic body."""
    from edgesdk.serve.anthropic import chat_body
    from edgesdk.serve.api import ApiError

    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"},
                                                         {"role": "assistant", "content": [block]}]}
    with pytest.raises(ApiError) as refused:
        chat_body(body)
    assert refused.value.param == f"messages[1].content[0].{field}"


def test_a_responses_function_call_field_that_is_not_utf8_is_named_as_the_client_sent_it():
    from edgesdk.serve.api import ApiError
    from edgesdk.serve.responses import parse_responses_request

    body = {"model": "m", "input": [{"type": "message", "role": "user", "content": "hi"},
                                    {"type": "function_call", "call_id": "c\ud800", "name": "w", "arguments": "{}"}]}
    with pytest.raises(ApiError) as refused:
        parse_responses_request(body)
    assert refused.value.param == "input[1].call_id"
