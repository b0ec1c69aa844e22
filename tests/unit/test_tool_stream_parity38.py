"""A streamed answer under tools on /v1/chat/completions goes out as llama-server streams one (common/chat.cpp,
``common_chat_msg_diff::compute_diffs``; tools/server/server-task.cpp, ``to_json_oaicompat_chat_stream``): a call's
``id``, ``type`` and ``function.name`` in its first delta, then its arguments in pieces; a text answer's content as
it is written. The deltas, accumulated, are the whole answer's message, and nothing else is ever sent. The stream's
``timings`` ride on its last event, the usage chunk where ``stream_options.include_usage`` asks for one."""

from __future__ import annotations

import json

import pytest

from edgesdk.serve.tools import AnswerStream, answer_message, read_answer
from tests._utils.chat_stream import accumulated_message

openai = pytest.importorskip("openai")

from tests.unit.test_openai_client37 import TIME, USER, client, no_whitespace, runtime, server  # noqa: E402,F401
from tests.unit.test_tools_response_format37 import FORMAT, TICK, answering, calling  # noqa: E402,F401

LOOSE_TIME = {"type": "function", "function": {k: v for k, v in TIME["function"].items() if k != "strict"}}


def _without_ids(message: dict) -> dict:
    calls = [{**call, "id": call["id"].startswith("call_")} for call in message.get("tool_calls") or []]
    return {**message, **({"tool_calls": calls} if calls else {})}


def _streamed(server, body: dict) -> tuple[list[dict], dict, str]:  # noqa: F811
    """(the stream's chunks, the message its deltas build, its finish reason)."""
    events = server.stream("/v1/chat/completions", body)
    chunks = events[:-1]
    choices = [chunk["choices"][0] for chunk in chunks if chunk["choices"]]
    finishes = [choice["finish_reason"] for choice in choices if choice["finish_reason"]]
    assert len(finishes) == 1
    assert choices[-1]["finish_reason"] == finishes[0]
    return chunks, accumulated_message([choice["delta"] for choice in choices]), finishes[0]


# ------------------------------------------------------------------------------------------- the reader


WHOLE = [  # answers as the schema lets a model write them (escapes, pairs, numbers, spacing of any kind)
    '{"tool_call": {"name": "get_time", "arguments": {"city": "Oslo", "hour24": true}}}',
    '{"tool_call":{"name":"f","arguments":{"a":"x\\"y\\\\z\\n\\u00e9\\ud83d\\ude00\\ud83d\\/","b":[1,2.50,-0,'
    '1E5,-0.0,true,null,{},[]],"c":{"d":[false]}}}}',
    '{\n  "tool_call": {\n    "name": "ping",\n    "arguments": {}\n  }\n}',
    '{"response": "Hel\\u006co \\"w\\"\\ud83d\\ude00\\t!"}',
    '{"response": ""}',
    ' {"response": "tool_call"} ',
]
STRUCTURED = ['{"response": {"answer": "yes",\n  "n": 4}\n}', '{"response":[1, {"a": "\\u00e9"}, -2.50e3]}',
              '{"response": 12}', '{"response": "x\\"y"}']


def _stream(text: str, finish_reason: str, cuts: list[int], structured: bool = False):
    answer, deltas, start = AnswerStream(structured), [{"role": "assistant", "content": None}], 0
    for cut in [*cuts, len(text)]:
        deltas += answer.push(text[start:cut])
        start = cut
    rest, fields, finish = answer.finish(finish_reason)
    return accumulated_message(deltas + rest), {"role": "assistant", **fields}, finish


@pytest.mark.parametrize(("text", "structured"), [(text, False) for text in WHOLE] +
                         [(text, True) for text in STRUCTURED])
def test_every_way_of_streaming_an_answer_builds_the_whole_answer_s_message(text, structured):
    fields, finish = answer_message(text, "stop", structured)
    content, calls = read_answer(text, True, structured)  # the whole answer as it has always been read
    if calls is None:
        assert (fields, finish) == ({"content": content}, "stop")
    else:
        assert (fields["content"], fields["tool_calls"][0]["function"], finish) == (
            None, calls[0]["function"], "tool_calls")
    whole = _without_ids({"role": "assistant", **fields})
    for cuts in [[], list(range(1, len(text)))] + [list(range(step, len(text), step)) for step in (2, 3, 5, 7)]:
        message, built, built_finish = _stream(text, "stop", cuts, structured)
        assert (_without_ids(message), _without_ids(built), built_finish) == (whole, whole, finish), cuts


@pytest.mark.parametrize(("text", "structured"), [(text, False) for text in WHOLE] +
                         [(text, True) for text in STRUCTURED])
def test_an_answer_cut_anywhere_streams_what_its_whole_answer_holds(text, structured):
    """Cut by max_tokens (or a stop string) at any character: the stream, fed character by character, builds the
    message the whole answer gives, and each chunk only adds to it."""
    for end in range(len(text) + 1):
        for reason in ("length", "stop"):
            cut = text[:end]
            message, built, _ = _stream(cut, reason, list(range(1, len(cut))), structured)
            fields, finish = answer_message(cut, reason, structured)
            assert _without_ids(message) == _without_ids(built) == _without_ids({"role": "assistant", **fields}), cut
            if end < len(text.rstrip()):
                assert finish == reason


def test_a_cut_answer_keeps_what_was_streamed_and_before_that_is_empty():
    # llama-server reads an answer cut by max_tokens as partial (tools/server/server-context.cpp,
    # update_chat_msg: is_partial unless the answer ended with end-of-generation): the call or text begun stands
    head = '{"tool_call": {"name": "get_time", "arguments": {"city": "Os'
    fields, finish = answer_message(head, "length")
    assert (fields["content"], fields["tool_calls"][0]["function"], finish) == (
        None, {"name": "get_time", "arguments": '{"city": "Os'}, "length")
    fields, _ = answer_message('{"tool_call": {"name": "get_time"', "length")  # the name is whole: the call begun
    assert fields["tool_calls"][0]["function"] == {"name": "get_time", "arguments": ""}
    assert answer_message('{"response": "Hi th', "length") == ({"content": "Hi th"}, "length")
    assert answer_message('{"response": "Hi"', "length") == ({"content": "Hi"}, "length")
    # held back, so not in the message: a number that may go on, an escape, a high surrogate's pair
    assert answer_message('{"tool_call": {"name": "f", "arguments": {"n": 12', "length")[0]["tool_calls"][0][
        "function"]["arguments"] == '{"n": '
    assert answer_message('{"response": "a\\u00e', "length") == ({"content": "a"}, "length")
    assert answer_message('{"response": "a\\ud83d', "length") == ({"content": "a"}, "length")
    # nothing of the call or the text begun yet: an empty content, not the envelope's JSON (llama-server's partial
    # parse of its generic format gives nothing for it; read_answer still gives the text)
    for text in ('{"tool_call": {"name": "get_ti', '{"response": ', '{"resp', ""):
        assert answer_message(text, "length") == ({"content": ""}, "length")
    assert read_answer(head, False) == (head, None)


def test_nothing_held_back_is_sent_until_it_is_settled():
    answer = AnswerStream()
    assert answer.push('{"tool_call": {"name": "get') == []  # "get" may be "get_time" yet
    (first,) = answer.push('_time"')
    (call,) = first["tool_calls"]
    assert (call["index"], call["type"], call["function"]) == (0, "function", {"name": "get_time", "arguments": ""})
    assert call["id"].startswith("call_")
    assert answer.push(', "arguments": {"hour') == [{"tool_calls": [{"index": 0, "function": {"arguments": '{"hour'}}]}]
    assert answer.push('24": tr') == [{"tool_calls": [{"index": 0, "function": {"arguments": '24": '}}]}]
    assert answer.push('ue, "n": 1') == [{"tool_calls": [{"index": 0, "function": {"arguments": 'true, "n": '}}]}]
    assert answer.push('0}}}') == [{"tool_calls": [{"index": 0, "function": {"arguments": '10}'}}]}]
    assert answer.finish("stop")[0] == []
    text = AnswerStream()
    assert text.push('{"response": "') == []
    assert text.push('a\\') == [{"content": "a"}]
    assert text.push('"b"}') == [{"content": '"b'}]
    assert text.finish("stop") == ([], {"content": 'a"b'}, "stop")
    empty = AnswerStream()
    assert empty.push('{"response": ""}') == []
    assert empty.finish("stop") == ([{"content": ""}], {"content": ""}, "stop")


def test_a_key_written_twice_streams_as_the_whole_answer_gives_it():
    """A schema with additionalProperties lets a key be written twice; the arguments stay as written (JSON's
    readers keep the last value, as json.loads does), whole and streamed alike."""
    text = '{"tool_call": {"name": "f", "arguments": {"a": 1, "a": [2]}}}'
    fields, _ = answer_message(text, "stop")
    assert fields["tool_calls"][0]["function"]["arguments"] == '{"a": 1, "a": [2]}'
    assert json.loads(fields["tool_calls"][0]["function"]["arguments"]) == {"a": [2]}
    message, built, _ = _stream(text, "stop", list(range(1, len(text))))
    assert _without_ids(message) == _without_ids(built) == _without_ids({"role": "assistant", **fields})


# ------------------------------------------------------------------------------------------- served


@pytest.fixture(scope="module")
def unquoted(runtime, answering):  # noqa: F811
    """``logit_bias`` that leaves the {"response": "..."} option, and no token holding a quote within its text:
    the text goes on until max_tokens cuts it."""
    tokenizer = runtime.tokenizer.tokenizer
    return {**answering, **{str(token): -100 for token in range(tokenizer.get_vocab_size())
                            if '"' in tokenizer.decode([token])}}


FORMS = {  # each form the tiny model is led to answer in
    "required call": lambda biases: {"tools": [TIME, TICK], "tool_choice": "required", "logit_bias": biases[0]},
    "named call": lambda biases: {"tools": [TIME, TICK], "logit_bias": biases[0],
                                  "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
    "call chosen": lambda biases: {"tools": [TICK], "logit_bias": biases[2]},
    "empty text": lambda biases: {"tools": [TICK], "logit_bias": biases[1]},
    "text cut": lambda biases: {"tools": [TICK], "logit_bias": biases[3], "max_tokens": 40},
    "structured": lambda biases: {"tools": [TICK], "logit_bias": biases[1], "response_format": FORMAT},
    "json_object": lambda biases: {"tools": [TICK], "logit_bias": biases[1], "max_tokens": 40,
                                   "response_format": {"type": "json_object"}},
}


@pytest.mark.parametrize("parallel", [None, True, False])
@pytest.mark.parametrize("form", list(FORMS))
def test_the_stream_builds_the_whole_answer_s_message(server, client, no_whitespace, answering, calling,  # noqa: F811
                                                      unquoted, form, parallel):
    body = {"messages": USER, **FORMS[form]((no_whitespace, answering, calling, unquoted))}
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    status, whole = server.post("/v1/chat/completions", body)
    assert status == 200, whole
    expected, finish = whole["choices"][0]["message"], whole["choices"][0]["finish_reason"]
    assert ("tool_calls" in expected) == (form.endswith("call") or form == "call chosen")

    chunks, message, streamed_finish = _streamed(server, body)
    assert (_without_ids(message), streamed_finish) == (_without_ids(expected), finish)
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"]]
    assert deltas[0] == {"role": "assistant", "content": None}
    pieces = [piece for delta in deltas for piece in delta.get("tool_calls") or []]
    if pieces:  # id, type and name in each call's first delta only (parallel_tool_calls: several calls, each
        # under its own index), then the arguments in pieces
        assert {"id", "type", "function"} <= set(pieces[0])
        firsts = [piece for piece in pieces if "id" in piece]
        assert [piece["index"] for piece in firsts] == list(range(len(message["tool_calls"])))
        assert parallel or len(firsts) == 1
        assert all({"type", "function"} <= set(piece) and "name" in piece["function"] for piece in firsts)
        assert not any("type" in piece or "name" in piece["function"] for piece in pieces if "id" not in piece)
        assert len(pieces) > (2 if pieces[0]["function"]["name"] == "get_time" else 1)
    elif form != "empty text":
        assert len([delta for delta in deltas if delta.get("content")]) > 1  # the text as it is written

    asked = {key: value for key, value in body.items() if key not in ("messages", "max_tokens")}
    if "max_tokens" in body:
        asked["max_completion_tokens"] = body["max_tokens"]
    if asked.get("response_format") == FORMAT:  # the client's stream helper parses a json_schema format itself
        asked.pop("response_format")
        asked["extra_body"] = {"response_format": FORMAT}
    expected = _without_ids({key: value for key, value in expected.items() if value is not None})
    with client.chat.completions.stream(model="tiny", messages=USER, **asked) as stream:
        try:
            for _ in stream:
                pass
        except openai.LengthFinishReasonError:  # the helper refuses a cut call of a strict tool as it streams (the
            assert finish == "length"  # greedy tiny model, let make parallel calls, makes them until max_tokens)
            return
        snapshot = stream.current_completion_snapshot.choices[0]  # the deltas as the helper accumulates them
        built = [(snapshot.message, snapshot.finish_reason)]
        if finish != "length":  # the helper refuses to finish a cut answer (LengthFinishReasonError)
            final = stream.get_final_completion().choices[0]
            built.append((final.message, final.finish_reason))
    for message, reason in built:
        helper = message.model_dump(exclude={"parsed"}, exclude_none=True)
        for call in helper.get("tool_calls") or []:
            call["function"].pop("parsed_arguments", None)
            call.pop("index", None)
        assert (_without_ids(helper), reason) == (expected, finish)


def cut_inside_arguments(server, chat: dict, marker: str) -> int:  # noqa: F811
    """A token limit that cuts the chat route's answer to ``chat`` (a call) one token after ``marker`` was written
    in its arguments: the least limit whose cut call's arguments, as the message spells them, hold ``marker``, plus
    one. A call lists none of its tokens (its logprobs are null, as its content is), so the limit is searched for:
    the greedy answer a limit cuts holds the one a smaller limit cuts."""
    status, whole = server.post("/v1/chat/completions", chat)
    assert status == 200, whole

    def holds(limit: int) -> bool:
        status, answer = server.post("/v1/chat/completions", {**chat, "max_tokens": limit})
        assert status == 200, answer
        calls = answer["choices"][0]["message"].get("tool_calls") or []
        return bool(calls) and marker in calls[0]["function"]["arguments"]

    low, high = 1, whole["usage"]["completion_tokens"]
    assert holds(high), f"{marker!r} never written: {whole['choices'][0]['message']}"
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if holds(middle) else (middle + 1, high)
    return low + 1


def test_a_call_cut_by_max_tokens_ends_as_the_whole_answer_ends(server, no_whitespace):  # noqa: F811
    body = {"messages": USER, "tools": [LOOSE_TIME], "tool_choice": "required", "logit_bias": no_whitespace}
    status, whole = server.post("/v1/chat/completions", body)
    assert status == 200, whole
    full = whole["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    cut_at = cut_inside_arguments(server, body, '"city": "')  # a token into the city's name: mid-arguments
    cut = {**body, "max_tokens": cut_at}
    status, answer = server.post("/v1/chat/completions", cut)
    assert status == 200, answer
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_time"
    assert full.startswith(call["function"]["arguments"])
    assert '"city": "' in call["function"]["arguments"]
    assert call["function"]["arguments"] != full
    _, message, finish = _streamed(server, cut)
    assert (_without_ids(message), finish) == (_without_ids(choice["message"]), "length")


def test_a_call_cut_by_a_stop_string_ends_as_the_whole_answer_ends(server, no_whitespace):  # noqa: F811
    body = {"messages": USER, "tools": [LOOSE_TIME], "tool_choice": "required", "logit_bias": no_whitespace,
            "stop": ["hour24"]}
    status, whole = server.post("/v1/chat/completions", body)
    assert status == 200, whole
    choice = whole["choices"][0]
    (call,) = choice["message"]["tool_calls"]
    assert (choice["finish_reason"], choice["message"]["content"]) == ("stop", None)
    assert call["function"]["arguments"].startswith('{"city": "')
    assert call["function"]["arguments"].endswith('", "')  # the key cut off; its opening quote was settled
    _, message, finish = _streamed(server, body)
    assert (_without_ids(message), finish) == (_without_ids(choice["message"]), "stop")


@pytest.mark.parametrize("tools", [False, True])
@pytest.mark.parametrize("usage", [False, True])
def test_the_timings_ride_on_the_stream_s_last_event(server, no_whitespace, usage, tools):  # noqa: F811
    body = {"messages": USER, "max_tokens": 6}
    if tools:
        body.update(tools=[TIME], tool_choice="required", logit_bias=no_whitespace, max_tokens=60)
    if usage:
        body["stream_options"] = {"include_usage": True}
    status, whole = server.post("/v1/chat/completions", body)
    assert status == 200, whole
    chunks = server.stream("/v1/chat/completions", body)[:-1]
    timed = [index for index, chunk in enumerate(chunks) if "timings" in chunk]
    assert timed == [len(chunks) - 1]  # the last event only
    last = chunks[-1]
    if usage:  # llama-server: the usage chunk is the last, and carries them
        assert (last["choices"], last["usage"]["completion_tokens"]) == ([], whole["usage"]["completion_tokens"])
        assert chunks[-2]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    else:
        assert last["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert last["timings"]["predicted_n"] == whole["usage"]["completion_tokens"]
    assert last["timings"]["prompt_n"] + last["timings"]["cache_n"] == whole["usage"]["prompt_tokens"]


def test_every_token_s_logprobs_are_streamed_once(server, unquoted):  # noqa: F811
    """A text answer under tools (one max_tokens cuts, so that it has several tokens): each token of its text
    streamed once, in order, as the whole answer lists them (a call lists none: its content is null, its JSON no
    message's; tests/unit/test_tool_answers64.py)."""
    body = {"messages": USER, "tools": [TIME], "logit_bias": unquoted, "logprobs": True, "top_logprobs": 2,
            "max_tokens": 32, "cache_prompt": False}  # the same prompt run whole, not from its cache: the same floats
    status, whole = server.post("/v1/chat/completions", body)
    assert status == 200, whole
    listed = whole["choices"][0]["logprobs"]["content"]
    chunks = server.stream("/v1/chat/completions", body)[:-1]
    entries = [entry for chunk in chunks for choice in chunk["choices"]
               for entry in ((choice.get("logprobs") or {}).get("content") or [])]
    assert entries == listed
    assert len([chunk for chunk in chunks if (chunk["choices"][0].get("logprobs") or {}).get("content")]) > 1
    assert all(len(entry["top_logprobs"]) == 2 for entry in entries)
    content = whole["choices"][0]["message"]["content"]
    spelled = b"".join(bytes(entry["bytes"]) for entry in entries).decode("utf-8", "replace")
    assert content
    assert content in spelled  # every token of the text, none of the JSON before it
    assert '"response"' not in spelled
