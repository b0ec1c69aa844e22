"""``POST /v1/responses`` and its kept responses (edgesdk/serve/responses.py) where its parts meet: the input items a
response keeps are read back by the openai client and paged by their ids, errors raised while answering name the
Responses field, the settings a response repeats are the client's types strictly. The official ``openai`` client and
raw HTTP on a real server over a tiny bundle (tests/unit/test_openai_client37.py's).
"""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("pydantic")

from openai.types.responses.response_item_list import ResponseItemList  # noqa: E402 (after the skips)

from edgesdk.serve.completion import ServeDefaults  # noqa: E402
from tests.unit import test_openai_client37 as shared  # noqa: E402
from tests.unit.test_serve import Served  # noqa: E402
from tests.unit.test_serve_responses_strict38 import _extras, strict_response  # noqa: E402

runtime, server, client = shared.runtime, shared.server, shared.client

TOOL = {"type": "function", "name": "get_time", "description": "The time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def _strict_items(server, ident: str, query: str = "") -> ResponseItemList:
    """``GET /v1/responses/{id}/input_items`` as the client's ``ResponseItemList``, strictly."""
    status, _, payload = server.request("GET", f"/v1/responses/{ident}/input_items{query}")
    assert status == 200, payload
    listed = ResponseItemList.model_validate_json(payload, strict=True)
    assert _extras(listed) == []
    return listed


def _error(server, path: str, body: dict) -> tuple[int, dict]:
    status, payload = server.post(path, body)
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    return status, payload["error"]


# ------------------------------------------------------------------------------------------- input items' ids


def test_input_items_limit_in_digits_other_than_ascii_is_a_400(server):
    ident = server.post("/v1/responses", {"input": "Hello", "max_output_tokens": 1})[1]["id"]
    for limit in ("%C2%B2", "%D9%A3"):  # '²' (str.isdigit, which int() refuses), an Arabic-Indic 3
        status, _, payload = server.request("GET", f"/v1/responses/{ident}/input_items?limit={limit}")
        error = json.loads(payload)["error"]
        assert (status, error["param"]) == (400, "limit"), payload
        assert "whole number from 1 to 100" in error["message"]


def test_an_item_id_that_is_no_string_is_refused_naming_it(server):
    for ident in (123, ["msg_1"], {"id": "msg_1"}):
        status, error = _error(server, "/v1/responses", {"input": [{"role": "user", "content": "hi", "id": ident}],
                                                         "max_output_tokens": 1})
        assert (status, error["param"]) == (400, "input[0].id")
        assert "must be a string" in error["message"]


def test_a_repeated_item_id_is_refused_as_openai_refuses_it(client, server):
    twice = [{"role": "user", "content": "a", "id": "msg_a"}, {"role": "user", "content": "b", "id": "msg_a"}]
    status, error = _error(server, "/v1/responses", {"input": twice, "max_output_tokens": 1})
    assert (status, error["param"]) == (400, "input[1].id")
    assert error["message"].startswith("Duplicate item found with id 'msg_a'")
    first = client.responses.create(model="tiny", input="Hello", max_output_tokens=2)
    said = first.output[0].model_dump(exclude_none=True)
    again = ([said, {"role": "user", "content": "and?"}],  # the previous output sent back as well
             [{"type": "item_reference", "id": first.output[0].id}, {"role": "user", "content": "and?"}])
    for given in again:
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model="tiny", previous_response_id=first.id, input=given, max_output_tokens=2)
        assert refused.value.param == "input[0].id"
        assert refused.value.body["message"].startswith(f"Duplicate item found with id '{first.output[0].id}'")
        with pytest.raises(openai.BadRequestError):
            client.responses.input_tokens.count(model="tiny", previous_response_id=first.id, input=given)
    # the same items without the chain are a conversation of their own, paged to its end one item at a time
    whole = client.responses.create(model="tiny", input=[{"role": "user", "content": "Hello"}, said,
                                                         {"role": "user", "content": "and?"}], max_output_tokens=2)
    paged = list(client.responses.input_items.list(whole.id, limit=1, order="asc"))
    assert [item.id for item in paged][1] == first.output[0].id
    assert len(paged) == 3


def test_a_reasoning_item_sent_back_reads_back_in_the_input_items(server):
    reasoning = {"type": "reasoning", "id": "rs_1"}  # no summary: kept with an empty one, as the client reads it
    status, answered = server.post("/v1/responses", {"input": [{"role": "user", "content": "hi"}, reasoning,
                                                                {"role": "user", "content": "and?"}],
                                                      "max_output_tokens": 1})
    assert status == 200, answered
    listed = _strict_items(server, answered["id"], "?order=asc")
    assert (listed.data[1].type, listed.data[1].id, listed.data[1].summary) == ("reasoning", "rs_1", [])
    for field, value in (("summary", True), ("summary", [{"type": "summary_text", "text": 1}]),
                         ("content", [{"type": "output_text", "text": "x"}]), ("encrypted_content", 5)):
        status, error = _error(server, "/v1/responses", {"input": [{"role": "user", "content": "hi"},
                                                                   {**reasoning, field: value}],
                                                         "max_output_tokens": 1})
        assert (status, error["param"]) == (400, f"input[1].{field}")


@pytest.mark.parametrize("given", [
    [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}],
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": [{"type": "input_text", "text": "x"}]},
     {"role": "user", "content": [{"type": "input_text", "text": "q", "cache": True}]}],
    [{"role": "user", "content": "q"}, {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
     {"type": "function_call_output", "call_id": "c", "output": [{"type": "output_text", "text": "r"}]}]])
def test_text_parts_are_kept_as_the_client_reads_them_for_their_role(server, given):
    status, answered = server.post("/v1/responses", {"input": given, "max_output_tokens": 1})
    assert status == 200, answered
    listed = _strict_items(server, answered["id"], "?order=asc")
    for item, sent in zip(listed.data, given, strict=True):
        if item.type == "message":
            expected = "output_text" if item.role == "assistant" else "input_text"
            assert [part.type for part in item.content] == [expected] * len(item.content)
            texts = [sent["content"]] if isinstance(sent["content"], str) else [part["text"] for part in sent["content"]]
            assert [part.text for part in item.content] == texts


# ------------------------------------------------------------------------------------------- errors while answering


def test_a_prompt_past_the_context_names_input(client, server):
    long = "fox " * 3000
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="tiny", input=long, max_output_tokens=1)
    assert (refused.value.param, refused.value.code) == ("input", "context_length_exceeded")
    status, error = _error(server, "/v1/responses", {"input": long, "stream": True})
    assert (status, error["param"], error["code"]) == (400, "input", "context_length_exceeded")


def test_a_conversation_the_answer_cannot_go_on_from_names_input(server):
    # the input ends with the assistant's turn, which the answer continues, while tools shape the answer
    body = {"input": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "It is"}],
            "tools": [TOOL], "max_output_tokens": 1}
    for path, extra in (("/v1/responses", {}), ("/v1/responses", {"stream": True}),
                        ("/v1/responses/input_tokens", {})):
        status, error = _error(server, path, {**body, **extra})
        assert (status, error["param"]) == (400, "input"), (path, extra, error)
        assert "'tools'" in error["message"]


# ------------------------------------------------------------------------------------------- what a response repeats


@pytest.mark.parametrize("fields", [{"max_output_tokens": 2.0}, {"reasoning": {"effort": "low", "mode": "deep"}},
                                    {"text": {"format": {"type": "text", "strict": True}, "verbosity": "low",
                                              "other": 1}},
                                    {"text": {"format": {"type": "json_schema", "name": "reading", "strict": False,
                                                         "schema": {"type": "object"}, "extra": "x"}}},
                                    {"tools": [TOOL], "tool_choice": {"type": "function", "name": "get_time",
                                                                      "function": {"name": "get_time"}}}])
def test_the_settings_a_response_repeats_are_the_client_s_types_strictly(server, fields):
    status, answered = server.post("/v1/responses", {"input": "hi", "max_output_tokens": 1, **fields})
    assert status == 200, answered
    response = strict_response(answered)
    if "max_output_tokens" in fields:
        assert response.max_output_tokens == 2
    if "reasoning" in fields:
        assert answered["reasoning"] == {"effort": "low"}


def test_an_item_of_an_evicted_response_is_a_404_naming_the_reference(runtime):
    served = Served(runtime, ServeDefaults(max_tokens=2, responses_kept=2))
    try:
        first = served.post("/v1/responses", {"input": "Hello"})[1]
        for text in ("one", "two"):
            assert served.post("/v1/responses", {"input": text})[0] == 200
        assert first["id"] not in served.server.responses.ids()
        status, error = _error(served, "/v1/responses", {"input": [{"role": "user", "content": "hi"}, {
            "type": "item_reference", "id": first["output"][0]["id"]}]})
        assert (status, error["param"]) == (404, "input[1].id")
    finally:
        served.close()


def test_a_chain_on_a_streamed_reasoning_answer_reads_back_strictly(terse):
    from tests.unit.test_serve_responses_strict38 import events_of, strict_events

    first = strict_events(events_of(terse, {"model": "m", "input": "Think.", "max_output_tokens": 10}))
    assert first.output[0].type == "reasoning"
    status, second = terse.post("/v1/responses", {"model": "m", "previous_response_id": first.id, "input": "And?",
                                                  "max_output_tokens": 4})
    assert status == 200, second
    strict_response(second)
    status, whole = terse.post("/v1/responses", {"model": "m", "store": False, "max_output_tokens": 4, "input": [
        {"role": "user", "content": "Think."}, *[item.model_dump(exclude_none=True) for item in first.output],
        {"role": "user", "content": "And?"}]})
    assert (second["usage"]["input_tokens"], second["output"][-1]) == \
        (whole["usage"]["input_tokens"], {**whole["output"][-1], "id": second["output"][-1]["id"]})
    listed = _strict_items(terse, second["id"], "?order=asc")
    assert [item.type for item in listed.data] == ["message", *[item.type for item in first.output], "message"]


def test_one_previous_response_continued_by_requests_at_once(client):
    """Four requests (two streamed) continue the same response at once: each is its own chain, none sees another's
    turn, and the response they continue is unchanged."""
    import threading

    first = client.responses.create(model="tiny", input="Hello", max_output_tokens=3)
    answered, failures = {}, []

    def turn(text: str, stream: bool) -> None:
        try:
            asked = dict(model="tiny", previous_response_id=first.id, input=text, max_output_tokens=3)
            answered[text] = list(client.responses.create(**asked, stream=True))[-1].response if stream else \
                client.responses.create(**asked)
        except Exception as exc:  # noqa: BLE001 (reported from the main thread)
            failures.append(exc)

    threads = [threading.Thread(target=turn, args=(f"turn {n}", n % 2 == 0)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures
    said = [item.model_dump(exclude_none=True) for item in first.output]
    for text, response in answered.items():
        listed = client.responses.input_items.list(response.id, order="asc").data
        assert [item.id for item in listed[1:-1]] == [item.id for item in first.output]
        assert listed[-1].content[0].text == text
        alone = client.responses.create(model="tiny", input=[{"role": "user", "content": "Hello"}, *said,
                                                             {"role": "user", "content": text}],
                                        max_output_tokens=3, store=False)
        assert (response.output_text, response.usage.input_tokens) == (alone.output_text, alone.usage.input_tokens)
    assert client.responses.retrieve(first.id) == first
