"""What the server answers, sent back as the next turn's history (roundtrip51): POST /v1/responses.

A ``function_call`` item whose ``arguments`` are not JSON text (an answer cut by ``max_output_tokens`` inside its
arguments, which this server returns as written with ``status`` "incomplete"; ``""``; an integer past Python's
4,300-digit limit) is read as the chat route reads such a call (edgesdk/serve/tools.py ``call_text``, commit
0257cfb): its arguments the model's string as written, as llama-server reads it (``convert_responses_to_chatcmpl``
passes the string on; minja's ``polyfill_tool_calls`` keeps what it cannot parse). It was refused: in ``input`` with a
400 ("is not JSON text"), by ``previous_response_id`` with a 400 telling the client to ask again, and the digit
limit with a 500.
"""

from __future__ import annotations

import json

import pytest

from edgesdk.serve.responses import parse_responses_request
from edgesdk.serve.tools import call_text
from tests.unit.test_tools import server  # noqa: F401 (a fixture: 2,048 tokens of context, room for the tools)

QUESTION = "What time is it in Oslo?"
TIME = {"type": "function", "name": "get_time", "description": "The time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def _no_whitespace(served) -> dict[str, int]:
    """``logit_bias`` banning every whitespace-only token: the tiny model then writes its call to the end."""
    tokenizer = served.completer.runtime.tokenizer.tokenizer
    return {str(token): -100 for token in range(tokenizer.get_vocab_size())
            if (text := tokenizer.decode([token])) and not text.strip()}


def _not_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return True
    return False


def test_a_call_cut_by_max_output_tokens_goes_on_in_the_next_response(server):  # noqa: F811 (the fixture)
    asked = {"model": "tiny", "input": QUESTION, "tools": [TIME], "tool_choice": "required",
             "logit_bias": _no_whitespace(server)}
    status, whole = server.post("/v1/responses", asked)
    assert status == 200, whole
    assert whole["status"] == "completed"
    for limit in range(whole["usage"]["output_tokens"] - 1, 0, -1):  # the first limit that cuts inside the arguments
        status, cut = server.post("/v1/responses", {**asked, "max_output_tokens": limit})
        assert status == 200, cut
        if cut["output"] and cut["output"][0]["type"] == "function_call" and _not_json(cut["output"][0]["arguments"]):
            break
    (call,) = cut["output"]
    assert (cut["status"], call["status"]) == ("incomplete", "incomplete")
    assert whole["output"][0]["arguments"].startswith(call["arguments"])
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": "12:00"}

    # by previous_response_id, and the same items sent back in 'input' (as the openai client sends an output back)
    status, chained = server.post("/v1/responses", {"model": "tiny", "previous_response_id": cut["id"],
                                                    "input": [result], "max_output_tokens": 2})
    assert status == 200, chained
    status, stateless = server.post("/v1/responses", {"model": "tiny", "max_output_tokens": 2, "store": False,
                                                      "input": [{"role": "user", "content": QUESTION}, call, result]})
    assert status == 200, stateless
    # the prompt is the chat route's for the same conversation: the call's arguments as the model wrote them
    status, chat = server.post("/v1/chat/completions", {"max_tokens": 2, "messages": [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call["call_id"], "type": "function", "function": {"name": "get_time",
                                                                     "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["call_id"], "content": "12:00"}]})
    assert status == 200, chat
    assert chained["usage"]["input_tokens"] == stateless["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"]


@pytest.mark.parametrize("arguments", ["", "{oops", '{"n": ' + "7" * 5000 + "}"],
                         ids=["empty", "not JSON", "past the digit limit"])
def test_function_call_arguments_that_are_not_json_are_kept_as_their_string(arguments):
    """``""`` and text that is no JSON value were a 400 ("is not JSON text"); an integer of more than 4,300 digits
    (a ValueError that is not a JSONDecodeError) a 500 with a traceback. Each is the call as the chat route renders
    it."""
    request = parse_responses_request({"model": "tiny", "input": [
        {"role": "user", "content": "count"},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": arguments, "status": "incomplete"},
        {"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "ok"}]}]})
    turn = next(message for message in request.request.messages if message["role"] == "assistant")
    expected = call_text([{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": arguments}}],
                         "messages[1].tool_calls")
    assert turn["content"] == expected
    assert json.loads(turn["content"]) == {"tool_call": {"name": "f", "arguments": arguments, "id": "call_1"}}


def test_input_items_keep_the_status_they_were_sent_with(server):  # noqa: F811 (the fixture)
    """An answer cut by its token limit gives its items ``status`` "incomplete"; sent back in ``input``, the
    response's input items listed them "completed" (a reasoning item with no status), so one item id read
    "incomplete" in the response that gave it and "completed" in the next one's input items."""
    items = [{"role": "user", "content": QUESTION},
             {"type": "reasoning", "id": "rs_1", "summary": [], "status": "incomplete",
              "content": [{"type": "reasoning_text", "text": "Oslo"}]},
             {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_time",
              "arguments": '{"city": "Os', "status": "incomplete"},
             {"type": "function_call_output", "call_id": "call_1", "output": "12:00", "status": "completed"},
             {"type": "message", "id": "msg_1", "role": "assistant", "status": "incomplete",
              "content": [{"type": "output_text", "text": "It is", "annotations": []}]},
             {"role": "user", "content": "And now?"}]
    status, answer = server.post("/v1/responses", {"model": "tiny", "input": items, "max_output_tokens": 1})
    assert status == 200, answer
    status, _, payload = server.request("GET", f"/v1/responses/{answer['id']}/input_items?order=asc")
    assert status == 200, payload
    listed = json.loads(payload)["data"]
    assert [(item["type"], item["status"]) for item in listed] == [
        ("message", "completed"), ("reasoning", "incomplete"), ("function_call", "incomplete"),
        ("function_call_output", "completed"), ("message", "incomplete"), ("message", "completed")]


def test_an_item_status_that_is_none_of_openai_s_is_refused(server):  # noqa: F811 (the fixture)
    """A status OpenAI does not have was taken without a word (OpenAI refuses it: "Invalid value")."""
    status, answer = server.post("/v1/responses", {"model": "tiny", "max_output_tokens": 1, "input": [
        {"role": "user", "content": QUESTION, "status": "done"}]})
    assert status == 400, answer
    assert answer["error"]["param"] == "input[0].status"
    assert '"done"' in answer["error"]["message"]
    assert "incomplete" in answer["error"]["message"]
