"""Tool results of calls whose ids are used again (review 57).

* The chat route named each tool message's function from one id -> name map over the whole conversation, so a
  client numbering each turn's calls from 0 had an earlier turn's result labelled as the latest call's (the
  Anthropic Messages and Responses routes read their results through it). Each result is now read where it stands:
  of the earlier calls with its id, the first of the latest turn of calls not yet answered, else the latest, as
  Ollama's route reads it.
* The Responses route refused any function_call whose call_id an earlier call had; it now refuses one only where
  that call is still waiting for its output, and still refuses a second output for an answered call.
* An input item ``{"type": null, ...}`` with no role was told it had neither 'type' nor 'role'.
"""

from __future__ import annotations

import pytest

from edgesdk.serve.api import ApiError, parse_chat_request
from edgesdk.serve.responses import parse_responses_request


def _calls(*calls: tuple[str, str]) -> dict:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": ident, "type": "function", "function": {"name": name, "arguments": "{}"}}
                           for ident, name in calls]}


def _result(ident: str, content: str) -> dict:
    return {"role": "tool", "tool_call_id": ident, "content": content}


def _results(messages: list[dict]) -> str:
    return "\n".join(message["content"] for message in parse_chat_request({"messages": messages}).messages)


def test_a_reused_tool_call_id_names_the_call_each_result_follows():
    text = _results([{"role": "user", "content": "Weather?"}, _calls(("0", "get_weather")), _result("0", "sunny"),
                     {"role": "user", "content": "Time?"}, _calls(("0", "get_time")), _result("0", "noon")])
    assert '"tool": "get_weather", "content": "sunny"' in text
    assert '"tool": "get_time", "content": "noon"' in text


def test_parallel_calls_numbered_from_0_each_turn_are_each_answered():
    text = _results([{"role": "user", "content": "Weather and time?"},
                     _calls(("0", "get_weather"), ("1", "get_time")), _result("0", "sunny"), _result("1", "noon"),
                     {"role": "user", "content": "And again?"},
                     _calls(("0", "get_time"), ("1", "get_weather")), _result("0", "one"), _result("1", "rain")])
    for tool, content in (("get_weather", "sunny"), ("get_time", "noon"), ("get_time", "one"),
                          ("get_weather", "rain")):
        assert f'"tool": "{tool}", "content": "{content}"' in text
    # two calls of one turn with one id: the results answer them in order
    text = _results([{"role": "user", "content": "Both?"}, _calls(("0", "get_weather"), ("0", "get_time")),
                     _result("0", "sunny"), _result("0", "noon")])
    assert '"tool": "get_weather", "content": "sunny"' in text
    assert '"tool": "get_time", "content": "noon"' in text


TOOLS = [{"type": "function", "name": name, "parameters": {"type": "object"}} for name in ("weather", "time")]


def _call(call_id: str, name: str) -> dict:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": "{}"}


def _output(call_id: str, output: str) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def test_a_call_id_used_again_after_its_output_is_taken_in_responses():
    body = {"input": [{"role": "user", "content": "Weather?"}, _call("call_0", "weather"), _output("call_0", "sunny"),
                      {"role": "user", "content": "Time?"}, _call("call_0", "time"), _output("call_0", "noon")],
            "tools": TOOLS}
    text = "\n".join(message["content"] for message in parse_responses_request(body).request.messages)
    assert '"tool": "weather", "content": "sunny"' in text
    assert '"tool": "time", "content": "noon"' in text
    # a second output of the new call is still refused, naming the output that answered it
    with pytest.raises(ApiError) as caught:
        parse_responses_request({**body, "input": [*body["input"], _output("call_0", "late")]})
    assert caught.value.param == "input[6].call_id"
    assert "input[5]" in caught.value.message


def test_a_call_id_of_a_call_still_unanswered_is_still_refused_saying_so():
    with pytest.raises(ApiError) as caught:
        parse_responses_request({"input": [{"role": "user", "content": "Both?"}, _call("call_0", "weather"),
                                           _call("call_0", "time"), _output("call_0", "sunny")], "tools": TOOLS})
    assert caught.value.param == "input[2].call_id"
    assert "input[1]" in caught.value.message
    assert "no function_call_output has answered yet" in caught.value.message


def test_an_item_whose_type_is_null_is_told_so_without_a_role():
    with pytest.raises(ApiError) as caught:
        parse_responses_request({"input": [{"type": None, "content": "hi"}]})
    assert caught.value.param == "input[0].type"
    assert "'type' is null" in caught.value.message
    assert "neither" not in caught.value.message


def test_the_chat_route_and_ollama_s_read_a_reused_id_through_one_helper(monkeypatch):
    """The chat route and Ollama's /api/chat each wrote their own reading of a result's ``tool_call_id``; both now
    call :func:`edgesdk.serve.api.answered_call`, so the two cannot read an id apart."""
    from edgesdk.serve import api, ollama
    from edgesdk.serve.api import answered_call

    # the first call of the latest turn not answered yet, else the latest call of the id; None where it names none
    assert answered_call([(0, "a"), (2, "b"), (3, "c")], 2, {"b"}) == "c"
    assert answered_call([(0, "a"), (2, "b")], 2, {"b"}) == "b"
    assert answered_call([(0, 0), (1, 1)], 2, set()) == 1
    assert answered_call([], 0, set()) is None
    read = []

    def recording(named, latest, answered):
        read.append(list(named))
        return answered_call(named, latest, answered)

    monkeypatch.setattr(api, "answered_call", recording)
    monkeypatch.setattr(ollama, "answered_call", recording)
    messages = [{"role": "user", "content": "Weather?"}, _calls(("0", "get_weather")), _result("0", "sunny"),
                {"role": "user", "content": "Time?"}, _calls(("0", "get_time")), _result("0", "noon")]
    text = _results(messages)
    assert read == [[(0, 0)], [(0, 0), (1, 1)]]
    ollama.parse_chat({"model": "tiny-host", "messages": messages}, "tiny-host")
    # Ollama's reading of the ids it was sent (the second call renamed), then the chat route's of those it gives it
    assert read[2:] == [[(0, "0")], [(0, "0"), (1, "call_4_0")], [(0, 0)], [(1, 1)]]
    assert '"tool": "get_time", "content": "noon"' in text
