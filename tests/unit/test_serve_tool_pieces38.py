"""A streamed answer under tools on ``POST /v1/responses`` and ``POST /v1/messages`` goes out as the real servers stream
one, as the chat route does (tests/unit/test_tool_stream_parity38.py): a call once its name is whole, then its
arguments in pieces; a text answer as it is written. What each client builds from the stream (the openai client's
``responses.stream`` helper, the anthropic client's ``messages.stream`` accumulation) is the answer without
``stream``, a call cut by the token limit included.

Responses: a ``function_call`` item added with ``arguments`` "" and status ``in_progress``,
``response.function_call_arguments.delta`` pieces, ``.done`` with them whole, ``response.output_item.done``; every
event strictly the openai client's type (tests/unit/test_serve_responses_strict38.py). Messages (Anthropic's
"Streaming Messages"): a ``tool_use`` block started with ``input`` {}, ``input_json_delta`` events of
``partial_json`` pieces, ``content_block_stop``.

The tiny model writes whitespace when left alone; on the Responses route ``logit_bias`` (llama-server's field) bans
it, and picks the call or the text option, as tests/unit/test_tools_response_format37.py does. The Messages route
takes no ``logit_bias``: its calls are led to their end by an enum schema, and its text answer under tools is
checked through :class:`edgesdk.serve.anthropic.ToolStream` fed every split of answers of each form.
"""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
anthropic_client = pytest.importorskip("anthropic")
jiter = pytest.importorskip("jiter")  # the anthropic client's partial-JSON reader

from anthropic.lib.streaming._messages import accumulate_event  # noqa: E402 (after the skips)

from edgesdk.serve import anthropic  # noqa: E402
from edgesdk.serve.completion import Completion  # noqa: E402
from edgesdk.serve.tools import answer_message  # noqa: E402
from tests.unit import test_openai_client37 as shared  # noqa: E402
from tests.unit.test_serve_responses_strict38 import events_of, strict_events, strict_response  # noqa: E402
from tests.unit.test_tool_stream_parity38 import WHOLE, cut_inside_arguments, unquoted  # noqa: E402,F401 (a fixture)
from tests.unit.test_tools_response_format37 import answering, calling  # noqa: E402,F401 (fixtures)

runtime, server, client, no_whitespace = shared.runtime, shared.server, shared.client, shared.no_whitespace

QUESTION = "What time is it in Oslo?"
TIME = {"type": "function", "name": "get_time", "description": "The time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "hour24": {"type": "boolean"}},
                       "required": ["city", "hour24"], "additionalProperties": False}}
CHAT_TIME = {"type": "function", "function": {key: TIME[key] for key in ("name", "description", "parameters")}}
TICK = {"type": "function", "name": "tick", "description": "A clock's tick",
        "parameters": {"type": "object", "properties": {}}}
LOGPROBS = ["message.output_text.logprobs"]
READING = {"type": "json_schema", "name": "answer", "strict": True, "schema": {
    "type": "object", "properties": {"answer": {"const": "yes"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["answer", "n"], "additionalProperties": False}}


def _bare(body: dict) -> dict:
    """A response's JSON without what each answer makes anew (ids, times; the prompt tokens a cache held)."""
    body = json.loads(json.dumps(body))
    for field in ("id", "created_at", "completed_at"):
        body.pop(field, None)
    body["usage"]["input_tokens_details"].pop("cached_tokens")
    for item in body["output"]:
        item.pop("id")
        item.pop("call_id", None)
        item.pop("parsed_arguments", None)
        for part in item.get("content") or []:
            part.pop("parsed", None)
    return body


def _dumped(response, **options) -> dict:
    return _bare(response.model_dump(mode="json", by_alias=True, **options))


def _whole_and_streamed(server, body: dict) -> tuple[dict, list[tuple[str, dict]]]:  # noqa: F811
    status, whole = server.post("/v1/responses", body)
    assert status == 200, whole
    strict_response(whole)
    events = events_of(server, body)
    final = strict_events(events)  # each event the client's type, the deltas assembling the items
    assert _dumped(final) == _dumped(strict_response(whole))
    return whole, events


# ------------------------------------------------------------------------------------------- /v1/responses


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_time"}], ids=["required", "named"])
def test_a_forced_call_streams_its_arguments_in_pieces(server, client, no_whitespace, choice):  # noqa: F811
    body = {"model": "tiny", "input": QUESTION, "tools": [TIME], "tool_choice": choice, "logit_bias": no_whitespace}
    whole, events = _whole_and_streamed(server, body)
    (call,) = whole["output"]
    assert (call["type"], call["name"], call["status"]) == ("function_call", "get_time", "completed")
    names = [name for name, _ in events]
    (added,) = [data["item"] for name, data in events if name == "response.output_item.added"]
    assert (added["type"], added["name"], added["arguments"], added["status"]) == (
        "function_call", "get_time", "", "in_progress")
    pieces = [data["delta"] for name, data in events if name == "response.function_call_arguments.delta"]
    assert len(pieces) > 2  # in pieces as written, not once whole
    assert "".join(pieces) == call["arguments"]
    assert names.index("response.output_item.added") < names.index("response.function_call_arguments.delta")
    assert names[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]

    # the client's stream helper assembles the pieces into the whole response
    asked = {key: value for key, value in body.items() if key != "logit_bias"}
    with client.responses.stream(**asked, extra_body={"logit_bias": no_whitespace}) as stream:
        snapshots = [event.snapshot for event in stream if event.type == "response.function_call_arguments.delta"]
        assembled = stream.get_final_response()
    assert snapshots[-1] == call["arguments"]
    assert all(call["arguments"].startswith(snapshot) for snapshot in snapshots)
    assert _dumped(assembled, exclude_none=True) == _dumped(strict_response(whole), exclude_none=True)


@pytest.mark.parametrize("form", ["structured", "text cut"])
def test_a_text_answer_under_tools_streams_as_it_is_written(server, client, answering, unquoted, form):  # noqa: F811
    body = {"model": "tiny", "input": QUESTION, "tools": [TICK], "logit_bias": answering}
    if form == "structured":
        body["text"] = {"format": READING}
    if form == "text cut":  # no quote can close the text: max_output_tokens cuts it (the tiny model spends its
        # first 34 tokens on the whitespace llama.cpp's SPACE_RULE allows after "{", "\n\n" and 20 tabs)
        body.update(logit_bias=unquoted, max_output_tokens=48)
    whole, events = _whole_and_streamed(server, body)
    (message,) = whole["output"]
    text = message["content"][0]["text"]
    assert message["type"] == "message"
    assert whole["status"] == ("incomplete" if form == "text cut" else "completed")
    deltas = [data["delta"] for name, data in events if name == "response.output_text.delta"]
    assert "".join(deltas) == text
    assert len(deltas) > 2  # the text as it is written, none of the JSON around it
    assert not text.startswith('{"response"')
    if form == "structured":
        assert json.loads(text)["answer"] == "yes"
        with client.responses.stream(model="tiny", input=QUESTION, tools=[TICK], text={"format": READING},
                                     extra_body={"logit_bias": answering}) as stream:
            assembled = stream.get_final_response()
        assert _dumped(assembled, exclude_none=True) == _dumped(strict_response(whole), exclude_none=True)


def test_a_text_answer_under_tools_streams_every_token_s_logprobs_once(server, answering):  # noqa: F811
    """The message's log-probabilities are the tokens of its text (none of the JSON it is read out of), as the chat
    route's message carries them; streamed, each with the delta its token's text went out in, the rest with the
    last."""
    body = {"model": "tiny", "input": QUESTION, "tools": [TICK], "text": {"format": READING},
            "logit_bias": answering, "include": LOGPROBS, "top_logprobs": 2, "cache_prompt": False}
    whole, events = _whole_and_streamed(server, body)
    (part,) = whole["output"][0]["content"]
    spelled = b"".join(bytes(entry["bytes"]) for entry in part["logprobs"]).decode("utf-8", "replace")
    assert part["text"] in spelled  # every token of the text
    assert '"response"' not in spelled  # none of the JSON's before it
    # output_tokens counts them all though, the JSON's and the end-of-text token llama-server samples once the
    # schema's JSON is complete: more than the listed ones
    assert len(part["logprobs"]) + 1 < whole["usage"]["output_tokens"]
    shaped = [{"token": entry["token"], "logprob": entry["logprob"],
               "top_logprobs": [{"token": top["token"], "logprob": top["logprob"]} for top in entry["top_logprobs"]]}
              for entry in part["logprobs"]]
    deltas = [data for name, data in events if name == "response.output_text.delta"]
    assert [entry for delta in deltas for entry in delta["logprobs"]] == shaped
    assert len([delta for delta in deltas if delta["logprobs"]]) > 1  # given as they come, not once at the end
    (done,) = [data for name, data in events if name == "response.output_text.done"]
    assert done["logprobs"] == shaped
    chat = {"messages": [{"role": "user", "content": QUESTION}], "logit_bias": answering, "logprobs": True,
            "top_logprobs": 2, "cache_prompt": False, "response_format": {"type": "json_schema", "json_schema": {
                key: READING[key] for key in ("name", "schema", "strict")}},
            "tools": [{"type": "function", "function": {key: TICK[key] for key in ("name", "description",
                                                                                    "parameters")}}]}
    status, answer = server.post("/v1/chat/completions", chat)
    assert status == 200, answer
    assert part["logprobs"] == answer["choices"][0]["logprobs"]["content"]  # the chat route's message's
    assert whole["usage"]["output_tokens"] == answer["usage"]["completion_tokens"]


def test_a_call_cut_by_max_output_tokens_ends_the_same_whole_and_streamed(server, no_whitespace):  # noqa: F811
    """The function_call item as written so far (its arguments a prefix of JSON), ``incomplete`` as the response
    is: the pieces that went out are never taken back."""
    chat = {"messages": [{"role": "user", "content": QUESTION}], "tools": [CHAT_TIME], "tool_choice": "required",
            "logit_bias": no_whitespace}
    status, full = server.post("/v1/chat/completions", chat)
    assert status == 200, full
    arguments = full["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    limit = cut_inside_arguments(server, chat, '"city": "')
    body = {"model": "tiny", "input": QUESTION, "tools": [TIME], "tool_choice": "required",
            "logit_bias": no_whitespace, "max_output_tokens": limit}
    whole, events = _whole_and_streamed(server, body)
    assert (whole["status"], whole["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    (call,) = whole["output"]
    assert (call["type"], call["name"], call["status"]) == ("function_call", "get_time", "incomplete")
    assert call["arguments"].startswith('{"city": "')
    assert arguments.startswith(call["arguments"])
    assert call["arguments"] != arguments
    assert whole["usage"]["output_tokens"] == limit
    assert events[-1][0] == "response.incomplete"
    pieces = [data["delta"] for name, data in events if name == "response.function_call_arguments.delta"]
    assert "".join(pieces) == call["arguments"]


# ------------------------------------------------------------------------------------------- /v1/messages


WEATHER = {"name": "get_weather", "description": "Weather of a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]},
                                     "days": {"type": "integer", "enum": [1, 2]}},
    "required": ["city", "days"], "additionalProperties": False}}
CHAT_WEATHER = {"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                                 "parameters": WEATHER["input_schema"]}}
ASKED = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def claude(server):  # noqa: F811
    with anthropic_client.Anthropic(base_url=f"http://127.0.0.1:{server.port}", api_key="unused",
                                    max_retries=0) as made:
        yield made


def _message_events(server, body: dict) -> list[tuple[str, dict]]:  # noqa: F811
    status, headers, payload = server.request("POST", "/v1/messages", {**body, "stream": True})
    assert status == 200, payload
    events = []
    for block in payload.decode().split("\n\n"):
        if block:
            name, data = block.split("\n", 1)
            events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def _bare_message(message) -> dict:
    body = message.model_dump(mode="json", exclude_none=True)
    body.pop("id")
    body["usage"] = {key: body["usage"][key] for key in ("output_tokens",)}  # the prompt tokens a cache held vary
    for block in body["content"]:
        block.pop("id", None)
    return body


def _claude_whole_and_streamed(claude, fields: dict):
    whole = claude.messages.create(model="tiny", messages=ASKED, **fields)
    with claude.messages.stream(model="tiny", messages=ASKED, **fields) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert _bare_message(final) == _bare_message(whole)
    return whole, events


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}], ids=["any", "tool"])
def test_a_forced_tool_use_streams_its_input_in_pieces(server, claude, choice):  # noqa: F811
    fields = {"max_tokens": 420, "tools": [WEATHER], "tool_choice": choice}
    whole, _ = _claude_whole_and_streamed(claude, fields)
    (block,) = whole.content
    assert (block.type, block.name, whole.stop_reason) == ("tool_use", "get_weather", "tool_use")
    assert block.input["city"] in ("Paris", "Oslo")
    events = _message_events(server, {"messages": ASKED, **fields})
    starts = [data["content_block"] for name, data in events if name == "content_block_start"]
    assert [(start["type"], start["name"], start["input"]) for start in starts] == [("tool_use", "get_weather", {})]
    pieces = [data["delta"] for name, data in events if name == "content_block_delta"]
    assert {piece["type"] for piece in pieces} == {"input_json_delta"}
    assert len(pieces) > 2  # in pieces as written, not once whole
    assert json.loads("".join(piece["partial_json"] for piece in pieces)) == block.input
    names = [name for name, _ in events]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]


@pytest.fixture(scope="module")
def texting(tmp_path_factory):
    """A server and an anthropic client on a tiny model that answers ``WEATHER``'s question in text under ``tools``
    (``tool_choice`` auto): the module's model (seed 0) calls get_weather whatever it is asked (the "t" of
    "tool_call" 1.75 above the "r" of "response"), and the Messages route takes no ``logit_bias`` to turn it. This
    one, seed 2 of the same shape, answers {"response": "G"}: "r" 2.0 above "t", "G" and the closing quote 1.7
    and 1.5 above the next token (log-probabilities)."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.runtime.session import open_runtime
    from edgesdk.serve.completion import ServeDefaults
    from tests._utils.tiny import save_tiny_model_dir
    from tests.unit.test_serve import Served

    root = tmp_path_factory.mktemp("texting")
    model = save_tiny_model_dir(root / "model", seed=2, hidden=64, heads=4, kv_heads=2, max_positions=2048)
    bundle = build(BuildConfig(target="host", model=str(model), out=root / "b", export=ExportConfig(max_context=2048),
                               progress=False))
    served = Served(open_runtime(bundle.path, threads=1), ServeDefaults(max_tokens=420))
    with anthropic_client.Anthropic(base_url=f"http://127.0.0.1:{served.port}", api_key="unused",
                                    max_retries=0) as made:
        yield served, made
    served.close()


def test_a_text_answer_under_tools_is_its_text_block_whole_and_streamed(texting):
    server, claude = texting
    fields = {"max_tokens": 420, "tools": [WEATHER]}
    whole, _ = _claude_whole_and_streamed(claude, fields)
    assert [block.type for block in whole.content] == ["text"]  # the model answers {"response": "G"}
    assert whole.stop_reason == "end_turn"
    events = _message_events(server, {"messages": ASKED, **fields})
    deltas = [data["delta"] for name, data in events if name == "content_block_delta"]
    assert {delta["type"] for delta in deltas} == {"text_delta"}
    assert "".join(delta["text"] for delta in deltas) == whole.content[0].text  # the text, none of the JSON
    names = [name for name, _ in events]
    assert names == ["message_start", "ping", "content_block_start", *["content_block_delta"] * len(deltas),
                     "content_block_stop", "message_delta", "message_stop"]


@pytest.mark.parametrize(("marker", "expected"), [('"{city:.3}', {}), ('"{city}"', {"city": "{city}"})],
                         ids=["mid-string", "after a value"])
def test_a_tool_use_cut_by_max_tokens_ends_the_same_whole_and_streamed(server, claude, marker, expected):  # noqa: F811
    """The tool_use block as written so far, its input the object its JSON so far holds, stop reason
    ``max_tokens`` (Anthropic's "Handling stop reasons": a response cut by the limit may end in an incomplete
    tool_use block), the anthropic client's accumulation of the pieces giving the same."""
    chat = {"messages": ASKED, "tools": [CHAT_WEATHER], "tool_choice": "required", "max_tokens": 420}
    # the city the model picks from the enum (Oslo, though Paris is asked for): cut inside its name, or after it
    status, full = server.post("/v1/chat/completions", chat)
    assert status == 200, full
    city = json.loads(full["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])["city"]
    marker, expected = marker.format(city=city), {key: value.format(city=city) for key, value in expected.items()}
    limit = cut_inside_arguments(server, chat, marker)
    fields = {"max_tokens": limit, "tools": [WEATHER], "tool_choice": {"type": "any"}}
    whole, _ = _claude_whole_and_streamed(claude, fields)
    (block,) = whole.content
    assert (block.type, block.name, block.input) == ("tool_use", "get_weather", expected)
    assert (whole.stop_reason, whole.usage.output_tokens) == ("max_tokens", limit)


# ------------------------------------------------------------------------------------------- ToolStream


def _accumulated(request, text: str, cuts: list[int], finish_reason: str):
    """The message the anthropic client builds from the events of ``text`` pushed in the pieces ``cuts`` make."""
    completion = Completion(text=text, finish_reason=finish_reason, prompt_tokens=3, completion_tokens=len(text))
    answer, start, events = anthropic.ToolStream(), 0, anthropic.start_events("msg_1", "m", 3, 0, False)
    for cut in [*cuts, len(text)]:
        events += answer.push(text[start:cut])
        start = cut
    closing, finish = answer.close(finish_reason)
    events += anthropic.end_events(request, completion, closing, finish)
    snapshot, buffers = None, {}
    for _, data in events:
        if data["type"] != "ping":
            snapshot = accumulate_event(event=data, current_snapshot=snapshot, json_bufs=buffers)
    return snapshot, completion


ANSWERS = [text for text in WHOLE if '"response"' in text or '"f"' not in text] + [
    '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, {"a": "b\\u00e9"}], "x": null}}}']


@pytest.mark.parametrize("text", ANSWERS)
def test_every_split_and_cut_of_an_answer_streams_the_message_the_whole_answer_gives(text):
    request = anthropic.parse_messages_request({"max_tokens": 9, "messages": ASKED, "tools": [WEATHER]})
    for end in range(len(text) + 1):
        cut, reason = text[:end], "stop" if end == len(text) else "length"
        whole = anthropic.message_body(request, "msg_1", "m", Completion(
            text=cut, finish_reason=reason, prompt_tokens=3, completion_tokens=len(cut)))
        for cuts in ([], list(range(1, len(cut)))):
            snapshot, _ = _accumulated(request, cut, cuts, reason)
            built = snapshot.model_dump(mode="json", exclude_none=True)
            assert [{k: v for k, v in block.items() if k != "id"} for block in built["content"]] == \
                [{k: v for k, v in block.items() if k != "id"} for block in whole["content"]], (cut, cuts)
            assert built["stop_reason"] == whole["stop_reason"], cut


def test_a_text_answer_goes_out_as_text_deltas_as_it_is_written():
    answer = anthropic.ToolStream()
    assert answer.push('{"response": "') == []
    assert answer.push("Hel") == [("content_block_start", {"type": "content_block_start", "index": 0,
                                                           "content_block": {"type": "text", "text": ""}}),
                                  ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                           "delta": {"type": "text_delta", "text": "Hel"}})]
    assert answer.push('lo"}') == [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                            "delta": {"type": "text_delta", "text": "lo"}})]
    assert answer.close("stop") == ([("content_block_stop", {"type": "content_block_stop", "index": 0})], "stop")
    assert answer.blocks == [{"type": "text", "text": "Hello"}]


def test_a_call_s_input_so_far_is_read_as_the_anthropic_client_reads_it():
    """:func:`partial_input` of every stretch of arguments a call's stream gives out equals the client's reading of
    the same pieces (jiter's partial mode)."""
    # (not a lone surrogate's escape: no UTF-8 carries one to the client)
    texts = [text for text in WHOLE + ANSWERS if '"tool_call"' in text and "\\ud83d\\/" not in text] + [
        '{"tool_call": {"name": "f", "arguments": {"a": [true, false, null, -1.5e3, {"b": []}], "c": "x\\"y"}}}']
    for text in texts:
        for end in range(len(text) + 1):
            fields, _ = answer_message(text[:end], "length")
            for call in fields.get("tool_calls") or []:
                arguments = call["function"]["arguments"]
                expected = jiter.from_json(arguments.encode(), partial_mode=True) if arguments else {}
                assert anthropic.partial_input(arguments) == expected, arguments
    for arguments in ('{"a": 12', '{"a": 1.', '{"a": 1e', '{"a": -', '{"a": tr', '{"a": [1, ', '{"a"', '{"a": "x\\'):
        assert anthropic.partial_input(arguments) == jiter.from_json(arguments.encode(), partial_mode=True), arguments

