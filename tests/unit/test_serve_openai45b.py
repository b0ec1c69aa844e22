"""``parallel_tool_calls`` on a real server over a tiny bundle: a request that allows several calls can get them,
each its own entry of ``tool_calls`` with its own id, streamed under its own ``index``, and on the Responses API each
its own ``function_call`` item. The answer is llama.cpp's generic format's list form (common/chat.cpp,
``common_chat_params_init_generic``: ``{"tool_calls": [...]}`` when parallel_tool_calls is set); the default is
llama-server's, false (one call), on chat completions and the Responses API alike (OpenAI's is true).

The tiny model answers greedily with the same call over and over; sampled (temperature 1, a seed) it closes the
list after a few calls, so each test looks, over a few seeds, for an answer of several calls that ends whole.
"""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")

from edgesdk.serve.api import parse_chat_request  # noqa: E402
from edgesdk.serve.tools import AnswerStream  # noqa: E402
from tests._utils.chat_stream import accumulated_message  # noqa: E402
from tests.unit.test_openai_client37 import PING, USER, client, no_whitespace, runtime, server  # noqa: E402,F401
from tests.unit.test_tools_response_format37 import TICK, calling  # noqa: E402,F401

SEEDS = range(12)


def _ids_aside(calls: list[dict]) -> list[dict]:
    return [{**call, "id": None} for call in calls]


@pytest.fixture(scope="module")
def several(server, calling):  # noqa: F811
    """(the request body, its whole answer's choice) of a seed whose answer makes more than one call."""
    for seed in SEEDS:
        body = {"messages": USER, "tools": [TICK, PING], "tool_choice": "required", "parallel_tool_calls": True,
                "logit_bias": calling, "temperature": 1.0, "seed": seed, "max_tokens": 200}
        status, whole = server.post("/v1/chat/completions", body)
        assert status == 200, whole
        choice = whole["choices"][0]
        if choice["finish_reason"] == "tool_calls" and len(choice["message"]["tool_calls"]) > 1:
            return body, choice
    pytest.fail(f"no seed of {list(SEEDS)} gave an answer of several calls: parallel_tool_calls lets only one")


def test_parallel_tool_calls_gives_several_calls_each_with_its_own_id(several):
    _, choice = several
    calls = choice["message"]["tool_calls"]
    assert choice["message"]["content"] is None
    assert len({call["id"] for call in calls}) == len(calls)
    for call in calls:
        assert call["id"].startswith("call_")
        assert call["type"] == "function"
        assert call["function"]["name"] in ("tick", "ping")
        assert json.loads(call["function"]["arguments"]) == {}


def test_without_parallel_tool_calls_an_answer_makes_one_call(server, several):  # noqa: F811
    body, _ = several
    for parallel in (False, None):  # None: llama-server's default, false
        asked = {key: value for key, value in body.items() if key != "parallel_tool_calls"}
        if parallel is not None:
            asked["parallel_tool_calls"] = parallel
        status, whole = server.post("/v1/chat/completions", asked)
        assert status == 200, whole
        assert len(whole["choices"][0]["message"]["tool_calls"]) == 1


def test_the_stream_sends_each_call_under_its_own_index(server, several):  # noqa: F811
    body, choice = several
    events = server.stream("/v1/chat/completions", body)
    deltas = [event["choices"][0]["delta"] for event in events[:-1] if event["choices"]]
    pieces = [piece for delta in deltas for piece in delta.get("tool_calls") or []]
    firsts = [piece for piece in pieces if "id" in piece]
    assert [piece["index"] for piece in firsts] == list(range(len(choice["message"]["tool_calls"])))
    assert len({piece["id"] for piece in firsts}) == len(firsts)
    assert all("name" not in piece["function"] for piece in pieces if "id" not in piece)
    message = accumulated_message(deltas)
    assert _ids_aside(message["tool_calls"]) == _ids_aside(choice["message"]["tool_calls"])
    finishes = [event["choices"][0]["finish_reason"] for event in events[:-1] if event["choices"]]
    assert [reason for reason in finishes if reason] == ["tool_calls"]


def test_the_openai_client_assembles_the_streamed_calls(client, several):  # noqa: F811
    body, choice = several
    extra = {"seed": body["seed"], "logit_bias": body["logit_bias"]}
    with client.chat.completions.stream(model="tiny", messages=USER, tools=body["tools"], tool_choice="required",
                                        parallel_tool_calls=True, temperature=1.0, max_completion_tokens=200,
                                        extra_body=extra) as stream:
        events = list(stream)
        final = stream.get_final_completion().choices[0]
    expected = [(call["function"]["name"], call["function"]["arguments"]) for call in choice["message"]["tool_calls"]]
    assert [(call.function.name, call.function.arguments) for call in final.message.tool_calls] == expected
    done = [(event.index, event.name) for event in events if event.type == "tool_calls.function.arguments.done"]
    assert done == [(index, name) for index, (name, _) in enumerate(expected)]


def test_the_responses_api_gives_one_function_call_item_per_call(client, several):  # noqa: F811
    body, choice = several
    tools = [{"type": "function", **tool["function"]} for tool in body["tools"]]
    asked = dict(model="tiny", input=USER[0]["content"], tools=tools, tool_choice="required", temperature=1.0,
                 max_output_tokens=200, extra_body={"seed": body["seed"], "logit_bias": body["logit_bias"]})
    expected = [(call["function"]["name"], call["function"]["arguments"]) for call in choice["message"]["tool_calls"]]
    whole = client.responses.create(**asked, parallel_tool_calls=True)
    assert whole.parallel_tool_calls is True
    assert [(item.type, item.name, item.arguments) for item in whole.output] == \
        [("function_call", name, arguments) for name, arguments in expected]
    assert len({item.call_id for item in whole.output}) == len(expected)

    events = list(client.responses.create(**asked, parallel_tool_calls=True, stream=True))
    added = [event for event in events if event.type == "response.output_item.added"]
    assert [(event.output_index, event.item.name) for event in added] == \
        [(index, name) for index, (name, _) in enumerate(expected)]
    done = [event for event in events if event.type == "response.function_call_arguments.done"]
    assert [(event.output_index, event.arguments) for event in done] == \
        [(index, arguments) for index, (_, arguments) in enumerate(expected)]
    (completed,) = [event for event in events if event.type == "response.completed"]
    assert [(item.name, item.arguments) for item in completed.response.output] == expected

    for one in (client.responses.create(**asked, parallel_tool_calls=False), client.responses.create(**asked)):
        assert one.parallel_tool_calls is False  # absent: the chat route's default, llama-server's (false)
        assert len(one.output) == 1


def test_earlier_parallel_calls_are_written_in_the_form_the_answer_takes():
    calls = [{"id": "call_a", "type": "function", "function": {"name": "tick", "arguments": "{}"}},
             {"id": "call_b", "type": "function", "function": {"name": "ping", "arguments": "{}"}}]
    messages = [*USER, {"role": "assistant", "content": None, "tool_calls": calls},
                {"role": "tool", "tool_call_id": "call_a", "content": "1"},
                {"role": "tool", "tool_call_id": "call_b", "content": "pong"}]
    parallel = parse_chat_request({"messages": messages, "tools": [TICK, PING], "parallel_tool_calls": True})
    (turn,) = [message for message in parallel.messages if message["role"] == "assistant"]
    assert json.loads(turn["content"]) == {"tool_calls": [{"name": "tick", "arguments": {}, "id": "call_a"},
                                                          {"name": "ping", "arguments": {}, "id": "call_b"}]}
    assert '{"tool_calls": [' in parallel.messages[0]["content"]  # the instructions ask for that form
    single = parse_chat_request({"messages": messages, "tools": [TICK, PING]})
    (turn,) = [message for message in single.messages if message["role"] == "assistant"]
    assert [json.loads(line) for line in turn["content"].split("\n")] == [
        {"tool_call": {"name": "tick", "arguments": {}, "id": "call_a"}},
        {"tool_call": {"name": "ping", "arguments": {}, "id": "call_b"}}]


@pytest.mark.parametrize("value", ["yes", 1, [True]])
def test_parallel_tool_calls_must_be_true_or_false(server, value):  # noqa: F811
    status, body = server.post("/v1/chat/completions", {"messages": USER, "tools": [TICK], "parallel_tool_calls": value})
    assert status == 400, body
    assert body["error"]["param"] == "parallel_tool_calls"


def test_a_list_of_calls_streams_as_its_whole_answer_reads_cut_anywhere():
    text = ('{"tool_calls": [{"name": "tick", "arguments": {"n": 12, "s": "a\\"b"}}, {"name":"ping","arguments":{}} ,'
            '\n {"name": "tick", "arguments": {}}]}')
    for end in range(len(text) + 1):
        for reason in ("length", "stop"):
            answer, deltas = AnswerStream(), []
            for char in text[:end]:
                deltas += answer.push(char)
            rest, fields, finish = answer.finish(reason)
            built = accumulated_message(deltas + rest)
            assert _ids_aside(built.get("tool_calls") or []) == _ids_aside(fields.get("tool_calls") or []), end
            assert [piece["index"] for delta in deltas + rest for piece in delta.get("tool_calls") or []
                    if "id" in piece] == list(range(len(fields.get("tool_calls") or [])))
    assert finish == "tool_calls"
    assert [call["function"]["arguments"] for call in fields["tool_calls"]] == ['{"n": 12, "s": "a\\"b"}', "{}", "{}"]


# ------------------------------------------------------------------------------- /v1/completions max_tokens 0

PROMPT = "The quick brown fox jumps"


def _scored(server, **fields) -> dict:  # noqa: F811
    status, body = server.post("/v1/completions", {"prompt": PROMPT, "echo": True, "logprobs": 2, **fields})
    assert status == 200, body
    return body


def test_max_tokens_0_with_echo_and_logprobs_scores_the_prompt(server):  # noqa: F811
    """OpenAI's prompt scoring (lm-evaluation-harness's loglikelihood): the echoed prompt, each of its tokens'
    log-probability (the first's null), nothing generated."""
    scored = _scored(server, max_tokens=0)
    (choice,) = scored["choices"]
    assert (choice["text"], choice["finish_reason"]) == (PROMPT, "length")
    assert scored["usage"]["completion_tokens"] == 0
    assert scored["usage"]["total_tokens"] == scored["usage"]["prompt_tokens"]
    logprobs = choice["logprobs"]
    assert "".join(logprobs["tokens"]) == PROMPT
    assert len(logprobs["tokens"]) == scored["usage"]["prompt_tokens"]
    assert logprobs["token_logprobs"][0] is None
    assert logprobs["top_logprobs"][0] is None
    assert all(isinstance(value, float) and value <= 0 for value in logprobs["token_logprobs"][1:])
    # the prompt's entries of an answer of one token: the same scores
    one = _scored(server, max_tokens=1)["choices"][0]["logprobs"]
    count = len(logprobs["tokens"])
    assert one["tokens"][:count] == logprobs["tokens"]
    assert one["text_offset"][:count] == logprobs["text_offset"]
    assert one["token_logprobs"][1:count] == pytest.approx(logprobs["token_logprobs"][1:], abs=1e-4)

    events = server.stream("/v1/completions", {"prompt": PROMPT, "echo": True, "logprobs": 2, "max_tokens": 0})
    choices = [event["choices"][0] for event in events[:-1] if event["choices"]]
    assert "".join(choice["text"] for choice in choices) == PROMPT
    assert [choice["finish_reason"] for choice in choices if choice["finish_reason"]] == ["length"]
    streamed = [token for choice in choices if choice.get("logprobs") for token in choice["logprobs"]["tokens"]]
    assert streamed == logprobs["tokens"]


def test_max_tokens_0_without_echo_is_an_empty_answer_and_chat_still_refuses_it(server):  # noqa: F811
    status, body = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 0})
    assert status == 200, body
    assert (body["choices"][0]["text"], body["choices"][0]["finish_reason"]) == ("", "length")
    assert body["usage"]["completion_tokens"] == 0
    status, body = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 0, "echo": True})
    assert (body["choices"][0]["text"], body["choices"][0]["logprobs"]) == (PROMPT, None)
    status, body = server.post("/v1/chat/completions", {"messages": USER, "max_tokens": 0})
    assert status == 400
    assert body["error"]["param"] == "max_tokens"
    status, body = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": -2})
    assert status == 400
