"""The rest of the Responses API's surface on ``edgesdk serve`` (edgesdk/serve/responses.py), through the official
``openai`` client on a real server over a tiny bundle (tests/unit/test_openai_client37.py's):
``responses.input_tokens.count`` (``POST /v1/responses/input_tokens``) is the answer's ``usage.input_tokens``,
``item_reference`` input items stand for kept items, a streamed response is kept ``in_progress`` while it runs, and
``responses.cancel`` is refused (OpenAI cancels only background responses).
"""

from __future__ import annotations

import json
import threading

import pytest

openai = pytest.importorskip("openai")

from edgesdk.serve.completion import Completer, ServeDefaults  # noqa: E402 (after the skips)
from edgesdk.serve.responses import parse_responses_request  # noqa: E402
from tests.unit import test_openai_client37 as shared  # noqa: E402
from tests.unit.test_serve import Served  # noqa: E402

runtime, server, client, no_whitespace = shared.runtime, shared.server, shared.client, shared.no_whitespace

QUESTION = "What time is it in Oslo?"
TIME = {"type": "function", "name": "get_time", "description": "The time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                       "additionalProperties": False}, "strict": True}


def _items(response) -> list[dict]:
    """A response's output items as a client sends them back in ``input``."""
    return [item.model_dump(exclude_none=True) for item in response.output]


def _count(client, **body) -> int:
    counted = client.responses.input_tokens.count(**body)
    assert counted.object == "response.input_tokens"
    return counted.input_tokens


# ------------------------------------------------------------------------------------------- input token counts


def test_the_count_is_the_answer_s_input_tokens(client, server):
    asked = dict(model="tiny", instructions="Be brief.", input=QUESTION, tools=[TIME])
    assert _count(client, **asked) == client.responses.create(**asked, max_output_tokens=2).usage.input_tokens
    answered = client.responses.create(model="tiny", instructions="Be brief.", input=QUESTION, max_output_tokens=2)
    # the tools and the instructions are in the prompt counted
    assert _count(client, model="tiny", input=QUESTION) < _count(client, model="tiny", input=QUESTION, tools=[TIME])
    assert _count(client, model="tiny", input=QUESTION) < _count(client, model="tiny", input=QUESTION,
                                                                 instructions="Be brief.")
    # a chain by previous_response_id: the whole conversation's prompt, the previous instructions left out
    chained = dict(model="tiny", previous_response_id=answered.id, input="And in Rome?")
    assert _count(client, **chained) == client.responses.create(**chained, max_output_tokens=2).usage.input_tokens
    # the route answers without /v1 too, and without 'model' (optional in the client's count)
    assert server.post("/responses/input_tokens", {"input": QUESTION}) == \
        (200, {"object": "response.input_tokens", "input_tokens": _count(client, model="tiny", input=QUESTION)})


def test_a_prompt_past_the_context_is_counted(client, server):
    long = "word " * 3000  # past the bundle's 2,048 tokens
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="tiny", input=long, max_output_tokens=2)
    assert refused.value.code == "context_length_exceeded"
    completer = Completer(server.completer.runtime, ServeDefaults(max_tokens=4))
    rendered = completer.chat_text(parse_responses_request({"input": long}).request)
    counted = _count(client, model="tiny", input=long)
    assert counted == len(completer.runtime.tokenizer.encode(rendered, add_special_tokens=False))
    assert counted > 2048


def test_a_bad_count_request_is_refused_as_the_answer_would_be(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.input_tokens.count(model="tiny", input=[])
    assert refused.value.param == "input"
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.input_tokens.count(model="tiny", input=QUESTION, tool_choice="required")
    assert refused.value.param == "tool_choice"
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.input_tokens.count(model="tiny", input=QUESTION, previous_response_id="resp_none")
    assert (missing.value.param, missing.value.code) == ("previous_response_id", "previous_response_not_found")


def test_the_count_route_takes_the_api_key_and_get_is_an_unknown_response(runtime):
    guarded = Served(runtime, ServeDefaults(max_tokens=2), api_key="s3cret")
    key = {"Authorization": "Bearer s3cret"}
    try:
        status, body = guarded.post("/v1/responses/input_tokens", {"input": "hi"})
        assert (status, body["error"]["code"]) == (401, "invalid_api_key")
        status, body = guarded.post("/v1/responses/input_tokens", {"input": "hi"}, headers=key)
        assert status == 200
        assert body["input_tokens"] > 0
        # GET reads it as a response's id, which no response has (as retrieving any unknown id answers)
        status, _, payload = guarded.request("GET", "/v1/responses/input_tokens", headers=key)
        assert (status, json.loads(payload)["error"]["code"]) == (404, "not_found")
        assert "Response with id 'input_tokens' not found" in json.loads(payload)["error"]["message"]
    finally:
        guarded.close()


# ------------------------------------------------------------------------------------------- item references


def test_item_references_stand_for_kept_items(client):
    first = client.responses.create(model="tiny", input="Hello", max_output_tokens=3)
    (said,) = client.responses.input_items.list(first.id).data  # the input item, with the id the list gives it
    referenced = [{"type": "item_reference", "id": said.id}, {"id": first.output[0].id},  # 'type' is optional
                  {"role": "user", "content": QUESTION}]
    second = client.responses.create(model="tiny", input=referenced, max_output_tokens=3)
    whole = [{"role": "user", "content": "Hello"}, *_items(first), {"role": "user", "content": QUESTION}]
    stateless = client.responses.create(model="tiny", input=whole, max_output_tokens=3, store=False)
    assert (second.output_text, second.usage.input_tokens) == (stateless.output_text, stateless.usage.input_tokens)
    assert _count(client, model="tiny", input=referenced) == second.usage.input_tokens
    # the new response's input items are the items themselves, with their ids
    listed = client.responses.input_items.list(second.id, order="asc").data
    assert [item.id for item in listed[:2]] == [said.id, first.output[0].id]
    assert listed[1].content[0].text == first.output_text
    assert (listed[2].role, listed[2].content[0].text) == ("user", QUESTION)


def test_a_referenced_call_is_answered(client, no_whitespace):
    calling = client.responses.create(model="tiny", input=QUESTION, tools=[TIME], tool_choice="required",
                                      parallel_tool_calls=False, extra_body={"logit_bias": no_whitespace})
    (call,) = calling.output
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "12:00"}
    answered = client.responses.create(model="tiny", tools=[TIME], tool_choice="none", max_output_tokens=3,
                                       input=[{"role": "user", "content": QUESTION},
                                              {"type": "item_reference", "id": call.id}, result])
    stateless = client.responses.create(model="tiny", tools=[TIME], tool_choice="none", max_output_tokens=3,
                                        input=[{"role": "user", "content": QUESTION}, *_items(calling), result],
                                        store=False)
    assert (answered.output_text, answered.usage.input_tokens) == \
        (stateless.output_text, stateless.usage.input_tokens)


def test_an_item_kept_nowhere_is_a_404_naming_the_reference(client):
    unkept = client.responses.create(model="tiny", input="Hello", max_output_tokens=2, store=False)
    deleted = client.responses.create(model="tiny", input="Hello", max_output_tokens=2)
    client.responses.delete(deleted.id)
    for ident in ("msg_none", unkept.output[0].id, deleted.output[0].id):
        with pytest.raises(openai.NotFoundError) as missing:
            client.responses.create(model="tiny", max_output_tokens=2,
                                    input=[{"role": "user", "content": "hi"}, {"type": "item_reference", "id": ident}])
        assert missing.value.param == "input[1].id"
        assert missing.value.body["message"].startswith(f"Item with id '{ident}' not found. ")
        assert "'store': false" in missing.value.message
        with pytest.raises(openai.NotFoundError):
            client.responses.input_tokens.count(model="tiny", input=[{"type": "item_reference", "id": ident}])
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="tiny", input=[{"type": "item_reference", "id": 7}], max_output_tokens=2)
    assert refused.value.param == "input[0].id"
    assert "got 7" in refused.value.message


# ------------------------------------------------------------------------------------------- a stream under way


class Hold:
    """A StepHook (the thermal guard's interface) that holds the answer before its first step, as a thermal pause
    does, until ``go`` is set: the stream's first events are out, its end is not."""

    def __init__(self):
        self.go = threading.Event()

    def begin(self, prompt_tokens, max_new_tokens):
        pass

    def before_step(self, kind):
        assert self.go.wait(60), "the test never let the answer go on"
        return 0.0

    def after_step(self, kind, tokens, compute_s):
        pass

    def end(self, stats):
        pass


@pytest.fixture
def held(runtime):
    hold = Hold()
    served = Served(runtime, ServeDefaults(max_tokens=3), hook=hold)
    try:
        with shared._client(served.port) as client:
            yield hold, served, client
    finally:
        hold.go.set()
        served.close()


def test_a_streamed_response_is_in_progress_while_it_streams(held):
    hold, _, client = held
    events = iter(client.responses.create(model="tiny", instructions="Be brief.", input=QUESTION, stream=True))
    created = next(events)
    assert created.type == "response.created"
    ident = created.response.id
    running = client.responses.retrieve(ident)
    assert running.model_dump() == created.response.model_dump()
    assert (running.status, running.output, running.usage) == ("in_progress", [], None)
    assert [item.content[0].text for item in client.responses.input_items.list(ident).data] == [QUESTION]
    for refused_call in (lambda: client.responses.create(model="tiny", previous_response_id=ident, input="Go on"),
                         lambda: client.responses.input_tokens.count(previous_response_id=ident, input="Go on")):
        with pytest.raises(openai.BadRequestError) as refused:
            refused_call()
        assert refused.value.param == "previous_response_id"
        assert "still in progress" in refused.value.message
    assert _count(client, input=QUESTION) > 0  # a count takes no turn: it is answered while the answer is held
    hold.go.set()
    finished = list(events)[-1].response
    assert finished.status == "incomplete"
    assert client.responses.retrieve(ident).model_dump() == finished.model_dump()
    chained = client.responses.create(model="tiny", previous_response_id=ident, input="Go on", max_output_tokens=2)
    assert chained.previous_response_id == ident


def test_a_response_deleted_while_it_streams_is_not_kept_when_it_ends(held):
    hold, served, client = held
    events = iter(client.responses.create(model="tiny", input=QUESTION, stream=True))
    ident = next(events).response.id
    status, _, payload = served.request("DELETE", f"/v1/responses/{ident}")
    assert (status, json.loads(payload)) == (200, {"id": ident, "object": "response", "deleted": True})
    hold.go.set()
    assert list(events)[-1].type == "response.incomplete"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(ident)


def test_a_stream_that_ends_in_an_error_keeps_nothing(held):
    hold, served, client = held
    stream = client.responses.create(model="tiny", input=QUESTION, stream=True)
    events = iter(stream)
    ident = next(events).response.id
    assert client.responses.retrieve(ident).status == "in_progress"
    served.server.completer.stop()  # as edgesdk serve does on SIGTERM: the answer ends at its next token
    hold.go.set()
    last = list(events)[-1]  # OpenAI's error event, which the client yields
    assert (last.type, last.code) == ("error", "server_stopping")
    with pytest.raises(openai.NotFoundError):  # the kept routes answer while the server stops
        client.responses.retrieve(ident)
    assert served.server.responses.usage() == (0, 0)


def test_a_stream_whose_client_leaves_keeps_nothing(held):
    hold, served, client = held
    # room for many tokens: the answer goes on until the server sees the connection closed
    stream = client.responses.create(model="tiny", input=QUESTION, stream=True, max_output_tokens=200)
    ident = next(iter(stream)).response.id
    stream.close()
    hold.go.set()
    assert served.server.stop_answers(60)  # every answer written (or given up): the handler has ended
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(ident)
    assert served.server.responses.usage() == (0, 0)


# ------------------------------------------------------------------------------------------- cancel


def test_cancel_is_refused_no_response_being_a_background_one(client, server):
    answered = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.cancel(answered.id)
    assert f"Response with id '{answered.id}' cannot be cancelled" in refused.value.message
    assert "'background': true" in refused.value.message
    assert client.responses.retrieve(answered.id).model_dump() == answered.model_dump()  # kept as it was
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.cancel("resp_none")
    assert "Response with id 'resp_none' not found" in missing.value.message
    status, headers, _ = server.request("GET", f"/v1/responses/{answered.id}/cancel")
    assert (status, headers["Allow"]) == (405, "POST")
