"""Responses kept by ``POST /v1/responses`` (``store``, edgesdk/serve/responses.py's ResponseStore): a chain by
``previous_response_id`` renders the prompt of the whole conversation sent at once, a tool call is answered in the
next response, ``retrieve`` / ``delete`` / ``input_items.list`` answer as OpenAI's API does, ``store: false`` keeps
nothing, the store stays within its limits and consistent under concurrent requests. The official ``openai`` client
on a real server over a tiny bundle (tests/unit/test_openai_client37.py's).
"""

from __future__ import annotations

import json
import sys
import threading

import pytest

openai = pytest.importorskip("openai")

from edgesdk.serve.completion import Completer, ServeDefaults  # noqa: E402 (after the skips)
from edgesdk.serve.response_store import ResponseStore  # noqa: E402
from edgesdk.serve.responses import parse_responses_request  # noqa: E402
from tests.unit import test_openai_client37 as shared  # noqa: E402
from tests.unit.test_serve import Served  # noqa: E402

runtime, server, client, no_whitespace = shared.runtime, shared.server, shared.client, shared.no_whitespace

QUESTION = "What time is it in Oslo?"
TIME = {"type": "function", "name": "get_time", "description": "The time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "hour24": {"type": "boolean"}},
                       "required": ["city", "hour24"], "additionalProperties": False}, "strict": True}


def _items(response) -> list[dict]:
    """A response's output items as a client sends them back in ``input``."""
    return [item.model_dump(exclude_none=True) for item in response.output]


def _prompt(served, body: dict) -> list[int]:
    """The prompt ids the server renders for a Responses request body (its kept responses looked up)."""
    completer = Completer(served.completer.runtime, ServeDefaults(max_tokens=4))
    return completer.prompt_ids(parse_responses_request(json.loads(json.dumps(body)), served.server.responses).request)


# ------------------------------------------------------------------------------------------- chains


def test_a_chain_by_previous_response_id_is_the_whole_conversation(client, server):
    first = client.responses.create(model="tiny", instructions="Be brief.", input="Hello", max_output_tokens=4)
    second = client.responses.create(model="tiny", previous_response_id=first.id, input=QUESTION,
                                     max_output_tokens=4)
    # the instructions are not carried over (OpenAI's "instructions"): the whole conversation without them
    whole = [{"role": "user", "content": "Hello"}, *_items(first), {"role": "user", "content": QUESTION}]
    stateless = client.responses.create(model="tiny", input=whole, max_output_tokens=4, store=False)
    assert second.previous_response_id == first.id
    assert second.instructions is None
    assert second.output_text == stateless.output_text
    assert second.usage.input_tokens == stateless.usage.input_tokens
    chained = {"model": "tiny", "previous_response_id": first.id, "input": QUESTION}
    assert _prompt(server, chained) == _prompt(server, {"model": "tiny", "input": whole})
    assert _prompt(server, chained) != _prompt(server, {"model": "tiny", "instructions": "Be brief.", "input": whole})

    # a third turn, with instructions of its own, streamed
    events = list(client.responses.create(model="tiny", previous_response_id=second.id,
                                          instructions="Answer in French.", max_output_tokens=4, stream=True,
                                          input=[{"role": "user",
                                                  "content": [{"type": "input_text", "text": "And Rome?"}]}]))
    third = events[-1].response  # response.incomplete: cut at 4 tokens
    whole3 = [*whole, *_items(second), {"role": "user", "content": [{"type": "input_text", "text": "And Rome?"}]}]
    stateless3 = client.responses.create(model="tiny", instructions="Answer in French.", input=whole3,
                                         max_output_tokens=4, store=False)
    assert (third.output_text, third.usage.input_tokens) == (stateless3.output_text, stateless3.usage.input_tokens)
    assert third.usage.input_tokens > second.usage.input_tokens > first.usage.input_tokens
    assert _prompt(server, {"model": "tiny", "previous_response_id": second.id, "instructions": "Answer in French.",
                            "input": "And Rome?"}) == \
        _prompt(server, {"model": "tiny", "instructions": "Answer in French.", "input": whole3})


def test_a_tool_call_is_answered_in_the_next_response(client, server, no_whitespace):
    asked = dict(model="tiny", tools=[TIME], tool_choice="required", parallel_tool_calls=False,
                 extra_body={"logit_bias": no_whitespace})
    calling = client.responses.create(input=QUESTION, **asked)
    (call,) = calling.output
    assert call.type == "function_call"
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "12:00"}
    answered = client.responses.create(model="tiny", previous_response_id=calling.id, input=[result], tools=[TIME],
                                       tool_choice="none", max_output_tokens=3)
    stateless = client.responses.create(model="tiny", input=[{"role": "user", "content": QUESTION}, *_items(calling),
                                                             result],
                                        tools=[TIME], tool_choice="none", max_output_tokens=3, store=False)
    assert [item.type for item in answered.output] == ["message"]
    assert (answered.output_text, answered.usage.input_tokens) == \
        (stateless.output_text, stateless.usage.input_tokens)
    # an output answering no call of the chain is refused as before, naming where calls were looked for
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="tiny", previous_response_id=calling.id, tools=[TIME],
                                input=[{**result, "call_id": "call_other"}], max_output_tokens=3)
    assert refused.value.param == "input[0].call_id"
    assert "previous response" in refused.value.message
    assert call.call_id in refused.value.message


def test_a_call_cut_by_the_token_limit_can_be_continued(client, no_whitespace):
    """A call cut inside its arguments is sent back as the response gave it, its arguments the model's text as
    written, as the chat route and llama-server read it (test_roundtrip51.py); it was refused with a 400."""
    asked = dict(model="tiny", input=QUESTION, tools=[TIME], tool_choice="required",
                 extra_body={"logit_bias": no_whitespace})
    whole = client.responses.create(**asked)
    for limit in range(whole.usage.output_tokens - 1, 0, -1):  # the first limit that cuts inside the arguments
        cut = client.responses.create(**asked, max_output_tokens=limit)
        if cut.output[0].type == "function_call" and cut.output[0].arguments != whole.output[0].arguments:
            break
    assert (cut.status, cut.output[0].type) == ("incomplete", "function_call")
    assert whole.output[0].arguments.startswith(cut.output[0].arguments)
    result = {"type": "function_call_output", "call_id": cut.output[0].call_id, "output": "12:00"}
    chained = client.responses.create(model="tiny", previous_response_id=cut.id, max_output_tokens=2, input=[result])
    stateless = client.responses.create(model="tiny", max_output_tokens=2, store=False,
                                        input=[{"role": "user", "content": QUESTION}, *_items(cut), result])
    assert chained.usage.input_tokens == stateless.usage.input_tokens


# ------------------------------------------------------------------------------------------- the routes


def test_retrieve_delete_and_list_input_items(client, server):
    first = client.responses.create(model="tiny", input="Hello", max_output_tokens=3, metadata={"turn": "1"})
    second = client.responses.create(model="tiny", previous_response_id=first.id, max_output_tokens=3,
                                     input=[{"role": "developer", "content": "Be brief."},
                                            {"role": "user", "content": QUESTION}])
    assert client.responses.retrieve(second.id).model_dump() == second.model_dump()
    assert client.responses.retrieve(first.id).metadata == {"turn": "1"}

    # the input items: the first response's input and output, then the second's input; the last first by default
    page = client.responses.input_items.list(second.id)
    listed = page.data
    assert [(item.type, getattr(item, "role", None)) for item in listed] == \
        [("message", "user"), ("message", "developer"), ("message", "assistant"), ("message", "user")]
    assert listed[2].id == first.output[0].id
    assert listed[2].content[0].text == first.output_text
    assert [part.text for part in listed[0].content] == [QUESTION]
    assert [part.text for part in listed[3].content] == ["Hello"]
    assert len({item.id for item in listed}) == 4
    assert all(item.id for item in listed)
    assert (page.has_more, page.first_id, page.last_id) == (False, listed[0].id, listed[-1].id)
    ascending = [item.id for item in reversed(listed)]
    # pagination: one item a page, the client following 'after' through has_more
    one = client.responses.input_items.list(second.id, limit=1, order="asc")
    assert ([item.id for item in one.data], one.has_more) == (ascending[:1], True)
    assert [item.id for item in client.responses.input_items.list(second.id, limit=1, order="asc")] == ascending
    assert [item.id for item in client.responses.input_items.list(second.id, limit=3)] == ascending[::-1]
    rest = client.responses.input_items.list(second.id, order="asc", after=ascending[1], limit=1)
    assert ([item.id for item in rest.data], rest.has_more) == ([ascending[2]], True)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.input_items.list(second.id, limit=101)
    assert refused.value.param == "limit"
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.input_items.list(second.id, after="msg_none")
    assert refused.value.param == "after"

    status, _, payload = server.request("DELETE", f"/v1/responses/{second.id}")
    assert (status, json.loads(payload)) == (200, {"id": second.id, "object": "response", "deleted": True})
    for gone in (lambda: client.responses.retrieve(second.id), lambda: client.responses.delete(second.id),
                 lambda: client.responses.input_items.list(second.id)):
        with pytest.raises(openai.NotFoundError) as missing:
            gone()
        assert f"Response with id '{second.id}' not found" in missing.value.message
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model="tiny", previous_response_id=second.id, input="Go on", max_output_tokens=2)
    assert (missing.value.param, missing.value.code) == ("previous_response_id", "previous_response_not_found")
    assert missing.value.body["message"].startswith(f"Previous response with id '{second.id}' not found. ")
    assert "send the whole conversation in 'input'" in missing.value.message
    client.responses.delete(first.id)  # the client's delete (no body read)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


def test_a_streamed_response_is_kept_as_its_last_event_gave_it(client, server):
    status, _, payload = server.request("POST", "/v1/responses", {"model": "tiny", "input": QUESTION,
                                                                   "max_output_tokens": 3, "stream": True})
    assert status == 200
    last = json.loads(payload.decode().rstrip("\n").split("\n\n")[-1].split("data: ", 1)[1])
    assert last["type"] == "response.incomplete"
    status, _, kept = server.request("GET", f"/v1/responses/{last['response']['id']}")
    assert (status, json.loads(kept)) == (200, last["response"])


def test_store_false_keeps_nothing(client, server):
    answered = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(answered.id)
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model="tiny", previous_response_id=answered.id, input="Go on", max_output_tokens=2)
    assert "'store': false" in missing.value.message
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="tiny", input=QUESTION, max_output_tokens=2, store="no")
    assert refused.value.param == "store"


def test_the_kept_responses_routes_take_the_api_key_and_their_methods(runtime):
    guarded = Served(runtime, ServeDefaults(max_tokens=2), api_key="s3cret")
    key = {"Authorization": "Bearer s3cret"}
    try:
        status, body = guarded.post("/v1/responses", {"model": "m", "input": "hi"}, headers=key)
        ident = body["id"]
        for method, path in (("GET", f"/v1/responses/{ident}"), ("GET", f"/v1/responses/{ident}/input_items"),
                             ("DELETE", f"/v1/responses/{ident}")):
            status, _, payload = guarded.request(method, path)
            assert (status, json.loads(payload)["error"]["code"]) == (401, "invalid_api_key")
        status, _, payload = guarded.request("GET", f"/responses/{ident}/input_items", headers=key)  # no /v1 too
        assert (status, len(json.loads(payload)["data"])) == (200, 1)
        status, headers, _ = guarded.request("POST", f"/v1/responses/{ident}", {"x": 1}, headers=key)
        assert (status, headers["Allow"]) == (405, "GET, HEAD, DELETE")
        status, headers, _ = guarded.request("DELETE", "/v1/responses", headers=key)
        assert (status, headers["Allow"]) == (405, "POST")
        status, headers, _ = guarded.request("DELETE", f"/v1/responses/{ident}/input_items", headers=key)
        assert (status, headers["Allow"]) == (405, "GET, HEAD")
        status, _, payload = guarded.request("DELETE", "/v1/nothing", headers=key)
        assert (status, json.loads(payload)["error"]["code"]) == (404, "not_found")
        status, _, payload = guarded.request("GET", f"/v1/responses/{ident}?stream=true", headers=key)
        assert (status, json.loads(payload)["error"]["param"]) == (400, "stream")
    finally:
        guarded.close()


# ------------------------------------------------------------------------------------------- limits


def test_the_oldest_responses_go_first_past_the_count(runtime):
    with pytest.raises(ValueError, match="responses_kept must be a whole number >= 0"):
        ServeDefaults(responses_kept=-1)
    served = Served(runtime, ServeDefaults(max_tokens=2, responses_kept=2))
    try:
        made = [served.post("/v1/responses", {"model": "m", "input": f"turn {n}"})[1]["id"] for n in range(3)]
        assert [served.request("GET", f"/v1/responses/{ident}")[0] for ident in made] == [404, 200, 200]
        served.request("GET", f"/v1/responses/{made[1]}")  # used: now the most recent
        newest = served.post("/v1/responses", {"model": "m", "input": "turn 3"})[1]["id"]
        assert [served.request("GET", f"/v1/responses/{ident}")[0] for ident in (*made, newest)] == \
            [404, 200, 404, 200]
        status, body = served.post("/v1/responses", {"model": "m", "input": "go on", "previous_response_id": made[2]})
        assert (status, body["error"]["code"], body["error"]["param"]) == \
            (404, "previous_response_not_found", "previous_response_id")
    finally:
        served.close()


def test_the_oldest_responses_go_first_past_the_bytes(runtime):
    served = Served(runtime, ServeDefaults(max_tokens=2, responses_kept_bytes=6000))
    store = served.server.responses
    try:
        made = []
        for n in range(6):
            made.append(served.post("/v1/responses", {"model": "m", "input": f"turn {n}"})[1]["id"])
            count, size = store.usage()
            assert size <= 6000
        kept = [served.request("GET", f"/v1/responses/{ident}")[0] == 200 for ident in made]
        assert kept[-1]
        assert not kept[0]
        assert kept == sorted(kept)  # a run of the oldest evicted, the newest kept
        assert sum(kept) == count < 6
        # one larger than the store alone is not kept, and evicts nothing
        large = {f"key{n}": "x" * 512 for n in range(12)}  # metadata the response repeats: past 6,000 bytes
        status, body = served.post("/v1/responses", {"model": "m", "input": "hi", "metadata": large})
        assert status == 200
        assert served.request("GET", f"/v1/responses/{body['id']}")[0] == 404
        assert store.usage() == (count, size)
    finally:
        served.close()


def test_concurrent_requests_keep_the_store_consistent(runtime):
    """Requests on the server's threads create, retrieve, chain and delete at once; then the store's count and
    bytes are those of the responses it holds."""
    served = Served(runtime, ServeDefaults(max_tokens=2, responses_kept=4))
    store = served.server.responses
    failures = []

    def work(n: int) -> None:
        try:
            for turn in range(3):
                status, body = served.post("/v1/responses", {"model": "m", "input": f"worker {n} turn {turn}"})
                assert status == 200, body
                ident = body["id"]
                assert served.request("GET", f"/v1/responses/{ident}/input_items")[0] in (200, 404)
                status, _ = served.post("/v1/responses", {"model": "m", "input": "on", "previous_response_id": ident})
                assert status in (200, 404)
                if turn == 1:
                    assert served.request("DELETE", f"/v1/responses/{ident}")[0] in (200, 404)
        except Exception as exc:  # noqa: BLE001 (reported from the main thread)
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not failures, failures
        held = [store.get(ident) for ident in store.ids()]
        assert store.usage() == (len(held), sum(kept.size for kept in held))
        assert 0 < len(held) <= 4
    finally:
        served.close()


def test_the_store_s_lock_keeps_its_count_and_bytes_under_threads():
    """Many threads putting, getting and deleting at once (switching threads as often as CPython allows): the count
    and bytes stay those of the responses held, within the limits."""
    store = ResponseStore(8, 20_000)
    responses = [{"id": f"resp_{n}", "object": "response", "output": [], "text": "x" * (n % 7 * 300)}
                 for n in range(64)]
    failures = []

    def work(offset: int) -> None:
        try:
            for round_ in range(600):
                response = responses[(offset * 7 + round_) % len(responses)]
                store.put(response, ({"id": f"msg_{round_}", "type": "message"},))
                store.get(responses[(offset + round_ * 3) % len(responses)]["id"])
                if round_ % 5 == 0:
                    store.delete(responses[(offset * 11 + round_) % len(responses)]["id"])
        except Exception as exc:  # noqa: BLE001 (reported from the main thread)
            failures.append(exc)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        sys.setswitchinterval(interval)
    assert not failures, failures
    held = [store.get(ident) for ident in store.ids()]
    count, size = store.usage()
    assert (count, size) == (len(held), sum(kept.size for kept in held))
    assert count <= 8
    assert size <= 20_000
