"""The log-probabilities of an answer under tools on ``POST /v1/responses`` (edgesdk/serve/response_events.py).

The answer is JSON around a call or a text (edgesdk/serve/tools.py), which the client never sees. The chat route's
``logprobs.content`` lists the tokens of the message's text alone (tests/unit/test_tool_answers64.py); the Responses
route's ``output_text`` logprobs listed every token of the JSON (``{"``, ``response``, ``":``, ...). They now list
what the chat route's do, less a thinking model's reasoning (the reasoning item's), whole and streamed alike, and
``output_tokens`` still counts every token the answer took.

The unit tests feed :class:`Output` an answer's tokens as the completer hands them; the last one runs a tiny
bundle on a real server and compares the two routes.
"""

from __future__ import annotations

import pytest

from edgesdk.serve.completion import Completion
from edgesdk.serve.response_events import Output
from edgesdk.serve.responses import parse_responses_request

LOGPROBS = ["message.output_text.logprobs"]
TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
FORMAT = {"type": "json_schema", "name": "answer", "schema": {"type": "object"}}
TEXT = ["Sun", "ny", " in", " Par", "is"]
ANSWERS = {  # the answer's tokens, those of its message's text
    "text": (['{"', "response", '":', ' "', *TEXT, '"}'], TEXT),
    # a token that holds the JSON's end and the text's start is the text's, as one holding its close is
    "straddling": (['{"', "response", '":"', "S", "unny", ' in Paris"', "}"], ["S", "unny", ' in Paris"']),
    "escaped": (['{"', "response", '":', ' "', "say", ' \\"', "hi", '\\"', '"}'], ["say", ' \\"', "hi", '\\"']),
    "thinking": (["<think>", "\n", "The", " user", "\n", "</think>", "\n\n", '{"', "response", '":', ' "', *TEXT,
                  '"}'], TEXT),
}


def _entry(token: str) -> dict:
    data = list(token.encode())
    return {"token": token, "logprob": -0.5, "bytes": data, "top_logprobs": [
        {"token": token, "logprob": -0.5, "bytes": data}]}


def _output(**fields) -> Output:
    asked = parse_responses_request({"model": "m", "input": "Weather?", "tools": [TOOL], "include": LOGPROBS,
                                     **fields})
    return Output(asked, "m", 0.0, 1.0, count_tokens=len, think_opened=False)


def _completion(tokens: list[str], finish_reason: str = "stop") -> Completion:
    return Completion("".join(tokens), finish_reason, 10, len(tokens) + (finish_reason == "stop"), 0,
                      {"content": [_entry(token) for token in tokens]})


def _streamed(tokens: list[str], size: int, completion: Completion, **fields) -> list[tuple[str, dict]]:
    """The events of the answer pushed ``size`` tokens at a time, each piece with its tokens' logprobs."""
    output = _output(**fields)
    events = output.start()
    for at in range(0, len(tokens), size):
        piece = tokens[at:at + size]
        events += output.push("".join(piece), {"content": [_entry(token) for token in piece]})
    return events + output.end(completion)


def _tokens(entries: list[dict]) -> list[str]:
    return [entry["token"] for entry in entries]


@pytest.mark.parametrize("form", ANSWERS)
def test_a_text_answer_s_message_lists_its_text_s_tokens_not_the_json_s(form):
    tokens, said = ANSWERS[form]
    completion = _completion(tokens)
    whole = _output().whole(completion)
    (part,) = whole["output"][-1]["content"]
    assert _tokens(part["logprobs"]) == said
    assert whole["usage"]["output_tokens"] == len(tokens) + 1  # every token counted, the JSON's too
    for size in (1, 2, 3, len(tokens)):
        events = _streamed(tokens, size, completion)
        deltas = [data for name, data in events if name == "response.output_text.delta"]
        assert _tokens([entry for delta in deltas for entry in delta["logprobs"]]) == said, size  # each once
        (done,) = [data for name, data in events if name == "response.output_text.done"]
        assert _tokens(done["logprobs"]) == said, size
        assert _tokens(events[-1][1]["response"]["output"][-1]["content"][0]["logprobs"]) == said, size
    # token by token, given as the text goes out, not held to the end
    first = [data for name, data in _streamed(tokens, 1, completion) if name == "response.output_text.delta"]
    assert len([delta for delta in first if delta["logprobs"]]) > 1


def test_a_structured_answer_s_message_lists_its_value_s_tokens():
    """A ``text.format`` schema's value is the content (its braces too), the JSON around it is not."""
    tokens = ['{"', "response", '":', " {", '"a"', ":", " 1", "}", "}"]
    whole = _output(text={"format": FORMAT}).whole(_completion(tokens))
    (part,) = whole["output"][-1]["content"]
    assert part["text"] == '{"a": 1}'
    assert _tokens(part["logprobs"]) == [" {", '"a"', ":", " 1", "}"]


def test_a_text_cut_by_the_token_limit_lists_the_tokens_written_so_far():
    tokens = ['{"', "response", '":', ' "', "Sun", "ny", " in"]
    completion = _completion(tokens, "length")
    whole = _output().whole(completion)
    assert whole["status"] == "incomplete"
    assert _tokens(whole["output"][-1]["content"][0]["logprobs"]) == ["Sun", "ny", " in"]
    streamed = _streamed(tokens, 2, completion)[-1][1]["response"]
    assert _tokens(streamed["output"][-1]["content"][0]["logprobs"]) == ["Sun", "ny", " in"]


@pytest.mark.parametrize("finish_reason", ["stop", "length"])
def test_a_call_or_an_answer_cut_before_its_text_lists_none(finish_reason):
    """A call has no message; an answer the limit cut in its JSON's start has an empty one, with no token."""
    tokens = ['{"', "tool_call", '":', ' {"', "name", '":', ' "', "get_weather", '",', ' "', "arguments", '":',
              " {}", "}}"] if finish_reason == "stop" else ['{"', "response", '":']
    completion = _completion(tokens, finish_reason)
    for response in (_output().whole(completion), _streamed(tokens, 1, completion)[-1][1]["response"]):
        items = response["output"]
        if finish_reason == "stop":
            assert [item["type"] for item in items] == ["function_call"]
        else:
            assert [(item["type"], item["content"][0]["text"], item["content"][0]["logprobs"]) for item in items] == [
                ("message", "", [])]


# ------------------------------------------------------------------------------------------- a real server

openai = pytest.importorskip("openai")

from tests.unit.test_openai_client37 import USER, no_whitespace, runtime, server  # noqa: E402,F401 (fixtures)
from tests.unit.test_serve_responses_strict38 import events_of  # noqa: E402
from tests.unit.test_tool_stream_parity38 import unquoted  # noqa: E402,F401 (a fixture)
from tests.unit.test_tools_response_format37 import TICK, answering  # noqa: E402,F401 (a fixture)


def test_the_responses_route_lists_what_the_chat_route_lists_whole_and_streamed(server, unquoted):  # noqa: F811
    """A text answer under tools that no quote can close, cut by the token limit: several tokens of text."""
    chat = {"messages": USER, "tools": [TICK], "logit_bias": unquoted, "logprobs": True, "top_logprobs": 2,
            "max_tokens": 32, "cache_prompt": False}  # each answer from the prompt, not its cache: the same floats
    status, answer = server.post("/v1/chat/completions", chat)
    assert status == 200, answer
    listed = answer["choices"][0]["logprobs"]["content"]
    assert listed
    assert answer["choices"][0]["finish_reason"] == "length"

    tick = {"type": "function", **{key: TICK["function"][key] for key in ("name", "description", "parameters")}}
    body = {"model": "tiny", "input": USER[0]["content"], "tools": [tick], "logit_bias": unquoted,
            "include": LOGPROBS, "top_logprobs": 2, "max_output_tokens": 32, "cache_prompt": False}
    status, whole = server.post("/v1/responses", body)
    assert status == 200, whole
    (part,) = whole["output"][0]["content"]
    assert part["text"] == answer["choices"][0]["message"]["content"]
    assert part["logprobs"] == listed  # the text's tokens, none of the JSON's
    assert whole["usage"]["output_tokens"] == answer["usage"]["completion_tokens"]

    shaped = [{"token": entry["token"], "logprob": entry["logprob"],
               "top_logprobs": [{"token": top["token"], "logprob": top["logprob"]} for top in entry["top_logprobs"]]}
              for entry in listed]
    events = events_of(server, body)
    deltas = [data for name, data in events if name == "response.output_text.delta"]
    assert [entry for delta in deltas for entry in delta["logprobs"]] == shaped
    (done,) = [data for name, data in events if name == "response.output_text.done"]
    assert done["logprobs"] == shaped



def _byte_entry(data: bytes) -> dict:
    token = data.decode("utf-8", "replace")
    return {"token": token, "logprob": -0.5, "bytes": list(data), "top_logprobs": [
        {"token": token, "logprob": -0.5, "bytes": list(data)}]}


def test_a_text_beginning_with_a_character_of_several_tokens_lists_each_of_them():
    """A text whose first character (U+EC95, three UTF-8 bytes) comes in three tokens: each token before the last
    had spanned nothing at the text's first position and was left out; each now reaches into the character it
    begins, as on the chat and Ollama routes (edgesdk/serve/tools.py TokenSpans)."""
    pieces = [b'{"', b"response", b'":"', b"\xee", b"\xb2", b"\x95ok", b'"}']
    said = [b"\xee", b"\xb2", b"\x95ok"]
    text = b"".join(pieces).decode()
    completion = Completion(text, "stop", 10, len(pieces) + 1, 0, {"content": [_byte_entry(p) for p in pieces]})
    (part,) = _output().whole(completion)["output"][-1]["content"]
    assert [bytes(entry["bytes"]) for entry in part["logprobs"]] == said
    output = _output()
    events = output.start()
    for piece in pieces:
        events += output.push(piece.decode("utf-8", "replace") if piece not in (b"\xee", b"\xb2") else "",
                              {"content": [_byte_entry(piece)]})
    events += output.end(completion)
    deltas = [data for name, data in events if name == "response.output_text.delta"]
    # the deltas' entries carry no bytes: their tokens, the three of the character and no JSON's
    assert _tokens([entry for delta in deltas for entry in delta["logprobs"]]) == [_byte_entry(p)["token"] for p in said]
