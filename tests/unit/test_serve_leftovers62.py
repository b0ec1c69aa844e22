"""Leftovers of the serve routes:

* a replayed call's arguments (Ollama's ``function.arguments`` object, Anthropic's ``tool_use`` ``input``) nested
  deeper than Python's JSON writes failed the request with a RecursionError (a 500); they are refused naming the
  field, as the chat route refuses them (edgesdk/serve/tools.py), and nested less deeply they are still written;
* a streamed ``/api/pull`` of the model served answered ``success`` alone, where Ollama streams the statuses of a
  pull of a model it has: pulling manifest, verifying sha256 digest, writing manifest, success;
* a position whose logits are all -inf (or NaN) gave a NaN log-probability, which Python's JSON writes as ``NaN``
  (no JSON) in an echoed prompt's logprobs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgesdk.runtime.logprobs import NO_CHANCE, LogprobRecorder
from edgesdk.serve.anthropic import chat_body
from edgesdk.serve.api import ApiError
from edgesdk.serve.ollama import parse_chat
from tests._utils.ollama_calls import ollama_client
from tests.unit.test_tools62 import DEPTH, _deep_list, _names_no_depth

NAME = "tiny-host"


def _ollama_replay(arguments: object) -> dict:
    return {"model": NAME, "messages": [
        {"role": "user", "content": "nest"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": arguments}}]},
        {"role": "tool", "tool_name": "f", "content": "ok"}]}


def _anthropic_replay(arguments: object) -> dict:
    return {"model": NAME, "max_tokens": 8, "messages": [
        {"role": "user", "content": "nest"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": arguments}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]}


# ------------------------------------------------------------------------------------ deep replayed arguments
def test_ollama_arguments_too_deep_to_write_are_refused_naming_them():
    with pytest.raises(ApiError) as caught:
        parse_chat(_ollama_replay({"a": _deep_list(DEPTH)}), NAME)
    assert caught.value.status == 400
    assert caught.value.param == "messages[1].tool_calls[0].function.arguments"
    _names_no_depth(str(caught.value))


def test_anthropic_input_too_deep_to_write_is_refused_naming_it():
    with pytest.raises(ApiError) as caught:
        chat_body(_anthropic_replay({"a": _deep_list(DEPTH)}))
    assert caught.value.status == 400
    assert caught.value.param == "messages[1].content[0].input"
    _names_no_depth(str(caught.value))


def test_arguments_with_a_lone_surrogate_are_refused_as_text_that_is_not_utf8():
    """Both routes write a value's arguments with the chat route's writer and check the text as the route's other
    fields are checked: the 400 names the field, with the code ``not_utf8`` (the Ollama route gave none)."""
    with pytest.raises(ApiError) as ollama:
        parse_chat(_ollama_replay({"a": "\ud800"}), NAME)
    with pytest.raises(ApiError) as anthropic:
        chat_body(_anthropic_replay({"a": "\ud800"}))
    for caught, param in ((ollama, "messages[1].tool_calls[0].function.arguments"),
                          (anthropic, "messages[1].content[0].input")):
        assert (caught.value.status, caught.value.param, caught.value.code) == (400, param, "not_utf8")


def test_arguments_nested_a_little_are_still_written():
    value = {"a": _deep_list(50)}
    asked = parse_chat(_ollama_replay(value), NAME)
    [turn] = [message for message in asked.request.messages if message["role"] == "assistant"]
    assert json.loads(turn["content"])["tool_call"]["arguments"] == value
    [message] = [message for message in chat_body(_anthropic_replay(value))["messages"]
                 if message["role"] == "assistant"]
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == value


# ------------------------------------------------------------------------------------------------ /api/pull
def test_a_streamed_pull_of_the_served_model_gives_ollama_s_statuses(served):
    status, headers, payload = served.request("POST", "/api/pull", {"model": NAME})
    assert status == 200, payload
    assert headers["Content-Type"] == "application/x-ndjson"
    assert [json.loads(line) for line in payload.decode().splitlines()] == [
        {"status": "pulling manifest"}, {"status": "verifying sha256 digest"}, {"status": "writing manifest"},
        {"status": "success"}]


def test_a_whole_pull_is_its_success_alone(served):
    assert served.post("/api/pull", {"model": NAME, "stream": False}) == (200, {"status": "success"})


def test_the_ollama_client_reads_the_pull_s_statuses(served):
    client = ollama_client(served)
    assert client.pull(NAME).status == "success"
    assert [part.status for part in client.pull(NAME, stream=True)] == [
        "pulling manifest", "verifying sha256 digest", "writing manifest", "success"]


# ---------------------------------------------------------------------------------------------- logprobs
@pytest.mark.parametrize("row", [np.full(8, -np.inf, dtype=np.float32), np.full(8, np.nan, dtype=np.float32),
                                 np.array([0.5, np.nan, 1.0, -np.inf], dtype=np.float32)])
def test_a_position_without_a_finite_distribution_writes_no_nan(row):
    recorder = LogprobRecorder(top=3, prompt=True)
    recorder.record_prompt(np.stack([row, row]), [1, 2, 3])
    for entry in recorder.prompt_entries[1:]:
        assert entry.logprob == NO_CHANCE
        assert [score for _, score in entry.top] == [NO_CHANCE] * 3
        assert [token for token, _ in entry.top] == [0, 1, 2]  # all alike: in the order of their ids
    json.dumps([[entry.logprob, list(entry.top)] for entry in recorder.prompt_entries], allow_nan=False)


def test_a_finite_row_keeps_its_log_probabilities():
    entry = LogprobRecorder(top=2).entry(np.array([0.0, np.log(3.0), -np.inf], dtype=np.float32), 0)
    assert entry.logprob == pytest.approx(np.log(0.25))
    assert entry.top[0] == (1, pytest.approx(np.log(0.75)))
    assert entry.top[1][0] == 0
    assert LogprobRecorder().entry(np.array([0.0, -np.inf], dtype=np.float32), 1).logprob == NO_CHANCE
