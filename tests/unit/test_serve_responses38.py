"""OpenAI's Responses API (``POST /v1/responses``, edgesdk/serve/responses.py) on a real server over a tiny bundle,
driven by the official ``openai`` client: the answer is the chat route's for the same conversation, streamed events
assemble into the whole response, tools and structured outputs round-trip, and what this server cannot honour is a
400 naming the field.

The tiny model writes whitespace when left alone, so requests whose answer must come out whole (a tool call, a
structured output) ban the vocabulary's whitespace tokens with ``logit_bias`` (llama-server's field, read as on the
chat route), as tests/unit/test_openai_client37.py does.
"""

from __future__ import annotations

import json
import socket
import threading

import pytest

openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")

from edgesdk.serve.api import parse_chat_request  # noqa: E402 (after the skips)
from edgesdk.serve.completion import ServeDefaults  # noqa: E402
from edgesdk.serve.response_events import Output  # noqa: E402
from edgesdk.serve.responses import parse_responses_request  # noqa: E402
from tests.unit import test_openai_client37 as shared  # noqa: E402
from tests.unit.test_serve import Served  # noqa: E402
from tests.unit.test_serve_responses_strict38 import events_of  # noqa: E402

# the openai client on a real server over a tiny bundle with 2,048 tokens of context (room for the tools' description)
runtime, server, client, no_whitespace = shared.runtime, shared.server, shared.client, shared.no_whitespace

QUESTION = "What time is it in Oslo?"
TIME = {"type": "function", "name": "get_time", "description": "The time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "hour24": {"type": "boolean"}},
                       "required": ["city", "hour24"], "additionalProperties": False}, "strict": True}
CHAT_TIME = {"type": "function", "function": {key: TIME[key] for key in ("name", "description", "parameters")}}


def _chat(client, messages: list, **fields):
    return client.chat.completions.create(model="tiny", messages=messages, **fields)


def _without_ids(response) -> dict:
    """A response's output and usage with the ids each answer makes anew left out, and the prompt tokens the
    previous answer's cache held (the same request twice finds its prompt there)."""
    body = response.model_dump(exclude_none=True)
    body["usage"]["input_tokens_details"].pop("cached_tokens")
    for item in body["output"]:  # the stream helper's parsed response adds what it parsed
        item.pop("id")
        item.pop("call_id", None)
        item.pop("parsed_arguments", None)
        for part in item.get("content", []):
            part.pop("parsed", None)
    return {"output": body["output"], "usage": body["usage"], "status": body["status"]}


# ------------------------------------------------------------------------------------------- answers


def test_a_string_input_is_the_chat_answer_in_the_responses_shape(client):
    response = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=6)
    chat = _chat(client, [{"role": "user", "content": QUESTION}], max_completion_tokens=6)
    assert isinstance(response, openai.types.responses.Response)
    assert response.id.startswith("resp_")
    assert (response.object, response.model) == ("response", "tiny-host")
    assert response.output_text == chat.choices[0].message.content
    (message,) = response.output
    assert (message.type, message.role, message.id[:4]) == ("message", "assistant", "msg_")
    (part,) = message.content
    assert (part.type, part.annotations) == ("output_text", [])
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens >= 0
    assert usage.output_tokens_details.reasoning_tokens == 0
    # the request's settings come back: the server's greedy default, the given limit, no tools, and one call at most
    # (parallel_tool_calls: llama-server's default, false; OpenAI's is true)
    assert (response.temperature, response.top_p, response.max_output_tokens) == (0.0, 1.0, 6)
    assert (response.tools, response.tool_choice, response.parallel_tool_calls) == ([], "auto", False)
    assert response.text.format.type == "text"


def test_instructions_and_an_item_list_render_the_chat_route_s_prompt(client, runtime):
    items = [{"role": "developer", "content": "Answer in one word."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"},
                                                              {"type": "input_text", "text": "there"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi.",
                                                                   "annotations": []}]},
             {"role": "user", "content": QUESTION}]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "developer", "content": "Answer in one word."},
                {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]},
                {"role": "assistant", "content": "Hi."}, {"role": "user", "content": QUESTION}]
    response = client.responses.create(model="tiny", instructions="Be brief.", input=items, max_output_tokens=5,
                                       metadata={"team": "edge"}, store=False)
    chat = _chat(client, messages, max_completion_tokens=5)
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert (response.instructions, response.metadata) == ("Be brief.", {"team": "edge"})

    from edgesdk.serve.completion import Completer

    completer = Completer(runtime, ServeDefaults(max_tokens=5))
    asked = parse_responses_request({"model": "m", "instructions": "Be brief.", "input": items})
    assert completer.prompt_ids(asked.request) == completer.prompt_ids(parse_chat_request({"messages": messages}))


def test_an_answer_cut_by_max_output_tokens_is_incomplete_whole_and_streamed(client, server):
    response = client.responses.create(model="tiny", input=QUESTION, max_output_tokens=3)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete"
    assert response.usage.output_tokens == 3

    events = events_of(server, {"model": "tiny", "input": QUESTION, "max_output_tokens": 3})
    name, last = events[-1]
    assert name == last["type"] == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["output"][0]["content"][0]["text"] == response.output_text


def test_a_stream_carries_the_whole_response_in_openai_s_events(client, server, no_whitespace):
    asked = {"model": "tiny", "input": QUESTION, "max_output_tokens": 12}
    first = client.responses.create(**asked, extra_body={"logit_bias": no_whitespace}).output_text
    # a stop string ends the answer before its limit: a completed response (the client's helper wants one)
    extra = {"logit_bias": no_whitespace, "stop": [first[4:6]]}
    body = {**asked, **extra}
    whole = client.responses.create(**asked, extra_body=extra)
    assert whole.status == "completed"
    assert whole.output_text == first[:first.index(first[4:6])]
    events = events_of(server, body)
    names = [name for name, _ in events]
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert names[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert names[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          f"response.{whole.status}"]
    deltas = [data for name, data in events if name == "response.output_text.delta"]
    item_id = events[2][1]["item"]["id"]
    assert all((d["item_id"], d["output_index"], d["content_index"]) == (item_id, 0, 0) for d in deltas)
    assert "".join(d["delta"] for d in deltas) == whole.output_text
    final = openai.types.responses.Response.model_validate(events[-1][1]["response"])
    assert final.id == events[0][1]["response"]["id"]
    assert final.output[0].id == item_id
    assert _without_ids(final) == _without_ids(whole)

    # the client's iterator and its stream helper, which assembles the events into the response
    streamed = list(client.responses.create(**asked, extra_body=extra, stream=True))
    assert "".join(e.delta for e in streamed if e.type == "response.output_text.delta") == whole.output_text
    with client.responses.stream(**asked, extra_body=extra) as stream:
        assembled = stream.get_final_response()
    assert assembled.output_text == whole.output_text
    assert _without_ids(assembled) == _without_ids(whole)


# ------------------------------------------------------------------------------------------- structured outputs


class Reading(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=8)
    hour: int = pydantic.Field(ge=0, le=23)
    ok: bool


def test_parse_with_a_pydantic_model_gives_an_instance_whole_and_streamed(client, no_whitespace):
    asked = dict(model="tiny", input=QUESTION, text_format=Reading, extra_body={"logit_bias": no_whitespace})
    response = client.responses.parse(**asked)
    assert isinstance(response.output_parsed, Reading)
    assert Reading.model_validate_json(response.output_text) == response.output_parsed
    assert response.text.format.type == "json_schema"
    with client.responses.stream(**asked) as stream:
        assert stream.get_final_response().output_parsed == response.output_parsed


def test_a_json_object_format_constrains_the_answer_to_an_object(client, no_whitespace):
    response = client.responses.create(model="tiny", input=QUESTION, text={"format": {"type": "json_object"}},
                                       max_output_tokens=8, extra_body={"logit_bias": no_whitespace})
    assert response.text.format.type == "json_object"
    assert response.output_text.startswith("{")


# ------------------------------------------------------------------------------------------- tools


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_time"}])
def test_a_tool_call_whole_streamed_and_sent_back_with_its_output(client, runtime, no_whitespace, choice):
    asked = dict(model="tiny", tools=[TIME], tool_choice=choice, parallel_tool_calls=False,
                 extra_body={"logit_bias": no_whitespace})
    response = client.responses.create(input=QUESTION, **asked)
    (call,) = response.output
    assert isinstance(call, openai.types.responses.ResponseFunctionToolCall)
    assert (call.type, call.name, call.status) == ("function_call", "get_time", "completed")
    assert call.call_id.startswith("call_")
    assert call.id.startswith("fc_")
    assert set(json.loads(call.arguments)) == {"city", "hour24"}
    assert response.output_text == ""
    assert response.tools[0].name == "get_time"
    assert response.parallel_tool_calls is False

    with client.responses.stream(input=QUESTION, **asked) as stream:
        events = list(stream)
        final = stream.get_final_response()
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [e.arguments for e in done] == [call.arguments]
    assert _without_ids(final) == _without_ids(response)

    # the round trip: the response's own output items go back, then the call's output
    turn = [{"role": "user", "content": QUESTION}, *response.output,
            {"type": "function_call_output", "call_id": call.call_id, "output": "12:00"}]
    again = client.responses.create(input=turn, **asked)
    assert again.output[0].type == "function_call"
    assert again.usage.input_tokens > response.usage.input_tokens
    answered = client.responses.create(model="tiny", input=turn, tools=[TIME], tool_choice="none",
                                       max_output_tokens=3)
    assert [item.type for item in answered.output] == ["message"]
    assert answered.usage.output_tokens == 3

    # the chat route's conversation with the same call and result renders the same prompt
    from edgesdk.serve.completion import Completer

    completer = Completer(runtime, ServeDefaults(max_tokens=5))
    chat = {"messages": [{"role": "user", "content": QUESTION},
                         {"role": "assistant", "content": None, "tool_calls": [
                             {"id": call.call_id, "type": "function",
                              "function": {"name": call.name, "arguments": call.arguments}}]},
                         {"role": "tool", "tool_call_id": call.call_id, "content": "12:00"}],
            "tools": [CHAT_TIME], "tool_choice": "required"}
    turn_body = json.loads(json.dumps({"input": [item if isinstance(item, dict) else item.model_dump()
                                                 for item in turn], "tools": [TIME], "tool_choice": "required"}))
    assert completer.prompt_ids(parse_responses_request(turn_body).request) == \
        completer.prompt_ids(parse_chat_request(chat))


def test_parallel_function_calls_are_one_assistant_turn_as_in_the_chat_request():
    """An answer's function_call items (after its reasoning and text) are the one assistant message of the chat
    request, each call's output a tool message."""
    calls = [{"type": "function_call", "call_id": f"call_{n}", "name": "get_time", "arguments": json.dumps(
        {"city": city, "hour24": True})} for n, city in enumerate(["Oslo", "Rome", "Lima"])]
    items = [{"role": "user", "content": QUESTION},
             {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "x"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
             *calls, *({"type": "function_call_output", "call_id": call["call_id"], "output": "12:00"}
                       for call in calls)]
    chat = {"messages": [{"role": "user", "content": QUESTION},
                         {"role": "assistant", "content": "Checking.", "tool_calls": [
                             {"id": call["call_id"], "type": "function",
                              "function": {"name": call["name"], "arguments": call["arguments"]}} for call in calls]},
                         *({"role": "tool", "tool_call_id": call["call_id"], "content": "12:00"} for call in calls)],
            "tools": [CHAT_TIME]}
    asked = parse_responses_request({"model": "m", "input": items, "tools": [TIME]})
    assert asked.request.messages == parse_chat_request(chat).messages
    assert len(asked.request.messages) == 6  # system (the tools), user, assistant, three tool results


def test_a_stream_s_events_build_the_items_of_reasoning_then_text():
    """A thinking model's answer: a reasoning item (its reasoning_text deltas), closed when the text begins, then the
    message; the same steps without events give the whole response."""
    from edgesdk.serve.completion import Completion
    from edgesdk.serve.reasoning import ReasoningSplitter

    asked = parse_responses_request({"model": "m", "input": "hi"})
    streamed = Output(asked, "m", 0.0, 1.0, splitter=ReasoningSplitter(opened=True), count_tokens=len)
    events = streamed.start() + streamed.push("The fox") + streamed.push(" runs.</think>It") + streamed.push(" jumps.")
    completion = Completion(text="The fox runs.</think>It jumps.", finish_reason="stop", prompt_tokens=4,
                            completion_tokens=9)
    events += streamed.end(completion)
    shapes = [(name, data.get("output_index")) for name, data in events]
    assert shapes == [("response.created", None), ("response.in_progress", None),
                      ("response.output_item.added", 0), ("response.content_part.added", 0),
                      ("response.reasoning_text.delta", 0), ("response.reasoning_text.delta", 0),
                      ("response.reasoning_text.done", 0), ("response.content_part.done", 0),
                      ("response.output_item.done", 0),
                      ("response.output_item.added", 1), ("response.content_part.added", 1),
                      ("response.output_text.delta", 1), ("response.output_text.delta", 1),
                      ("response.output_text.done", 1), ("response.content_part.done", 1),
                      ("response.output_item.done", 1), ("response.completed", None)]
    final = events[-1][1]["response"]
    reasoning, message = final["output"]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "The fox runs."}]
    assert message["content"][0]["text"] == "It jumps."
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] == 9  # capped at the answer's tokens
    whole = Output(asked, "m", 0.0, 1.0, splitter=ReasoningSplitter(opened=True), count_tokens=len).whole(completion)
    assert [{k: v for k, v in item.items() if k != "id"} for item in whole["output"]] == \
        [{k: v for k, v in item.items() if k != "id"} for item in final["output"]]
    assert openai.types.responses.Response.model_validate(final).output_text == "It jumps."


def test_a_thinking_template_s_reasoning_is_a_reasoning_item(terse):
    """The tiny model never closes its block in 10 tokens: all reasoning, no message, cut by the limit."""
    body = {"model": "m", "input": "Think.", "max_output_tokens": 10}
    status, whole = terse.post("/v1/responses", body)
    assert status == 200, whole
    assert [item["type"] for item in whole["output"]] == ["reasoning"]
    assert whole["status"] == "incomplete"
    assert whole["usage"]["output_tokens_details"]["reasoning_tokens"] == 10
    events = events_of(terse, body)
    thought = "".join(data["delta"] for name, data in events if name == "response.reasoning_text.delta")
    assert thought == whole["output"][0]["content"][0]["text"]
    assert [item["type"] for item in events[-1][1]["response"]["output"]] == ["reasoning"]


# ------------------------------------------------------------------------------------------- refusals


IMAGE = {"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/a.png"}]}
FILE = {"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}


@pytest.mark.parametrize(("fields", "param"), [
    ({"conversation": "conv_1"}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"background": True}, "background"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"tools": [TIME, {"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "tools[1]"),
    ({"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]}, "tools[0]"),
    ({"tools": [{"type": "mcp", "server_label": "x", "server_url": "https://example.com"}]}, "tools[0]"),
    ({"tools": [{"type": "computer_use_preview", "display_width": 1, "display_height": 1,
                 "environment": "linux"}]}, "tools[0]"),
    ({"input": [IMAGE]}, "input[0].content[0]"),
    ({"input": [{"role": "user", "content": "hi"}, FILE]}, "input[1].content[0]"),
    ({"tools": [TIME], "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}}, "tool_choice"),
])
def test_what_this_server_cannot_honour_is_a_400_naming_the_field(client, fields, param):
    body = {"model": "tiny", "input": QUESTION, **fields}
    with pytest.raises(openai.BadRequestError) as refused:
        client.post("/responses", body=body, cast_to=object)
    assert refused.value.status_code == 400
    assert refused.value.param == param
    assert param.split("[")[0] in refused.value.message
    assert refused.value.code == "unsupported_parameter"


@pytest.mark.parametrize(("fields", "param", "said"), [
    ({"max_output_tokens": 0}, "max_output_tokens", "'max_output_tokens' must be a whole number >= 1"),
    ({"temperature": "5"}, "temperature", "'temperature' must be a finite number"),
    ({"tools": [{"type": "function", "name": "bad name!"}]}, "tools[0].name", "tools[0].name"),
    ({"tools": [CHAT_TIME]}, "tools[0].name", "flat"),
    ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format", "schema"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}},
     "text.format.schema", "text.format.schema"),
    ({"input": []}, "input", "'input'"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "input[0].role"),
    # a function_call's arguments that are not JSON text are kept as their string (test_roundtrip51.py)
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id", "call_id"),
    ({"instructions": 3}, "instructions", "'instructions'"),
])
def test_a_bad_field_is_named_as_the_responses_api_names_it(client, fields, param, said):
    with pytest.raises(openai.BadRequestError) as refused:
        client.post("/responses", body={"model": "tiny", "input": QUESTION, **fields}, cast_to=object)
    assert refused.value.param == param
    assert said in refused.value.message
    assert refused.value.body["type"] == "invalid_request_error"


def test_the_route_takes_the_api_key_and_only_post(runtime):
    guarded = Served(runtime, ServeDefaults(max_tokens=2), api_key="s3cret")
    try:
        status, body = guarded.post("/v1/responses", {"model": "m", "input": "hi"})
        assert (status, body["error"]["code"]) == (401, "invalid_api_key")
        status, body = guarded.post("/v1/responses", {"model": "m", "input": "hi"},
                                    headers={"Authorization": "Bearer s3cret"})
        assert (status, body["status"], body["usage"]["output_tokens"]) == (200, "incomplete", 2)
        status, headers, _ = guarded.request("GET", "/v1/responses", headers={"Authorization": "Bearer s3cret"})
        assert (status, headers["Allow"]) == (405, "POST")
    finally:
        guarded.close()


# ------------------------------------------------------------------------------------------- the handler's machinery


def test_an_error_after_the_stream_started_is_openai_s_error_event(runtime):
    """The server stopping mid-answer: the stream's last event is ``error`` (its code the reason), numbered on."""
    from tests.unit.test_serve_review import CountingHook, Served, post_bytes, wait_for

    hook = CountingHook(hold_at=4)
    served = Served(runtime, ServeDefaults(max_tokens=200), hook=hook)
    try:
        streamed = served.raw(post_bytes({"model": "m", "input": QUESTION, "stream": True}, "/v1/responses"))
        assert hook.held.wait(30)
        stopper = threading.Thread(target=lambda: served.server.stop_answers(timeout=30))
        stopper.start()
        assert wait_for(lambda: served.completer.stopping)
        hook.release.set()
        stopper.join(60)
        received = b""
        while chunk := streamed.recv(65536):
            received += chunk
        head, _, body = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        events = [block.decode().split("\n", 1) for block in body.split(b"\n\n") if block]
        names = [name for name, _ in events]
        assert names[:2] == ["event: response.created", "event: response.in_progress"]
        assert names[-1] == "event: error"
        error = openai.types.responses.ResponseErrorEvent.model_validate_json(events[-1][1].removeprefix("data: "))
        assert (error.type, error.code, error.sequence_number) == ("error", "server_stopping", len(events) - 1)
        assert hook.ends == [None]  # ended early, through the hook's end of request
    finally:
        hook.release.set()
        served.close()


def test_a_streamed_answer_stops_when_its_client_leaves(runtime):
    from tests.unit.test_serve_review import RESET_ON_CLOSE, CountingHook, Served, post_bytes, wait_for

    hook = CountingHook(hold_at=4)
    served = Served(runtime, ServeDefaults(max_tokens=200), hook=hook)
    try:
        leaving = served.raw(post_bytes({"model": "m", "input": QUESTION, "stream": True}, "/v1/responses"))
        assert hook.held.wait(30)
        leaving.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
        leaving.close()
        hook.release.set()
        assert wait_for(lambda: hook.ends)
        assert hook.ends == [None]
        assert hook.steps <= 6
        assert wait_for(lambda: not served.completer.busy)
        assert served.post("/v1/responses", {"model": "m", "input": "hi", "max_output_tokens": 2})[0] == 200
    finally:
        hook.release.set()
        served.close()
