"""OpenAI's Responses API (edgesdk/serve/response_events.py, response_store.py): review 48.

* A thinking model's message whose first token starts in the whitespace after ``</think>`` (`` It``): the message's
  text begins with that token's word, so its ``logprobs`` hold the token, as the chat route's ``logprobs.content``
  does. They left it out (taken for the reasoning's, its start being before the message's first character), so the
  message's logprobs did not spell its text.
* ``GET /v1/responses/{id}/input_items`` ``before`` (the spec's "An item ID to list items before, used in
  pagination", sent by the openapi-generated clients): the page just before that item. It was read as nothing, and
  the first page came back as if it were the one asked for.
"""

from __future__ import annotations

import pytest

from edgesdk.serve.api import ApiError
from edgesdk.serve.completion import Completion
from edgesdk.serve.reasoning import ReasoningSplitter
from edgesdk.serve.response_events import Output
from edgesdk.serve.response_store import ResponseStore, input_items_page, kept_items
from edgesdk.serve.responses import parse_responses_request

LOGPROBS = ["message.output_text.logprobs"]


def _entries(pieces: list[str]) -> list[dict]:
    return [{"token": piece, "bytes": list(piece.encode()), "logprob": -float(n), "top_logprobs": []}
            for n, piece in enumerate(pieces)]


@pytest.mark.parametrize("pieces", [
    ["The", " fox", "</think>", " It", " jumps", "."],  # the space after </think> is the message's first token's
    ["The", "</think>", "\n\n", " It", " jumps", "."],  # a whitespace token alone stays out, the word's comes in
])
def test_a_message_token_starting_in_the_whitespace_after_think_is_the_message_s(pieces):
    entries = _entries(pieces)
    first = pieces.index(" It")
    asked = parse_responses_request({"model": "m", "input": "hi", "include": LOGPROBS})
    completion = Completion(text="".join(pieces), finish_reason="stop", prompt_tokens=4,
                            completion_tokens=len(pieces), logprobs={"content": entries, "refusal": None})

    whole = Output(asked, "m", 0.0, 1.0, splitter=ReasoningSplitter(opened=True)).whole(completion)
    reasoning, message = whole["output"]
    part = message["content"][0]
    assert part["text"] == "It jumps."
    assert part["logprobs"] == entries[first:]
    # the message's tokens spell its text (the leading whitespace llama.cpp strips aside)
    assert "".join(entry["token"] for entry in part["logprobs"]).lstrip() == part["text"]

    streamed = Output(asked, "m", 0.0, 1.0, splitter=ReasoningSplitter(opened=True))
    events = streamed.start()
    for piece, entry in zip(pieces, entries, strict=True):
        events += streamed.push(piece, {"content": [entry], "refusal": None})
    events += streamed.end(completion)
    final = events[-1][1]["response"]
    assert final["output"][1]["content"][0]["logprobs"] == entries[first:]
    deltas = [data for name, data in events if name == "response.output_text.delta"]
    assert [entry["token"] for delta in deltas for entry in delta["logprobs"]] == pieces[first:]
    (done,) = [data for name, data in events if name == "response.output_text.done"]
    assert [entry["token"] for entry in done["logprobs"]] == pieces[first:]


def _kept(count: int):
    store = ResponseStore(4, 1 << 20)
    items = tuple(kept_items([{"role": "user", "content": f"turn {n}", "id": f"msg_{n}"} for n in range(count)]))
    store.put({"id": "resp_1", "status": "completed", "output": []}, items)
    return store.get("resp_1")


def _page(kept, **query) -> tuple[list[str], bool, str | None, str | None]:
    page = input_items_page(kept, {key: [str(value)] for key, value in query.items()})
    return [item["id"] for item in page["data"]], page["has_more"], page["first_id"], page["last_id"]


def test_input_items_before_gives_the_page_just_before_the_item_it_names():
    kept = _kept(7)  # msg_0 .. msg_6
    # asc: the items before msg_5, the nearest 2, in order; more come before them
    assert _page(kept, order="asc", before="msg_5", limit=2) == (["msg_3", "msg_4"], True, "msg_3", "msg_4")
    assert _page(kept, order="asc", before="msg_2", limit=2) == (["msg_0", "msg_1"], False, "msg_0", "msg_1")
    assert _page(kept, order="asc", before="msg_0") == ([], False, None, None)
    # desc (the default): the last item first, so "before" msg_2 is the later items
    assert _page(kept, before="msg_2", limit=3) == (["msg_5", "msg_4", "msg_3"], True, "msg_5", "msg_3")
    assert _page(kept, before="msg_2") == (["msg_6", "msg_5", "msg_4", "msg_3"], False, "msg_6", "msg_3")
    # paging back from the last page by its first_id gives the pages that came before it
    forward = _page(kept, order="asc", after="msg_3", limit=3)
    assert forward == (["msg_4", "msg_5", "msg_6"], False, "msg_4", "msg_6")
    assert _page(kept, order="asc", before=forward[2], limit=3) == (["msg_1", "msg_2", "msg_3"], True, "msg_1",
                                                                     "msg_3")
    # with after too: the items between them
    assert _page(kept, order="asc", after="msg_1", before="msg_5") == (["msg_2", "msg_3", "msg_4"], False, "msg_2",
                                                                        "msg_4")


def test_input_items_before_naming_no_item_is_a_400_naming_before():
    kept = _kept(3)
    with pytest.raises(ApiError) as caught:
        _page(kept, before="msg_9")
    error = caught.value
    assert (error.status, error.param) == (400, "before")
    assert error.message.startswith("'before' = \"msg_9\" is no input item of response resp_1: ")
    assert "first_id" in error.message
    with pytest.raises(ApiError) as caught:  # before an item that is not past the one 'after' names
        _page(kept, order="asc", after="msg_1", before="msg_0")
    assert caught.value.param == "before"
    assert "listed past the item 'after' names" in caught.value.message


@pytest.mark.parametrize("given", ["false", "False", "FALSE", "0", ""])
def test_retrieve_takes_stream_false_however_it_is_spelt(given):
    from edgesdk.serve.response_store import retrieved

    kept = _kept(1)
    assert retrieved(kept, {"stream": [given]}) is kept.response


@pytest.mark.parametrize("given", ["true", "True", "1"])
def test_retrieve_refuses_stream_true_however_it_is_spelt(given):
    from edgesdk.serve.response_store import retrieved

    with pytest.raises(ApiError) as caught:
        retrieved(_kept(1), {"stream": [given]})
    assert (caught.value.status, caught.value.param) == (400, "stream")


# ------------------------------------------------------------------------------------------ unanswered calls
CALL = {"type": "function_call", "call_id": "call_1", "name": "get_time", "arguments": '{"city": "Oslo"}'}


@pytest.mark.parametrize("given", [
    [{"role": "user", "content": "Time in Oslo?"}, CALL, {"role": "user", "content": "And Rome?"}],
    [{"role": "user", "content": "Time in Oslo?"}, CALL],
])
def test_a_function_call_without_its_output_is_refused_as_openai_refuses_it(given):
    with pytest.raises(ApiError) as caught:
        parse_responses_request({"model": "m", "input": given})
    error = caught.value
    assert (error.status, error.param) == (400, "input")
    assert error.message.startswith("No tool output found for function call call_1 (input[1]): ")
    assert "function_call_output" in error.message
    # answered, the same conversation is taken
    answered = [*given[:2], {"type": "function_call_output", "call_id": "call_1", "output": "12:00"}, *given[2:]]
    assert parse_responses_request({"model": "m", "input": answered}).request.messages


def test_a_previous_response_s_call_needs_its_output_in_the_next_input():
    store = ResponseStore(4, 1 << 20)
    items = tuple(kept_items([{"role": "user", "content": "Time in Oslo?"}]))
    output = [{**CALL, "id": "fc_1", "status": "completed"}]
    store.put({"id": "resp_1", "status": "completed", "output": output}, items)
    with pytest.raises(ApiError) as caught:  # the agents' "No tool output found" with previous_response_id
        parse_responses_request({"model": "m", "previous_response_id": "resp_1", "input": "And Rome?"}, store)
    assert caught.value.param == "input"
    assert caught.value.message.startswith("No tool output found for function call call_1 (previous_response_id): ")
    asked = parse_responses_request({"model": "m", "previous_response_id": "resp_1",
                                     "input": [{"type": "function_call_output", "call_id": "call_1",
                                                "output": "12:00"}]}, store)
    assert [message["role"] for message in asked.request.messages][:2] == ["user", "assistant"]
