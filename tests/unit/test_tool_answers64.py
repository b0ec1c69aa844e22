"""What a chat answer under tools carries besides its call or its text, on a real server over a tiny bundle.

- ``logprobs``: OpenAI's ``logprobs.content`` lists the tokens of the message's content, so a call (content null)
  has none and a text answer only its text's; the JSON this server wraps a call or a text in
  (``{"tool_call": ...}``, ``{"response": ...}``) is never the message's, whole or streamed.
- A token limit that cuts the answer before its call or text was whole leaves a line on serve's log saying why the
  message is empty: the wrapper's tokens count against ``max_tokens`` too.
- A ``tool`` message whose ``tool_call_id`` names none of the calls of the assistant message before it is refused
  by that field; one with no id is taken, as llama-server takes it.

The tiny model writes whitespace when left alone: ``logit_bias`` bans it, and picks the call or the text option
(tests/unit/test_tools_response_format37.py).
"""

from __future__ import annotations

import logging

import pytest

openai = pytest.importorskip("openai")

from tests.unit.test_openai_client37 import (  # noqa: E402,F401 (fixtures: a tiny bundle served, the client)
    PING,
    TIME,
    USER,
    client,
    no_whitespace,
    runtime,
    server,
)
from tests.unit.test_tools_response_format37 import FORMAT, TICK, answering, calling  # noqa: E402,F401

TOOLS_LOG = "edgesdk.serve.tools"


def _streamed_entries(events: list) -> list[dict]:
    """Every logprobs entry of a stream's chunks, in order."""
    return [entry for event in events[:-1] for choice in event["choices"]
            for entry in ((choice.get("logprobs") or {}).get("content") or [])]


def _spelled(entries: list[dict]) -> str:
    return b"".join(bytes(entry["bytes"]) for entry in entries).decode("utf-8", "replace")


# ------------------------------------------------------------------------------------------- logprobs


def test_a_tool_call_s_logprobs_list_no_token_of_its_json_whole_or_streamed(server, calling):  # noqa: F811
    body = {"messages": USER, "tools": [TICK], "tool_choice": "required", "logit_bias": calling,
            "logprobs": True, "top_logprobs": 2}
    status, whole = server.post("/v1/chat/completions", body)
    assert status == 200, whole
    choice = whole["choices"][0]
    assert (choice["finish_reason"], choice["message"]["content"]) == ("tool_calls", None)
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "tick"
    assert choice["logprobs"] == {"content": None, "refusal": None}  # was the '{', '"', 'tool', ... of its JSON

    events = server.stream("/v1/chat/completions", body)
    assert _streamed_entries(events) == []
    assert all(choice["logprobs"] is None for event in events[:-1] for choice in event["choices"])


def test_the_openai_client_reads_a_tool_call_s_logprobs_as_none(client, calling):  # noqa: F811
    answer = client.chat.completions.create(model="tiny", messages=USER, tools=[TICK], tool_choice="required",
                                            logit_bias=calling, logprobs=True)
    choice = answer.choices[0]
    assert choice.message.tool_calls
    assert choice.message.content is None
    assert choice.logprobs.content is None


@pytest.mark.parametrize("form", ["text", "structured"])
def test_a_text_answer_s_logprobs_are_its_text_s_tokens_not_the_json_around_it(server, answering, form):  # noqa: F811
    body = {"messages": USER, "tools": [TICK], "logit_bias": answering, "logprobs": True, "top_logprobs": 1,
            "cache_prompt": False}
    body.update({"max_tokens": 12} if form == "text" else {"response_format": FORMAT})
    status, whole = server.post("/v1/chat/completions", body)
    assert status == 200, whole
    choice = whole["choices"][0]
    content = choice["message"]["content"]
    assert "tool_calls" not in choice["message"]
    assert content
    entries = choice["logprobs"]["content"]
    spelled = _spelled(entries)
    assert '"response"' not in spelled
    assert "response" not in spelled[:12]
    assert content in spelled  # every token of the text (a token holding its first quote too)
    assert len(spelled) < len(content) + 6  # and little else: the quote or brace its first and last tokens hold
    if form == "text":
        assert choice["finish_reason"] == "length"

    events = server.stream("/v1/chat/completions", body)
    assert _streamed_entries(events) == entries
    streamed = [event["choices"][0] for event in events[:-1] if event["choices"]]
    assert "".join(c["delta"].get("content") or "" for c in streamed) == content


# ------------------------------------------------------------------------------------------- max_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_cut_before_its_name_is_whole_is_a_log_line_naming_max_tokens(server, calling, caplog,  # noqa: F811
                                                                             stream):
    body = {"messages": USER, "tools": [TIME, PING], "tool_choice": "required", "logit_bias": calling,
            "max_tokens": 3}
    with caplog.at_level(logging.WARNING, logger=TOOLS_LOG):
        if stream:
            events = server.stream("/v1/chat/completions", body)
            assert events[-2]["choices"][0]["finish_reason"] == "length"
        else:
            status, whole = server.post("/v1/chat/completions", body)
            assert status == 200, whole
            message = whole["choices"][0]["message"]
            assert (message["content"], message.get("tool_calls"), whole["choices"][0]["finish_reason"]) == (
                "", None, "length")
    lines = [record.getMessage() for record in caplog.records if record.name == TOOLS_LOG]
    assert len(lines) == 1, lines  # one per answer
    assert "max_tokens" in lines[0]
    assert '"length"' in lines[0]
    assert "raise max_tokens" in lines[0]
    assert "\n" not in lines[0]


def test_an_answer_that_ends_whole_or_a_text_cut_short_leaves_no_line(server, calling, answering,  # noqa: F811
                                                                     caplog):
    with caplog.at_level(logging.WARNING, logger=TOOLS_LOG):
        status, called = server.post("/v1/chat/completions", {"messages": USER, "tools": [TICK],
                                                              "tool_choice": "required", "logit_bias": calling})
        assert status == 200, called
        assert called["choices"][0]["finish_reason"] == "tool_calls", called
        status, cut = server.post("/v1/chat/completions", {"messages": USER, "tools": [TICK], "max_tokens": 12,
                                                           "logit_bias": answering})
        assert status == 200, cut
        assert cut["choices"][0]["message"]["content"], cut  # a text cut: it says something
    assert not [record for record in caplog.records if record.name == TOOLS_LOG]


# ------------------------------------------------------------------------------------------- tool results


def _conversation(result: dict, calls: list[dict] | None = None) -> list[dict]:
    calls = calls if calls is not None else [
        {"id": "call_a", "type": "function", "function": {"name": "ping", "arguments": "{}"}},
        {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Oslo"}'}}]
    return [*USER, {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "call_a", "content": "pong"}, {"role": "tool", "content": "12:00",
                                                                             **result}]


def test_a_result_naming_no_call_of_the_turn_before_is_refused_by_its_tool_call_id(server):  # noqa: F811
    body = {"messages": _conversation({"tool_call_id": "call_z"}), "tools": [TIME, PING], "max_tokens": 1}
    status, refused = server.post("/v1/chat/completions", body)
    assert status == 400, refused
    error = refused["error"]
    assert error["param"] == "messages[3].tool_call_id"
    assert '"call_z"' in error["message"]  # the value
    assert '"call_a", "call_b"' in error["message"]
    assert "messages[1].tool_calls" in error["message"]

    # after a later turn of calls, an id none of the conversation's calls has is refused too, naming that turn's ids
    later = [*_conversation({"tool_call_id": "call_b"}),
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "call_c", "type": "function", "function": {"name": "ping", "arguments": "{}"}}]},
             {"role": "tool", "tool_call_id": "call_d", "content": "pong"}]
    status, refused = server.post("/v1/chat/completions", {"messages": later, "max_tokens": 1})
    assert (status, refused["error"]["param"]) == (400, "messages[5].tool_call_id")
    assert 'messages[4].tool_calls, the calls it follows, has the ids "call_c")' in refused["error"]["message"]


def test_the_openai_client_gets_a_bad_request_for_it(client):  # noqa: F811
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tiny", messages=_conversation({"tool_call_id": "call_z"}),
                                       max_tokens=1)
    assert refused.value.body["param"] == "messages[3].tool_call_id"


@pytest.mark.parametrize(("result", "calls"), [
    ({}, None),  # no id: llama-server takes it
    ({"tool_call_id": "call_b"}, None),  # the id of one of the turn's calls
    ({"tool_call_id": "anything"}, [{"type": "function", "function": {"name": "ping", "arguments": "{}"}}]),
])
def test_a_result_with_no_id_or_one_of_the_turn_s_or_after_calls_without_ids_is_taken(server, result,  # noqa: F811
                                                                                      calls):
    messages = _conversation(result, calls)
    if calls is not None:
        messages[2] = {"role": "tool", "content": "pong"}
    status, answer = server.post("/v1/chat/completions", {"messages": messages, "max_tokens": 1})
    assert status == 200, answer
    assert answer["choices"][0]["finish_reason"] == "length"  # an answer, not an error


def test_a_result_of_an_earlier_turn_s_call_is_taken_under_that_call_s_tool(server):  # noqa: F811
    """Its id names a call the model made, whose tool the prompt writes it under: nothing is lost, as the Ollama
    route reads such an id too (tests/unit/test_ollama57.py)."""
    messages = [*_conversation({"tool_call_id": "call_b"}),
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_c", "type": "function", "function": {"name": "ping", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_a", "content": "pong"}]
    status, answer = server.post("/v1/chat/completions", {"messages": messages, "max_tokens": 1})
    assert status == 200, answer
    status, rendered = server.post("/apply-template", {"messages": messages})
    assert status == 200, rendered
    assert '{"tool_response": {"tool": "ping", "content": "pong", "tool_call_id": "call_a"}}' in rendered["prompt"]
