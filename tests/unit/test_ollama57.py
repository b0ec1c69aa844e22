"""Ollama's API (edgesdk/serve/ollama.py):

* /api/chat matched a tool result to the wrong call: a client that numbers each turn's calls from 0 sends the id "0"
  again in a later turn; that call was given another id (two calls of one id cannot both be named), but its result,
  sending "0", was matched to the earlier turn's call of that id, so the prompt told the model that the second tool
  (get_time) had returned what the first (get_weather) had;
* a ``model`` that is there but not a string (a number, an array) was refused as "'model' is required", blaming a
  field the client sent for being absent."""

from __future__ import annotations

import json

import pytest

from edgesdk.serve.api import ApiError
from edgesdk.serve.ollama import parse_chat, parse_embed, parse_generate, parse_pull

NAME = "tiny-host"
TOOLS = [{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
         for name in ("get_weather", "get_time")]


def _call(ident: str, name: str) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [{"id": ident, "function": {"name": name,
                                                                                         "arguments": {}}}]}


def _written(body: dict, key: str) -> list[dict]:
    """The ``key`` objects ("tool_call", "tool_response") of the chat request ``body`` means, as the prompt gives them
    to the model (one JSON object a line)."""
    asked = parse_chat({"model": NAME, "tools": TOOLS, **body}, NAME)
    lines = [line for message in asked.request.messages for line in message["content"].splitlines()]
    return [json.loads(line)[key] for line in lines if line.startswith(f'{{"{key}"')]


def _responses(body: dict) -> list[dict]:
    return _written(body, "tool_response")


def _calls(body: dict) -> list[dict]:
    return _written(body, "tool_call")


def test_a_result_answers_the_latest_turns_call_of_a_reused_id():
    body = {"messages": [{"role": "user", "content": "weather?"}, _call("0", "get_weather"),
                         {"role": "tool", "tool_call_id": "0", "content": "sunny"},
                         {"role": "user", "content": "time?"}, _call("0", "get_time"),
                         {"role": "tool", "tool_call_id": "0", "content": "noon"}]}
    first, second = _responses(body)
    calls = _calls(body)
    assert (first["tool"], first["content"]) == ("get_weather", "sunny")
    assert (second["tool"], second["content"]) == ("get_time", "noon")  # was get_weather
    assert second["tool_call_id"] == calls[1]["id"] != calls[0]["id"]  # the call it follows, not the first turn's


def test_parallel_calls_of_one_id_are_answered_one_each_in_order():
    turn = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "x", "function": {"name": "get_weather", "arguments": {}}},
        {"id": "x", "function": {"name": "get_time", "arguments": {}}}]}
    body = {"messages": [{"role": "user", "content": "both?"}, turn,
                         {"role": "tool", "tool_call_id": "x", "content": "sunny"},
                         {"role": "tool", "tool_call_id": "x", "content": "noon"}]}
    first, second = _responses(body)
    assert [(first["tool"], first["content"]), (second["tool"], second["content"])] == \
        [("get_weather", "sunny"), ("get_time", "noon")]
    assert [first["tool_call_id"], second["tool_call_id"]] == [call["id"] for call in _calls(body)]


def test_a_result_of_an_id_used_once_still_answers_that_call_in_an_earlier_turn():
    body = {"messages": [{"role": "user", "content": "weather?"}, _call("w", "get_weather"),
                         {"role": "user", "content": "and time?"}, _call("t", "get_time"),
                         {"role": "tool", "tool_call_id": "w", "content": "sunny"}]}
    (response,) = _responses(body)
    assert (response["tool"], response["tool_call_id"]) == ("get_weather", "w")


@pytest.mark.parametrize("parse", [parse_chat, parse_generate, parse_embed])
@pytest.mark.parametrize("model", [5, ["tiny-host"], {"name": "tiny-host"}])
def test_a_model_that_is_not_a_string_is_refused_as_what_it_is(parse, model):
    with pytest.raises(ApiError) as refused:
        parse({"model": model}, NAME)
    assert refused.value.param == "model"
    assert refused.value.message.startswith("'model' must be a string: the model's name, 'tiny-host:latest' here")
    assert "required" not in refused.value.message


def test_a_pull_of_a_model_that_is_not_a_string_says_so():
    with pytest.raises(ApiError) as refused:
        parse_pull({"model": 5}, [NAME])
    assert refused.value.message.startswith("'model' must be a string")


@pytest.mark.parametrize("body", [{}, {"model": None}, {"model": ""}, {"model": "", "name": ""}])
def test_a_model_left_out_is_still_required(body):
    with pytest.raises(ApiError) as refused:
        parse_chat(body, NAME)
    assert refused.value.message.startswith("'model' is required: the model's name")
