"""``POST /v1/responses`` (edgesdk/serve/responses.py) held to the openai client's own types, strictly: every whole
response and every streamed event validates with ``strict=True`` against ``Response`` and the ``ResponseStreamEvent``
union with no field the types do not know, the events are numbered from 0 without a gap, name the items they build
consistently and assemble into the whole response; the output text's log-probabilities (``include``
``"message.output_text.logprobs"``, ``top_logprobs``) are the chat route's; what the client could not parse back is
refused, naming the field.

The tiny model writes whitespace when left alone, so requests whose answer must come out whole (a tool call) ban the
vocabulary's whitespace tokens with ``logit_bias``, as tests/unit/test_openai_client37.py does.
"""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")

from openai.types.responses import Response, ResponseStreamEvent  # noqa: E402 (after the skips)

from edgesdk.serve.api import TextOffsets, parse_chat_request  # noqa: E402
from edgesdk.serve.completion import Completer, Completion, ServeDefaults  # noqa: E402
from edgesdk.serve.reasoning import ReasoningSplitter  # noqa: E402
from edgesdk.serve.response_events import Output  # noqa: E402
from edgesdk.serve.responses import parse_responses_request  # noqa: E402
from tests.unit import test_openai_client37 as shared  # noqa: E402

runtime, server, client, no_whitespace = shared.runtime, shared.server, shared.client, shared.no_whitespace

QUESTION = "What time is it in Oslo?"
TIME = {"type": "function", "name": "get_time", "description": "The time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                       "additionalProperties": False}, "strict": True}
LOGPROBS = ["message.output_text.logprobs"]
EVENT = pydantic.TypeAdapter(ResponseStreamEvent)


def _extras(value, where: str = "$") -> list[str]:
    """The fields of a validated value that its openai type does not declare (the client's models keep them)."""
    found = []
    if isinstance(value, pydantic.BaseModel):
        found += [f"{where}.{name}" for name in value.model_extra or {}]
        for name in type(value).model_fields:
            found += _extras(getattr(value, name), f"{where}.{name}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _extras(item, f"{where}[{index}]")
    return found


def strict_response(body: dict) -> Response:
    """A response's JSON as the client's ``Response``, strictly, with nothing it does not know."""
    response = Response.model_validate_json(json.dumps(body), strict=True)
    assert _extras(response) == []
    return response


def strict_events(events: list[tuple[str, dict]]) -> Response:
    """A stream's events checked against the client's event union and against each other; its final response."""
    for name, data in events:
        extras = _extras(EVENT.validate_json(json.dumps(data), strict=True))
        # the function's name, which OpenAI's API sends on this event and the client's type may not declare
        known = ["$.name"] if name == "response.function_call_arguments.done" else []
        assert [extra for extra in extras if extra not in known] == [], name
        assert name == data["type"]
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    (_, created), (_, progress) = events[:2]
    assert (created["type"], progress["type"]) == ("response.created", "response.in_progress")
    for start in (created, progress):
        assert (start["response"]["status"], start["response"]["output"], start["response"]["usage"]) == \
            ("in_progress", [], None)
    name, last = events[-1]
    assert name in ("response.completed", "response.incomplete")
    final = last["response"]
    assert final["id"] == created["response"]["id"]
    added, done, parts, texts, arguments = {}, {}, {}, {}, {}
    for name, data in events[2:-1]:
        index = data["output_index"]
        if name == "response.output_item.added":
            assert index == len(added)
            assert index not in done
            added[index] = data["item"]
            continue
        item = added[index]
        assert index not in done, name  # nothing after the item's done event
        if name == "response.output_item.done":
            assert data["item"]["id"] == item["id"]
            done[index] = data["item"]
            continue
        assert data["item_id"] == item["id"], name
        if name == "response.content_part.added":
            assert data["content_index"] == len(parts.setdefault(index, []))
            parts[index].append(data["part"])
        elif name in ("response.function_call_arguments.delta", "response.function_call_arguments.done"):
            assert item["type"] == "function_call"
            if name.endswith("delta"):
                arguments[index] = arguments.get(index, "") + data["delta"]
            else:
                assert data["arguments"] == arguments[index] == done.get(index, {}).get("arguments", data["arguments"])
        else:
            assert data["content_index"] < len(parts[index]), name
            key = (index, data["content_index"])
            if name.endswith(".delta"):
                texts[key] = texts.get(key, "") + data["delta"]
            elif name.endswith("text.done"):
                assert data["text"] == texts.get(key, "")
    assert sorted(added) == sorted(done) == list(range(len(final["output"])))
    assert [done[index] for index in sorted(done)] == final["output"]
    for (index, content), text in texts.items():
        assert final["output"][index]["content"][content]["text"] == text
    return strict_response(final)


def events_of(server, body: dict) -> list[tuple[str, dict]]:
    status, headers, payload = server.request("POST", "/v1/responses", {**body, "stream": True})
    assert status == 200, payload
    assert headers["Content-Type"] == "text/event-stream"
    events = []
    for block in payload.decode().split("\n\n"):
        if block:
            name, data = block.split("\n", 1)
            events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def _without_ids(body: dict) -> dict:
    body = json.loads(json.dumps(body))
    for field in ("id", "created_at", "completed_at"):
        body.pop(field)
    body["usage"]["input_tokens_details"].pop("cached_tokens")  # the second request finds its prompt cached
    for item in body["output"]:
        item.pop("id")
        item.pop("call_id", None)
    return body


# ------------------------------------------------------------------------------------------- the client's types


REQUESTS = {
    "text": {"input": QUESTION, "max_output_tokens": 6},
    "stopped": {"input": QUESTION, "max_output_tokens": 6, "stop": [" "]},
    "no tools chosen": {"input": QUESTION, "max_output_tokens": 4, "tools": [TIME], "tool_choice": "none"},
    "a forced call": {"input": QUESTION, "tools": [TIME], "tool_choice": "required", "parallel_tool_calls": False},
    "json schema": {"input": QUESTION, "max_output_tokens": 4, "text": {"format": {
        "type": "json_schema", "name": "reading", "strict": True, "schema": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
            "additionalProperties": False}}}},
    "logprobs": {"input": QUESTION, "max_output_tokens": 5, "include": LOGPROBS, "top_logprobs": 3,
                 "cache_prompt": False},  # each prompt prefilled whole: the same floats whole and streamed
    "instructions and a system message": {"input": [{"role": "system", "content": "Be brief."},
                                                    {"role": "developer", "content": "One word."},
                                                    {"role": "user", "content": QUESTION}],
                                          "instructions": "You tell the time.", "max_output_tokens": 3},
    "metadata at OpenAI's limits": {"input": QUESTION, "max_output_tokens": 2,
                                    "metadata": {f"{n:02d}" + "k" * 62: "v" * 512 for n in range(16)}},
    "reasoning settings": {"input": QUESTION, "max_output_tokens": 2,
                           "reasoning": {"effort": "low", "summary": "auto"}},
}


@pytest.mark.parametrize("name", list(REQUESTS))
def test_every_response_and_event_is_the_client_s_type_strictly(server, no_whitespace, name):
    body = {"model": "tiny", **REQUESTS[name]}
    if "tools" in body or "text" in body:
        body["logit_bias"] = no_whitespace
    status, whole = server.post("/v1/responses", body)
    assert status == 200, whole
    response = strict_response(whole)
    for item in response.output:
        if item.type == "message":
            (part,) = item.content
            assert (part.annotations, isinstance(part.logprobs, list)) == ([], True)
        else:
            assert item.type == "function_call"
            assert item.status == "completed"
    assert isinstance(response.usage.input_tokens_details.cached_tokens, int)
    final = strict_events(events_of(server, body))
    assert _without_ids(final.model_dump(mode="json", exclude_unset=True)) == \
        _without_ids(response.model_dump(mode="json", exclude_unset=True))
    if name == "a forced call":
        assert [item.type for item in response.output] == ["function_call"]
    if name == "no tools chosen":
        assert [item.type for item in response.output] == ["message"]


def test_a_thinking_model_s_reasoning_item_is_the_client_s_type_strictly(terse):
    body = {"model": "m", "input": "Think.", "max_output_tokens": 10}
    status, whole = terse.post("/v1/responses", body)
    assert status == 200, whole
    (reasoning,) = strict_response(whole).output
    assert (reasoning.type, reasoning.summary, reasoning.content[0].type) == ("reasoning", [], "reasoning_text")
    strict_events(events_of(terse, body))


def test_instructions_come_before_the_input_s_system_messages_as_in_the_chat_request(runtime):
    items = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}]
    asked = parse_responses_request({"model": "m", "instructions": "You tell the time.", "input": items})
    chat = parse_chat_request({"messages": [{"role": "system", "content": "You tell the time."}, *items]})
    assert asked.request.messages == chat.messages
    completer = Completer(runtime, ServeDefaults(max_tokens=2))
    assert completer.prompt_ids(asked.request) == completer.prompt_ids(chat)


# ------------------------------------------------------------------------------------------- log-probabilities


@pytest.mark.parametrize("fields", [{}, {"tools": [TIME], "tool_choice": "none"}], ids=["plain", "tools unused"])
@pytest.mark.parametrize("top", [None, 0, 4])
def test_the_output_text_s_logprobs_are_the_chat_route_s(client, fields, top):
    """A greedy answer: the same tokens, log-probabilities and alternatives as chat's ``logprobs.content``."""
    extra = {} if top is None else {"top_logprobs": top}
    fresh = {"cache_prompt": False}  # each prompt prefilled whole: the same floats on both routes
    response = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=6, include=LOGPROBS,
                                       extra_body=fresh, **fields, **extra)
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": QUESTION}], max_completion_tokens=6, logprobs=True,
        tools=[shared_tool() for _ in fields.get("tools", [])] or openai.NOT_GIVEN,
        tool_choice=fields.get("tool_choice", openai.NOT_GIVEN), extra_body=fresh, **extra)
    (part,) = response.output[0].content
    assert part.text == chat.choices[0].message.content
    expected = [entry.model_dump() for entry in chat.choices[0].logprobs.content]
    assert [entry.model_dump() for entry in part.logprobs] == expected
    assert len(expected) == response.usage.output_tokens == 6
    assert all(len(entry["top_logprobs"]) == (top or 0) for entry in expected)
    assert response.top_logprobs == (top or 0)


def shared_tool() -> dict:
    return {"type": "function", "function": {key: TIME[key] for key in ("name", "description", "parameters")}}


def test_top_logprobs_without_include_gives_none_as_openai_s(client):
    response = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=3, top_logprobs=2)
    assert response.output[0].content[0].logprobs == []
    assert response.top_logprobs == 2


def _streamed(runtime, body: dict) -> tuple[list[tuple[str, dict]], dict]:
    """A stream's events as the server's handler writes them (each piece of text with its chat logprobs), and
    the same request's whole response, on a real completer."""
    completer = Completer(runtime, ServeDefaults(max_tokens=16))
    asked = parse_responses_request({**body, "stream": True})
    output = Output(asked, "m", 0.0, 1.0)
    events = output.start()
    completion = completer.complete(asked.request, on_text=lambda text, logprobs: events.extend(
        output.push(text, logprobs)))
    events += output.end(completion)
    whole_request = parse_responses_request(body)
    whole = Output(whole_request, "m", 0.0, 1.0).whole(completer.complete(whole_request.request))
    return events, whole


@pytest.fixture(scope="module")
def readable(runtime) -> dict[str, int]:
    """``logit_bias`` banning the tokens that are whitespace or no whole UTF-8 text: the answer is readable text."""
    tokenizer = runtime.tokenizer.tokenizer
    return {str(token): -100 for token in range(tokenizer.get_vocab_size())
            if not (text := tokenizer.decode([token])).strip() or "\ufffd" in text}


@pytest.mark.parametrize("stop", [False, True], ids=["whole", "cut by a stop string"])
def test_streamed_deltas_carry_their_tokens_logprobs_and_assemble_the_whole(runtime, readable, stop):
    body = {"model": "m", "input": QUESTION, "max_output_tokens": 12, "include": LOGPROBS, "top_logprobs": 2,
            "temperature": 1.0, "seed": 7,  # sampled (the same each time): text that does not repeat at once
            "cache_prompt": False,  # the same prefill twice: the same floats
            "logit_bias": readable}
    if stop:  # two characters first found past the answer's start, held back and cut mid-answer
        _, whole = _streamed(runtime, body)
        text = whole["output"][0]["content"][0]["text"]
        at = next(at for at in range(3, len(text) - 2) if text.find(text[at:at + 2]) == at)
        body["stop"] = [text[at:at + 2]]
    events, whole = _streamed(runtime, body)
    final = strict_events(events)
    assert _without_ids(final.model_dump(mode="json", exclude_unset=True)) == _without_ids(whole)
    (part,) = whole["output"][0]["content"]
    assert part["logprobs"]
    shaped = [{"token": entry["token"], "logprob": entry["logprob"],
               "top_logprobs": [{"token": top["token"], "logprob": top["logprob"]} for top in entry["top_logprobs"]]}
              for entry in part["logprobs"]]
    deltas = [data for name, data in events if name == "response.output_text.delta"]
    assert [entry for delta in deltas for entry in delta["logprobs"]] == shaped
    assert [data for name, data in events if name == "response.output_text.done"][0]["logprobs"] == shaped
    # a delta carries the tokens that start in the text out so far, no later one
    starts = TextOffsets()([bytes(entry["bytes"]) for entry in part["logprobs"]])
    shown = given = 0
    for delta in deltas:
        shown += len(delta["delta"])
        given += len(delta["logprobs"])
        assert all(start <= shown for start in starts[:given])
        assert given == len(starts) or starts[given] >= shown or not delta["delta"]
    assert shown == len(part["text"])


def test_a_thinking_model_s_reasoning_tokens_are_left_out_of_the_message_s_logprobs():
    """The message's logprobs are its own tokens' (those of the text after ``</think>``), streamed and whole."""
    pieces = ["The", " fox", " runs.", "</think>", "It", " jumps", "."]
    entries = [{"token": piece, "bytes": list(piece.encode()), "logprob": -float(n),
                "top_logprobs": [{"token": piece, "bytes": list(piece.encode()), "logprob": -float(n)}]}
               for n, piece in enumerate(pieces)]
    asked = parse_responses_request({"model": "m", "input": "hi", "include": LOGPROBS, "top_logprobs": 1})
    completion = Completion(text="".join(pieces), finish_reason="stop", prompt_tokens=4,
                            completion_tokens=len(pieces), logprobs={"content": entries, "refusal": None})
    streamed = Output(asked, "m", 0.0, 1.0, splitter=ReasoningSplitter(opened=True))
    events = streamed.start()
    for piece, entry in zip(pieces, entries, strict=True):
        events += streamed.push(piece, {"content": [entry], "refusal": None})
    events += streamed.end(completion)
    final = strict_events(events)
    reasoning, message = final.output
    assert reasoning.content[0].text == "The fox runs."
    assert message.content[0].text == "It jumps."
    assert [entry.model_dump() for entry in message.content[0].logprobs] == entries[4:]
    whole = Output(asked, "m", 0.0, 1.0, splitter=ReasoningSplitter(opened=True)).whole(completion)
    assert whole["output"][1]["content"][0]["logprobs"] == entries[4:]


@pytest.mark.parametrize(("fields", "param"), [
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": -1}, "top_logprobs"),
    ({"top_logprobs": "3"}, "top_logprobs"),
    ({"include": "message.output_text.logprobs"}, "include"),
])
def test_bad_logprobs_fields_are_named(client, fields, param):
    with pytest.raises(openai.BadRequestError) as refused:
        client.post("/responses", body={"model": "tiny", "input": QUESTION, **fields}, cast_to=object)
    assert refused.value.param == param
    assert param in refused.value.message


# ------------------------------------------------------------------------------------------- refusals


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}


@pytest.mark.parametrize(("fields", "param", "said"), [
    # the response repeats these; the client could not parse it back
    ({"text": {"format": {"type": "json_schema", "schema": SCHEMA}}}, "text.format.name", "text.format.name"),
    ({"text": {"format": {"type": "json_schema", "name": "a reading", "schema": SCHEMA}}}, "text.format.name",
     '"a reading"'),
    ({"text": {"format": {"type": "json_schema", "name": "r", "schema": SCHEMA, "strict": "yes"}}},
     "text.format.strict", "true or false"),
    ({"text": {"format": {"type": "json_schema", "name": "r", "schema": SCHEMA, "description": 5}}},
     "text.format.description", "must be a string"),
    ({"tools": [{**TIME, "strict": "yes"}]}, "tools[0].strict", "true or false"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort", '"extreme"'),
    ({"reasoning": {"summary": "long"}}, "reasoning.summary", "concise"),
    # a schema the constraint refuses names the schema
    ({"text": {"format": {"type": "json_schema", "name": "r", "strict": True, "schema": {
        "type": "object", "properties": {"city": {"type": "string", "pattern": "(?=O)"}}}}}}, "text.format.schema",
     "text.format.schema: $.properties.city.pattern"),
    # OpenAI's metadata limits
    ({"metadata": {str(n): "v" for n in range(17)}}, "metadata", "17 pairs"),
    ({"metadata": {"k" * 65: "v"}}, "metadata", "65 characters"),
    ({"metadata": {"note": "v" * 513}}, "metadata.note", "513 characters"),
    # a call's output needs its call
    ({"input": [{"type": "function_call_output", "call_id": "call_1", "output": "12:00"}]}, "input[0].call_id",
     '"call_1" answers no function_call'),
    ({"input": [{"role": "user", "content": QUESTION},
                {"type": "function_call_output", "call_id": "call_1", "output": "12:00"},
                {"type": "function_call", "call_id": "call_1", "name": "get_time", "arguments": "{}"}],
      "tools": [TIME]}, "input[1].call_id", "earlier"),
])
def test_what_the_client_could_not_read_back_is_refused_naming_the_field(client, fields, param, said):
    with pytest.raises(openai.BadRequestError) as refused:
        client.post("/responses", body={"model": "tiny", "input": QUESTION, **fields}, cast_to=object)
    assert refused.value.param == param
    assert said in refused.value.message
    assert refused.value.body["type"] == "invalid_request_error"
