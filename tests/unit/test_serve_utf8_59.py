"""Text that is not UTF-8 (a lone surrogate from a ``\\ud800`` JSON escape) in a chat message is named by the client's
own index and at its own character, with tools offered (whose description the prompt gets as a first system message)
and in a ``tool`` message (whose content the prompt gets inside a ``{"tool_response": ...}`` wrapper); and the JSON
text an error shows of such a string escapes it, so the error's text encodes as UTF-8."""

from __future__ import annotations

import json

from edgesdk.serve.api import json_shown

LONE = "\ud800"  # what a JSON "\ud800" escape decodes to
FIX = "send each character whole: both \\uXXXX escapes of a surrogate pair together, or the character itself"
TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                         "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}


def _refused(served, body: dict) -> dict:
    status, answer = served.post("/v1/chat/completions", {**body, "max_tokens": 1})
    assert status == 400, answer
    error = answer["error"]
    assert error["code"] == "not_utf8", error
    assert error["message"].endswith(FIX), error
    return error


def test_a_message_not_utf8_beside_tools_is_named_by_the_client_s_index(served):
    error = _refused(served, {"messages": [{"role": "user", "content": "x" + LONE}], "tools": [TOOL]})
    assert error["param"] == "messages[0].content", error
    assert error["message"].startswith("messages[0].content is not valid UTF-8 (U+D800 at character 1)"), error


def test_a_later_message_not_utf8_beside_tools_and_a_system_message(served):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "ab" + LONE}]
    error = _refused(served, {"messages": messages, "tools": [TOOL]})
    assert error["param"] == "messages[3].content", error
    assert error["message"].startswith("messages[3].content is not valid UTF-8 (U+D800 at character 2)"), error


def test_a_tool_message_not_utf8_is_named_at_its_own_character(served):
    messages = [{"role": "user", "content": "Look x up"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1", "content": "found " + LONE}]
    error = _refused(served, {"messages": messages, "tools": [TOOL]})
    assert error["param"] == "messages[2].content", error
    assert error["message"].startswith("messages[2].content is not valid UTF-8 (U+D800 at character 6)"), error


def test_a_message_not_utf8_without_tools_is_still_named_as_before(served):
    error = _refused(served, {"messages": [{"role": "user", "content": "x" + LONE}]})
    assert error["param"] == "messages[0].content", error
    assert error["message"].startswith("messages[0].content is not valid UTF-8 (U+D800 at character 1)"), error


def test_json_shown_escapes_a_string_that_is_not_utf8():
    shown = json_shown(LONE + "x")
    assert shown == '"\\ud800x"'
    shown.encode("utf-8")
    nested = json_shown({"content": ["ok", "é" + LONE]})
    assert json.loads(nested) == {"content": ["ok", "é" + LONE]}
    nested.encode("utf-8")


def test_json_shown_keeps_utf8_text_unescaped():
    assert json_shown("héllo ✓") == '"héllo ✓"'
    assert json_shown({"role": "user"}) == '{"role": "user"}'
