"""OpenAI's Responses API (edgesdk/serve/responses.py): review 63.

* A ``function_call`` the response ``previous_response_id`` names made, sent again in ``input`` without its item
  ``id`` beside its ``function_call_output`` (a client that keeps its own transcript and chains turns too), was
  refused with the fix "send the calls as the response gave them", which is what the client did: the error now says
  that the conversation holds the call already and that only its output is to be sent.
"""

from __future__ import annotations

import pytest

from edgesdk.serve.api import ApiError
from edgesdk.serve.response_store import ResponseStore, kept_items
from edgesdk.serve.responses import parse_responses_request

TOOL = {"type": "function", "name": "get_time", "parameters": {"type": "object"}}
ASK = {"role": "user", "content": "Time in Oslo?"}
CALL = {"type": "function_call", "call_id": "call_7", "name": "get_time", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "call_7", "output": "noon"}


def _store() -> ResponseStore:
    store = ResponseStore(4, 1 << 20)
    store.put({"id": "resp_1", "status": "completed", "output": [{**CALL, "id": "fc_1", "status": "completed"}]},
              tuple(kept_items([ASK])))
    return store


def test_a_previous_response_s_call_sent_again_says_to_send_only_its_output():
    store = _store()
    with pytest.raises(ApiError) as caught:
        parse_responses_request({"previous_response_id": "resp_1", "input": [CALL, OUTPUT], "tools": [TOOL]}, store)
    error = caught.value
    assert error.status == 400
    assert error.param == "input[0].call_id"
    assert "send the calls as the response gave them" not in error.message, error.message
    assert "send only the new items" in error.message, error.message
    assert "function_call_output" in error.message
    assert '"call_7"' in error.message
    # the fix it gives is taken: the output alone continues the conversation
    asked = parse_responses_request({"previous_response_id": "resp_1", "input": [OUTPUT], "tools": [TOOL]}, store)
    assert '"content": "noon"' in asked.request.messages[-1]["content"]


def test_two_unanswered_calls_with_one_id_in_input_keep_their_own_fix():
    with pytest.raises(ApiError) as caught:
        parse_responses_request({"input": [ASK, CALL, CALL, OUTPUT], "tools": [TOOL]})
    assert caught.value.param == "input[2].call_id"
    assert "input[1]" in caught.value.message
    assert "each function_call needs a call_id of its own" in caught.value.message
