"""OpenAI's Responses API requests (edgesdk/serve/responses.py): review 57.

* A ``call_id`` names one call until its output: a ``function_call`` with the ``call_id`` of a call still waiting
  for its output (a client that mints ids per turn, or that sends back a call without its item ``id`` beside
  ``previous_response_id``) was taken, the one output rendered as the last call's result and the other call left
  without one; a second ``function_call_output`` for an answered call was taken as one more result. Both are now
  400s naming the item ("Duplicate function call id", "Duplicate function_call_output for call_id ..."). An id
  whose call has its output may be used again (tests/unit/test_tool_turns57.py).
* An input item with neither ``type`` nor ``role``, or a content part (``input_text``) sent where an item goes, was
  refused as "a None item ... (built-in tools' items have no tool here)"; a tool that is no object, or that lacks
  its ``type``, as a built-in tool. Each now says what is wrong and how to send it.
"""

from __future__ import annotations

import pytest

from edgesdk.serve.api import ApiError
from edgesdk.serve.response_store import ResponseStore, kept_items
from edgesdk.serve.responses import parse_responses_request

TOOL = {"type": "function", "name": "weather", "parameters": {"type": "object"}}
ASK = {"role": "user", "content": "Weather in Oslo and in Rome?"}


def _call(call_id: str, name: str = "weather") -> dict:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": "{}"}


def _output(call_id: str, output: str) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def _refusal(body: dict, store: ResponseStore | None = None) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_responses_request(body, store)
    assert caught.value.status == 400
    return caught.value


def test_two_function_calls_with_one_call_id_are_refused_naming_the_second():
    tools = [TOOL, {**TOOL, "name": "delete_file"}]
    body = {"input": [ASK, _call("call_0"), _call("call_0", "delete_file"), _output("call_0", "12 C")],
            "tools": tools}
    error = _refusal(body)
    assert error.param == "input[2].call_id"
    assert '"call_0"' in error.message
    assert "input[1]" in error.message
    # calls with ids of their own are read as before, each output the result of its own call
    fine = parse_responses_request({**body, "input": [ASK, _call("call_0"), _call("call_1", "delete_file"),
                                                      _output("call_0", "12 C"), _output("call_1", "done")]})
    results = "\n".join(message["content"] for message in fine.request.messages[-2:])
    assert '"tool": "weather", "content": "12 C"' in results
    assert '"tool": "delete_file", "content": "done"' in results


def test_a_call_sent_again_beside_previous_response_id_is_refused():
    store = ResponseStore(4, 1 << 20)
    answered = {"id": "resp_1", "status": "completed",
                "output": [{**_call("call_0"), "id": "fc_1", "status": "completed"}]}
    store.put(answered, tuple(kept_items([ASK])))
    # the call the previous response made, sent again without its item id, beside its output
    error = _refusal({"previous_response_id": "resp_1", "input": [_call("call_0"), _output("call_0", "12 C")],
                      "tools": [TOOL]}, store)
    assert error.param == "input[0].call_id"
    assert "previous_response_id" in error.message
    # its output alone continues it
    asked = parse_responses_request({"previous_response_id": "resp_1", "input": [_output("call_0", "12 C")],
                                     "tools": [TOOL]}, store)
    assert '"content": "12 C"' in asked.request.messages[-1]["content"]


def test_a_second_output_for_one_call_is_refused():
    body = {"input": [ASK, _call("call_0"), _output("call_0", "12 C"), _output("call_0", "31 C")], "tools": [TOOL]}
    error = _refusal(body)
    assert error.param == "input[3].call_id"
    assert '"call_0"' in error.message
    assert "input[2]" in error.message


@pytest.mark.parametrize(("item", "says"), [
    ({"content": "hi"}, "neither 'type' nor 'role'"),
    ({"type": None, "role": "user", "content": "hi"}, "'type' is null"),
    ({"type": "input_text", "text": "hi"}, "content part (input_text) where an input item goes"),
])
def test_an_item_that_is_no_input_item_is_named_for_what_it_is(item, says):
    error = _refusal({"input": [item]})
    assert error.param == "input[0].type"
    assert says in error.message
    assert "built-in" not in error.message


def test_a_built_in_tool_s_item_is_still_refused_as_one():
    error = _refusal({"input": [ASK, {"type": "web_search_call", "id": "ws_1", "status": "completed"}]})
    assert error.param == "input[1]"
    assert "built-in" in error.message


@pytest.mark.parametrize(("tool", "param", "says"), [
    ("weather", "tools[0]", "must be a function tool object"),
    ({"name": "weather", "parameters": {"type": "object"}}, "tools[0].type", 'add "type": "function"'),
])
def test_a_tool_that_is_no_function_tool_object_is_named_for_what_it_is(tool, param, says):
    error = _refusal({"input": [ASK], "tools": [tool]})
    assert error.param == param
    assert says in error.message
    assert "built-in" not in error.message
    built_in = _refusal({"input": [ASK], "tools": [{"type": "web_search"}]})
    assert built_in.param == "tools[0]"
    assert "built-in" in built_in.message
