"""The official ``openai`` Python client against ``edgesdk serve``: every call a user (or a framework built on the
client) makes parses into the client's typed objects and means what it says, on a real server over a tiny bundle.

The bundle has 2,048 tokens of context, room for the tools' description in the prompt. The tiny model writes
whitespace when left alone, so requests whose answer must come out whole (a tool call, a structured output) ban the
vocabulary's whitespace tokens with ``logit_bias``: the JSON schema constraint then leads to the answer's end.
"""

from __future__ import annotations

import enum
import json
import threading
from typing import Literal, Optional

import pytest

openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")

from edgesdk.serve.completion import ServeDefaults  # noqa: E402 (after the skips)
from edgesdk.serve.http_server import ApiServer  # noqa: E402

PROMPT = "The quick brown fox"
USER = [{"role": "user", "content": "What time is it in Oslo?"}]


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.runtime.session import open_runtime
    from tests._utils.tiny import save_tiny_model_dir

    root = tmp_path_factory.mktemp("openai-client")
    model = save_tiny_model_dir(root / "model", hidden=64, heads=4, kv_heads=2, max_positions=2048)
    bundle = build(BuildConfig(target="host", model=str(model), out=root / "b", export=ExportConfig(max_context=2048),
                               progress=False))
    return open_runtime(bundle.path, threads=1)


@pytest.fixture(scope="module")
def server(runtime):
    from tests.unit.test_serve import Served

    served = Served(runtime, ServeDefaults(max_tokens=420))
    yield served
    served.close()


def _client(port: int, **options) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, **options)


@pytest.fixture(scope="module")
def client(server):
    with _client(server.port) as client:
        yield client


@pytest.fixture(scope="module")
def no_whitespace(runtime) -> dict[str, int]:
    """``logit_bias`` banning every token whose text is only whitespace."""
    tokenizer = runtime.tokenizer.tokenizer
    return {str(token): -100 for token in range(tokenizer.get_vocab_size())
            if (text := tokenizer.decode([token])) and not text.strip()}


# ------------------------------------------------------------------------------------------- chat


def test_a_chat_answer_whole_and_streamed_with_its_usage_last(client):
    whole = client.chat.completions.create(model="tiny", messages=USER, max_completion_tokens=6)
    assert isinstance(whole, openai.types.chat.ChatCompletion)
    (choice,) = whole.choices
    assert (choice.message.role, choice.finish_reason) == ("assistant", "length")
    assert whole.usage.completion_tokens == 6
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 6

    chunks = list(client.chat.completions.create(model="tiny", messages=USER, max_completion_tokens=6, stream=True,
                                                 stream_options={"include_usage": True}))
    assert all(isinstance(chunk, openai.types.chat.ChatCompletionChunk) for chunk in chunks)
    *answer, last = chunks
    assert last.choices == []  # the usage chunk: no choices, the usage
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (whole.usage.prompt_tokens, 6)
    assert all(chunk.usage is None for chunk in answer)
    assert answer[0].choices[0].delta.role == "assistant"
    assert "".join(chunk.choices[0].delta.content or "" for chunk in answer) == choice.message.content
    assert answer[-1].choices[0].finish_reason == "length"
    assert len({chunk.id for chunk in chunks}) == 1


def test_the_client_s_sampling_fields_mean_what_they_say(client, no_whitespace):
    sampled = dict(model="tiny", messages=USER, max_completion_tokens=12, temperature=1.0, logit_bias=no_whitespace)
    first = client.chat.completions.create(seed=5, **sampled).choices[0].message.content
    assert client.chat.completions.create(seed=5, **sampled).choices[0].message.content == first
    assert len(first) >= 4

    stop = first[2:4]
    cut = client.chat.completions.create(seed=5, stop=[stop], **sampled).choices[0]
    assert (cut.message.content, cut.finish_reason) == (first[:first.index(stop)], "stop")

    with_logprobs = client.chat.completions.create(seed=5, logprobs=True, top_logprobs=2, **sampled)
    entries = with_logprobs.choices[0].logprobs.content
    assert len(entries) == with_logprobs.usage.completion_tokens == 12
    assert all(isinstance(e, openai.types.chat.ChatCompletionTokenLogprob) and len(e.top_logprobs) == 2
               for e in entries)
    assert b"".join(bytes(e.bytes) for e in entries).decode("utf-8", errors="replace") == first

    # fields that change nothing on this server are taken, and the answer is the same
    same = client.chat.completions.create(seed=5, user="someone", metadata={"team": "edge"}, store=False,
                                          service_tier="auto", prompt_cache_key="k", safety_identifier="s",
                                          parallel_tool_calls=False, modalities=["text"], frequency_penalty=0,
                                          presence_penalty=0, n=1, **sampled)
    assert same.choices[0].message.content == first


def test_n_above_one_is_a_bad_request_naming_n(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tiny", messages=USER, n=2)
    assert refused.value.status_code == 400
    assert refused.value.param == "n"
    assert refused.value.code == "unsupported_parameter"
    assert "'n' = 2" in refused.value.message
    assert refused.value.body["param"] == "n"


@pytest.mark.parametrize(("fields", "param"), [
    ({"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}, "modalities"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"web_search_options": {}}, "web_search_options"),
])
def test_audio_output_and_web_search_are_refused_by_name_not_answered_in_text(client, fields, param):
    """Asked for audio or a web search, the server cannot give them: the client hears so by name rather than getting
    a text answer whose ``message.audio`` is None."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tiny", messages=USER, max_completion_tokens=2, **fields)
    assert refused.value.param == param
    assert f"'{param}'" in refused.value.message
    assert "leave" in refused.value.message


# ------------------------------------------------------------------------------------------- tools

TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "hour24": {"type": "boolean"}},
                   "required": ["city", "hour24"], "additionalProperties": False}, "strict": True}}
PING = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_a_tool_call_whole_and_through_the_client_s_stream_helper(client, no_whitespace, choice):
    asked = dict(model="tiny", messages=USER, tools=[TIME, PING], tool_choice=choice, parallel_tool_calls=False,
                 logit_bias=no_whitespace)
    whole = client.chat.completions.create(**asked).choices[0]
    assert whole.finish_reason == "tool_calls"
    assert whole.message.content is None
    (call,) = whole.message.tool_calls
    assert isinstance(call, openai.types.chat.ChatCompletionMessageFunctionToolCall)
    assert call.type == "function"
    assert call.id.startswith("call_")
    if isinstance(choice, dict):
        assert call.function.name == "get_time"
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == ({"city", "hour24"} if call.function.name == "get_time" else set())

    with client.chat.completions.stream(**asked, stream_options={"include_usage": True}) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    (streamed,) = final.choices[0].message.tool_calls
    assert (streamed.function.name, streamed.function.arguments) == (call.function.name, call.function.arguments)
    assert final.choices[0].finish_reason == "tool_calls"
    done = [event for event in events if event.type == "tool_calls.function.arguments.done"]
    assert [(event.name, event.arguments) for event in done] == [(call.function.name, call.function.arguments)]
    assert final.usage is not None
    assert final.usage.completion_tokens > 0


def test_tool_choice_none_and_auto(client, no_whitespace):
    none = client.chat.completions.create(model="tiny", messages=USER, tools=[TIME], tool_choice="none",
                                          max_completion_tokens=4)
    assert none.choices[0].message.tool_calls is None
    plain = client.chat.completions.create(model="tiny", messages=USER, max_completion_tokens=4)
    assert none.choices[0].message.content == plain.choices[0].message.content  # no tools offered at all

    # parallel_tool_calls allows more than one call; an answer here makes at most one
    auto = client.chat.completions.create(model="tiny", messages=USER, tools=[TIME], tool_choice="auto",
                                          parallel_tool_calls=True, logit_bias=no_whitespace).choices[0]
    assert auto.finish_reason in ("tool_calls", "stop")
    if auto.finish_reason == "tool_calls":
        assert [call.function.name for call in auto.message.tool_calls] == ["get_time"]
    else:
        assert isinstance(auto.message.content, str)  # the {"response": ...} text, unwrapped


def test_a_follow_up_turn_sends_the_call_and_its_result_back(client, no_whitespace):
    asked = dict(model="tiny", tools=[TIME], tool_choice="required", logit_bias=no_whitespace)
    first = client.chat.completions.create(messages=USER, **asked)
    message = first.choices[0].message
    (call,) = message.tool_calls
    # the client's own message object goes back as the assistant turn, as the client's documentation shows
    turn = [*USER, message, {"role": "tool", "tool_call_id": call.id, "content": "12:00"}]
    again = client.chat.completions.create(messages=turn, **asked)
    assert again.choices[0].finish_reason == "tool_calls"
    assert again.usage.prompt_tokens > first.usage.prompt_tokens
    answered = client.chat.completions.create(model="tiny", messages=turn, max_completion_tokens=3)
    assert answered.choices[0].message.tool_calls is None
    assert answered.usage.completion_tokens == 3


def test_a_strict_pydantic_tool_is_parsed_into_its_model(client, no_whitespace):
    class GetTime(pydantic.BaseModel):
        city: str = pydantic.Field(max_length=8)
        hour: int = pydantic.Field(ge=0, le=23)

    message = client.chat.completions.parse(model="tiny", messages=USER, tools=[openai.pydantic_function_tool(GetTime)],
                                            tool_choice="required", logit_bias=no_whitespace).choices[0].message
    (call,) = message.tool_calls
    assert isinstance(call.function.parsed_arguments, GetTime)
    assert 0 <= call.function.parsed_arguments.hour <= 23


# ------------------------------------------------------------------------------------------- structured outputs


class Colour(enum.Enum):
    RED = "red"
    GREEN = "green"


class Place(pydantic.BaseModel):
    x: int
    label: str = pydantic.Field(max_length=6)


class Report(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    age: int
    score: float
    ok: bool
    nick: Optional[str]  # noqa: UP045 (the typing form users write)
    kind: Literal["a", "b"]
    colour: Colour
    rating: int = pydantic.Field(ge=1, le=5)
    code: str = pydantic.Field(pattern=r"^[A-Z]{3}$")
    tags: list[str] = pydantic.Field(max_length=3)
    place: Place


def test_parse_with_a_pydantic_model_gives_an_instance_whole_and_streamed(client, no_whitespace):
    message = client.chat.completions.parse(model="tiny", messages=USER, response_format=Report,
                                            logit_bias=no_whitespace).choices[0].message
    assert isinstance(message.parsed, Report)
    assert Report.model_validate_json(message.content) == message.parsed
    assert 1 <= message.parsed.rating <= 5
    assert len(message.parsed.code) == 3
    assert len(message.parsed.tags) <= 3

    with client.chat.completions.stream(model="tiny", messages=USER, response_format=Report,
                                        logit_bias=no_whitespace) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.parsed == message.parsed


def test_a_json_schema_response_format_without_its_schema_is_a_bad_request(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tiny", messages=USER,
                                       response_format={"type": "json_schema", "json_schema": {"name": "x"}})
    assert refused.value.param == "response_format"


# ------------------------------------------------------------------------------------------- completions (legacy)


def test_legacy_completions_echo_and_logprobs(client):
    answer = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, echo=True, logprobs=2)
    assert isinstance(answer, openai.types.Completion)
    (choice,) = answer.choices
    assert choice.text.startswith(PROMPT)
    logprobs = choice.logprobs
    assert "".join(logprobs.tokens) == choice.text
    assert logprobs.token_logprobs[0] is None
    assert logprobs.top_logprobs[0] is None
    assert len(logprobs.tokens) == answer.usage.prompt_tokens + answer.usage.completion_tokens
    assert logprobs.text_offset == sorted(logprobs.text_offset)

    plain = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, best_of=1)
    assert choice.text == PROMPT + plain.choices[0].text
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 4
    assert "".join(chunk.choices[0].text for chunk in chunks[:-1]) == plain.choices[0].text


@pytest.mark.parametrize(("fields", "param"), [({"suffix": "}"}, "suffix"), ({"best_of": 2}, "best_of")])
def test_legacy_fields_this_server_cannot_honour_are_refused_by_name(client, fields, param):
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, **fields)
    assert refused.value.param == param
    assert f"'{param}'" in refused.value.message


# ------------------------------------------------------------------------------------------- models, errors, headers


def test_models_list_and_retrieve(client):
    (card,) = client.models.list().data
    assert isinstance(card, openai.types.Model)
    assert (card.id, card.object) == ("tiny-host", "model")
    assert client.models.retrieve("tiny-host") == card


def test_retrieving_a_model_not_served_is_model_not_found_naming_the_served_one(client):
    with pytest.raises(openai.NotFoundError) as refused:
        client.models.retrieve("gpt-4o")
    assert refused.value.code == "model_not_found"
    assert "'gpt-4o'" in refused.value.message
    assert "'tiny-host'" in refused.value.message


def test_a_served_name_with_a_slash_is_retrieved_as_the_client_encodes_it(runtime):
    """``--model-name org/name`` (llama-server's ``--alias``): the client asks for ``/v1/models/org%2Fname``."""
    from edgesdk.serve.completion import Completer

    name = "HuggingFaceTB/SmolLM2 tiny"
    server = ApiServer(("127.0.0.1", 0), Completer(runtime, ServeDefaults(max_tokens=2)), name, log=False)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with _client(server.server_address[1]) as client:
            assert client.models.retrieve(name).id == name
            assert client.models.list().data[0].id == name
    finally:
        server.shutdown()
        server.server_close()


def test_errors_map_to_the_client_s_exceptions(client, server):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tiny", messages=USER, temperature="hot")
    assert refused.value.param == "temperature"
    assert "'temperature'" in refused.value.message
    body = refused.value.body  # the error object of OpenAI's {"error": {...}}
    assert (body["type"], body["param"]) == ("invalid_request_error", "temperature")
    assert "'temperature' must be a finite number (0 or below: greedy), got \"hot\"" in body["message"]
    with pytest.raises(openai.BadRequestError) as long:
        client.completions.create(model="tiny", prompt="x" * 5000, max_tokens=1)
    assert long.value.code == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError):  # a route this server does not have
        client.images.generate(model="tiny", prompt="x")
    with _client(server.port) as other:
        with pytest.raises(openai.APIStatusError) as unknown:
            other.post("/nope", body={}, cast_to=object)
    assert unknown.value.status_code == 404


def test_a_wrong_key_is_an_authentication_error(runtime):
    from tests.unit.test_serve import Served

    guarded = Served(runtime, ServeDefaults(max_tokens=2), api_key="s3cret")
    try:
        with _client(guarded.port) as wrong:
            assert [model.id for model in wrong.models.list()]  # the model list is open, as llama-server's
            with pytest.raises(openai.AuthenticationError):
                wrong.chat.completions.create(model="tiny", messages=USER)
        with openai.OpenAI(base_url=f"http://127.0.0.1:{guarded.port}/v1", api_key="s3cret", max_retries=0) as right:
            assert right.chat.completions.create(model="tiny", messages=USER).usage.completion_tokens == 2
    finally:
        guarded.close()


def test_a_busy_server_is_the_client_s_503_server_busy(runtime):
    from tests.unit.test_serve import HeldHook, Served

    hook = HeldHook()
    busy = Served(runtime, ServeDefaults(max_tokens=2, max_waiting=0), hook=hook)
    try:
        with _client(busy.port) as client:
            results = {}
            first = threading.Thread(target=lambda: results.update(
                first=client.completions.create(model="tiny", prompt=PROMPT)))
            first.start()
            assert hook.entered.wait(30)
            with pytest.raises(openai.InternalServerError) as refused:
                client.completions.create(model="tiny", prompt=PROMPT)
            assert (refused.value.status_code, refused.value.code) == (503, "server_busy")
            hook.release.set()
            first.join(60)
            assert results["first"].usage.completion_tokens == 2
    finally:
        hook.release.set()
        busy.close()


def test_raw_responses_carry_the_headers_and_parse(client):
    raw = client.chat.completions.with_raw_response.create(model="tiny", messages=USER, max_completion_tokens=2)
    assert raw.status_code == 200
    assert raw.headers["content-type"] == "application/json"
    assert isinstance(raw.parse(), openai.types.chat.ChatCompletion)

    raw = client.chat.completions.with_raw_response.create(model="tiny", messages=USER, max_completion_tokens=2,
                                                           stream=True)
    assert raw.headers["content-type"] == "text/event-stream"
    chunks = list(raw.parse())
    assert chunks[-1].choices[0].finish_reason == "length"

    with client.completions.with_streaming_response.create(model="tiny", prompt=PROMPT, max_tokens=2) as response:
        assert response.status_code == 200
        assert response.parse().usage.completion_tokens == 2


class StopAfter:
    """A StepHook that stops the server (as ``edgesdk serve`` does on SIGTERM) once the answer is under way."""

    def __init__(self, steps: int):
        self.steps, self.server = steps, None

    def begin(self, prompt_tokens, max_new_tokens):
        pass

    def before_step(self, kind):
        self.steps -= 1
        if self.steps == 0:
            self.server.completer.stop()
        return 0.0

    def after_step(self, kind, tokens, compute_s):
        pass

    def end(self, stats):
        pass


def test_a_server_stopping_mid_stream_is_the_client_s_api_error_and_no_traceback(runtime, capfd):
    """The stream's last event is the 503 ``server_stopping`` error, which the client raises as ``APIError``; the
    server's log names no fault of its own (a traceback there reads as a crash)."""
    from tests.unit.test_serve import Served

    hook = StopAfter(steps=4)
    stopping = Served(runtime, ServeDefaults(max_tokens=20), hook=hook)
    hook.server = stopping.server
    try:
        with _client(stopping.port) as client:
            stream = client.chat.completions.create(model="tiny", messages=USER, stream=True)
            received = []
            with pytest.raises(openai.APIError) as ended:
                received.extend(stream)
        assert received[0].choices[0].delta.role == "assistant"
        assert ended.value.body["code"] == "server_stopping"
        assert "shutting down" in ended.value.message
    finally:
        stopping.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err, err
