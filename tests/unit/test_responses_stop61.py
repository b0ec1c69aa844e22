"""``POST /v1/responses`` (edgesdk/serve/response_events.py, ``Output.end``): review 61.

A request's own ``stop`` string (llama-server's field, read as on the chat route) that cut a function call inside its
arguments gave the ``function_call`` item and the response ``completed``, the call's ``arguments`` a prefix of JSON,
so a client ran a call with cut-off arguments. Such a call is now cut short as one ``max_output_tokens`` cuts:
the item ``incomplete``, the response ``incomplete`` (``incomplete_details.reason`` null: OpenAI's reasons name no
stop string), its last event ``response.incomplete``, whole and streamed alike and every event the openai client's
type; the chat route answers the same cut ``finish_reason`` "stop" (not "tool_calls") and the Messages route
``stop_reason`` "stop_sequence" (not "tool_use"), its ``tool_use`` input what the cut arguments hold. A stop string
that cuts a text answer under tools, or one that ends a whole call, still ends the response ``completed``.

The tiny model writes whitespace when left alone, so the Responses and chat requests ban it with ``logit_bias``, as
tests/unit/test_serve_tool_pieces38.py does; the Messages route takes none, and its call is led by an enum schema.
"""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("pydantic")

from edgesdk.serve.anthropic import partial_input  # noqa: E402 (after the skips)
from edgesdk.serve.completion import Completion  # noqa: E402
from edgesdk.serve.response_events import Output  # noqa: E402
from edgesdk.serve.responses import parse_responses_request  # noqa: E402
from tests.unit import test_openai_client37 as shared  # noqa: E402
from tests.unit.test_serve_responses_strict38 import events_of, strict_events, strict_response  # noqa: E402
from tests.unit.test_serve_tool_pieces38 import _bare  # noqa: E402

runtime, server, client, no_whitespace = shared.runtime, shared.server, shared.client, shared.no_whitespace

QUESTION = "What time is it in Oslo?"
TIME = {"type": "function", "name": "get_time", "description": "The time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "hour24": {"type": "boolean"}},
                       "required": ["city", "hour24"], "additionalProperties": False}}
CHAT_TIME = {"type": "function", "function": {key: TIME[key] for key in ("name", "description", "parameters")}}
WEATHER = {"name": "get_weather", "description": "Weather of a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]},
                                     "days": {"type": "integer", "enum": [1, 2]}},
    "required": ["city", "days"], "additionalProperties": False}}
ASKED = "Weather in Paris?"


def _whole_and_streamed(server, body: dict) -> tuple[dict, list[tuple[str, dict]]]:  # noqa: F811
    """The answer without ``stream`` and the stream's events, each strictly the openai client's type; the stream's
    last response is the whole one."""
    status, whole = server.post("/v1/responses", body)
    assert status == 200, whole
    strict_response(whole)
    events = events_of(server, body)
    strict_events(events)
    assert _bare(events[-1][1]["response"]) == _bare(whole)
    return whole, events


def _assert_cut_call(whole: dict, events: list[tuple[str, dict]], name: str) -> dict:
    """The response and its one call cut short, as ``max_output_tokens`` leaves them."""
    assert (whole["status"], whole["incomplete_details"], whole["completed_at"]) == ("incomplete", {"reason": None},
                                                                                     None)
    (call,) = whole["output"]
    assert (call["type"], call["name"], call["status"]) == ("function_call", name, "incomplete")
    with pytest.raises(json.JSONDecodeError):
        json.loads(call["arguments"])
    names = [event for event, _ in events]
    assert names[-3:] == ["response.function_call_arguments.done", "response.output_item.done",
                          "response.incomplete"]
    (done,) = [data["item"] for event, data in events if event == "response.output_item.done"]
    assert (done["status"], done["arguments"]) == ("incomplete", call["arguments"])
    pieces = [data["delta"] for event, data in events if event == "response.function_call_arguments.delta"]
    assert "".join(pieces) == call["arguments"]
    return call


# ------------------------------------------------------------------------------------------- a real server


def test_a_call_cut_by_a_stop_string_is_incomplete_whole_and_streamed(server, client, no_whitespace):  # noqa: F811
    chat = {"messages": [{"role": "user", "content": QUESTION}], "tools": [CHAT_TIME], "tool_choice": "required",
            "logit_bias": no_whitespace}
    status, full = server.post("/v1/chat/completions", chat)
    assert status == 200, full
    arguments = full["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    # the stop string: what the model writes from inside the city's string to the next key, found nowhere before it
    raw = '{"tool_call":{"name":"get_time","arguments":' + json.dumps(json.loads(arguments), separators=(",", ":")) + "}}"
    start = raw.index('"city":"') + len('"city":"')
    stop = raw[start:raw.index('"hour24"', start) + len('"hour24"')]
    assert raw.index(stop) == start

    body = {"model": "tiny", "input": QUESTION, "tools": [TIME], "tool_choice": "required",
            "logit_bias": no_whitespace, "stop": [stop]}
    whole, events = _whole_and_streamed(server, body)
    call = _assert_cut_call(whole, events, "get_time")
    assert call["arguments"] == '{"city": "'
    assert arguments.startswith(call["arguments"])

    # the openai client reads the cut as such, whole and from its stream helper's last event (its
    # get_final_response wants a response.completed, which an incomplete response never sends)
    asked = {key: value for key, value in body.items() if key not in ("logit_bias", "stop")}
    extra = {"logit_bias": no_whitespace, "stop": [stop]}
    made = client.responses.create(**asked, extra_body=extra)
    with client.responses.stream(**asked, extra_body=extra) as stream:
        last = list(stream)[-1]
    assert last.type == "response.incomplete"
    for response in (made, last.response):
        assert (response.status, response.incomplete_details.reason) == ("incomplete", None)
        assert [(item.status, item.arguments) for item in response.output] == [("incomplete", call["arguments"])]

    # the chat route answers the same cut "stop", not "tool_calls": no call to run
    status, cut = server.post("/v1/chat/completions", {**chat, "stop": [stop]})
    assert status == 200, cut
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == call["arguments"]

    # without the stop string the same call is whole and completed
    whole, events = _whole_and_streamed(server, {key: value for key, value in body.items() if key != "stop"})
    assert (whole["status"], whole["output"][0]["status"], whole["output"][0]["arguments"]) == (
        "completed", "completed", arguments)
    assert events[-1][0] == "response.completed"


@pytest.mark.parametrize(("marker", "expected"), [("{city}", {}), ('"days"', {"city": "{city}"})],
                         ids=["mid-string", "after a value"])
def test_the_messages_route_reads_the_same_cut_as_a_call_cut_short(server, marker, expected):  # noqa: F811
    """The same prompt, tool and stop string on both routes: the Messages route's ``tool_use`` block holds what the
    Responses route's cut arguments hold (the anthropic client's partial reading), its stop reason
    ``stop_sequence``; the Responses route's call and response are ``incomplete``."""
    chat = {"messages": [{"role": "user", "content": ASKED}], "max_tokens": 420, "tool_choice": "required",
            "tools": [{"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                                        "parameters": WEATHER["input_schema"]}}]}
    status, full = server.post("/v1/chat/completions", chat)
    assert status == 200, full
    city = json.loads(full["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])["city"]
    stop = marker.format(city=city)
    expected = {key: value.format(city=city) for key, value in expected.items()}

    status, message = server.post("/v1/messages", {
        "model": "tiny", "messages": chat["messages"], "max_tokens": 420, "tools": [WEATHER],
        "tool_choice": {"type": "any"}, "stop_sequences": [stop]})
    assert status == 200, message
    (block,) = message["content"]
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", stop)
    assert (block["type"], block["name"], block["input"]) == ("tool_use", "get_weather", expected)

    tool = {"type": "function", "name": WEATHER["name"], "description": WEATHER["description"],
            "parameters": WEATHER["input_schema"]}
    body = {"model": "tiny", "input": ASKED, "max_output_tokens": 420, "tools": [tool], "tool_choice": "required",
            "stop": [stop]}
    whole, events = _whole_and_streamed(server, body)
    call = _assert_cut_call(whole, events, "get_weather")
    assert partial_input(call["arguments"]) == expected


# ------------------------------------------------------------------------------------------- Output, as it is fed


def _answered(text: str, finish_reason: str) -> tuple[dict, list[tuple[str, dict]]]:
    """The whole response to an answer under ``TIME`` and the events of the same answer streamed a character at a
    time, both strictly the openai client's types."""
    asked = parse_responses_request({"model": "m", "input": QUESTION, "tools": [TIME], "stop": ["!"]})
    completion = Completion(text, finish_reason, 5, len(text))
    whole = Output(asked, "m", 0.0, 1.0).whole(completion)
    strict_response(whole)
    output = Output(asked, "m", 0.0, 1.0)
    events = output.start()
    for char in text:
        events += output.push(char)
    events += output.end(completion)
    strict_events(events)
    assert _bare(events[-1][1]["response"]) == _bare(whole)
    return whole, events


@pytest.mark.parametrize("text", ['{"tool_call":{"name":"get_time","arguments":{"city":"Os',
                                  '{"tool_call":{"name":"get_time","arguments":{"city":"Oslo","hour24":true'],
                         ids=["mid-string", "before its brace"])
def test_a_call_a_stop_string_cut_inside_its_arguments_is_incomplete(text):
    whole, events = _answered(text, "stop")
    call = _assert_cut_call(whole, events, "get_time")
    assert text.endswith(call["arguments"].replace(" ", "").removeprefix("{"))


def test_a_call_a_stop_string_cut_before_the_answer_s_end_is_incomplete():
    """Its arguments whole, the answer's JSON not: cut as ``max_output_tokens`` cuts it there."""
    whole, events = _answered('{"tool_call":{"name":"get_time","arguments":{"city":"Oslo","hour24":true}}', "stop")
    (call,) = whole["output"]
    assert (whole["status"], whole["incomplete_details"], call["status"]) == ("incomplete", {"reason": None},
                                                                              "incomplete")
    assert events[-1][0] == "response.incomplete"
    limited, _ = _answered('{"tool_call":{"name":"get_time","arguments":{"city":"Oslo","hour24":true}}', "length")
    assert _bare(limited)["output"] == _bare(whole)["output"]


def test_a_whole_call_a_stop_string_ended_is_completed():
    whole, events = _answered('{"tool_call":{"name":"get_time","arguments":{"city":"Oslo","hour24":true}}}', "stop")
    (call,) = whole["output"]
    assert (whole["status"], whole["incomplete_details"], call["status"]) == ("completed", None, "completed")
    assert json.loads(call["arguments"]) == {"city": "Oslo", "hour24": True}
    assert events[-1][0] == "response.completed"


def test_a_text_answer_a_stop_string_cut_is_completed():
    """As an answer without tools: a stop string ends a text, it cuts no call."""
    whole, events = _answered('{"response":"It is ten', "stop")
    (message,) = whole["output"]
    assert (whole["status"], message["type"], message["status"]) == ("completed", "message", "completed")
    assert message["content"][0]["text"] == "It is ten"
    assert events[-1][0] == "response.completed"


def test_a_call_the_limit_cut_is_still_incomplete_for_max_output_tokens():
    whole, _ = _answered('{"tool_call":{"name":"get_time","arguments":{"city":"Os', "length")
    assert (whole["status"], whole["incomplete_details"], whole["output"][0]["status"]) == (
        "incomplete", {"reason": "max_output_tokens"}, "incomplete")
