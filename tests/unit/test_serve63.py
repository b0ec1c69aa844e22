"""Serving's stop strings cut where llama-server cuts them (the one found in a token's text that starts earliest),
the Python API's ``create_completion("")`` generates from the BOS alone as llama-cpp-python's does, and the chat
route refuses a lone surrogate in a tool call with the ``not_utf8`` code every route gives it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import edgesdk
from edgesdk.api import RequestError
from edgesdk.runtime.text import StreamDecoder
from edgesdk.serve.api import ApiError, parse_chat_request
from edgesdk.serve.completion import StopMatcher

ALPHABET = "abc"


def _partial(text: str, stop: str) -> bool:
    """llama.cpp's ``string_find_partial_stop``: ``text`` ends with a start of ``stop``."""
    return any(text.endswith(stop[:size]) for size in range(1, len(stop) + 1))


def llama_server(pieces: list[str], stops: list[str]) -> tuple[str, str | None]:
    """The answer's text and stopping word as llama-server's slot makes them, reading ``pieces`` (each token's text)
    one at a time (tools/server/server-context.cpp ``process_token``): ``find_stopping_strings`` looks for each stop
    string in the unsent text from its length plus the token's before the end, and the one found that starts
    earliest (the first listed of those starting at one place) ends the text there; text that ends with a stop
    string's start is not sent until a later token settles it."""
    text, sent = "", 0
    for piece in pieces:
        text += piece
        unsent, found = text[sent:], None
        for stop in stops:
            at = unsent.find(stop, max(0, len(unsent) - len(stop) - len(piece)))
            if at >= 0 and (found is None or at < found[0]):
                found = (at, stop)
        if found is not None:
            return text[: sent + found[0]], found[1]
        if not any(_partial(unsent, stop) for stop in stops):
            sent = len(text)
    return text, None


def matched(pieces: list[str], stops: list[str]) -> tuple[str, str | None, list[tuple[str, str]]]:
    """The text a StopMatcher hands out for ``pieces`` pushed one at a time, its stop string, and after each push
    before it stopped, the text read so far and the text held back."""
    matcher, released, held = StopMatcher(tuple(stops)), [], []
    for index, piece in enumerate(pieces):
        released.append(matcher.push(piece))
        if not matcher.stopped:
            held.append(("".join(pieces[: index + 1]), matcher.pending))
    return "".join(released) + matcher.flush(), matcher.matched, held


def least_held(text: str, stops: list[str]) -> str:
    """The end of ``text`` that may still become a stop string: its longest suffix that begins one."""
    return max((text[at:] for at in range(len(text) + 1) if any(stop.startswith(text[at:]) for stop in stops)),
               key=len)


@st.composite
def cases(draw):
    pieces = draw(st.lists(st.text(alphabet=ALPHABET, max_size=4), max_size=10))
    text = "".join(pieces)
    stops = draw(st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=5), min_size=1, max_size=4))
    for _ in range(draw(st.integers(0, 2))):  # stops taken from the text, overlapping each other, so found
        if text:
            start = draw(st.integers(0, len(text) - 1))
            stops.append(text[start: start + draw(st.integers(1, 5))])
    return pieces, stops


@settings(max_examples=500, deadline=None)
@given(cases())
def test_the_text_and_stop_string_are_llama_servers_for_any_tokens(case):
    pieces, stops = case
    text, stop, held = matched(pieces, stops)
    assert (text, stop) == llama_server(pieces, stops)
    for read, pending in held:  # only what may still become a stop string is held back
        assert pending == least_held(read, stops)


def test_overlapping_stops_in_one_token_cut_at_the_one_starting_first():
    assert matched(["xabcdy"], ["abcd", "bc"])[:2] == ("x", "abcd")  # "bc" completes first, "abcd" starts first
    assert matched(["xa", "bcd"], ["bc", "abcd"])[:2] == ("x", "abcd")
    assert matched(["xab", "c", "d"], ["abcd", "bc"])[:2] == ("xa", "bc")  # "bc" whole a token before "abcd"
    assert matched(["abc"], ["abc", "ab"])[:2] == ("", "abc")  # one start: the first listed, as llama-server's
    assert matched(["abc"], ["ab", "abc"])[:2] == ("", "ab")


def _deltas(tokenizer, ids: list[int]) -> list[str]:
    decoder = StreamDecoder(tokenizer)
    return [decoder.push(token) for token in ids] + [decoder.flush()]


def _discriminating_stops(deltas: list[str]) -> list[str]:
    """Two stop strings that one token's text completes, the later-completing one starting earlier: the last
    character of a token's text and the whole of the next one (three or more characters), and that text's first
    two characters."""
    for before, delta in zip(deltas, deltas[1:], strict=False):
        if before and len(delta) >= 3:
            return [delta[:2], before[-1] + delta]
    pytest.fail(f"no token's text of three characters after another's in {deltas!r}")


def test_serve_cuts_a_real_answer_where_llama_server_does_streamed_and_whole(served, runtime):
    body = {"prompt": "The quick brown fox", "n_predict": 40, "temperature": 0, "return_tokens": True}
    status, free = served.post("/completion", body)
    assert status == 200, free
    deltas = _deltas(runtime.tokenizer, free["tokens"])
    stops = _discriminating_stops(deltas)
    expected, word = llama_server(deltas, stops)
    assert word == stops[1]
    assert expected != free["content"][: free["content"].find(stops[0])]
    status, whole = served.post("/completion", {**body, "stop": stops})
    assert status == 200, whole
    assert (whole["content"], whole["stopping_word"]) == (expected, word)
    openai = {"prompt": body["prompt"], "max_tokens": 40, "temperature": 0, "stop": stops}
    status, answer = served.post("/v1/completions", openai)
    assert status == 200
    assert answer["choices"][0]["text"] == expected
    events = served.stream("/v1/completions", openai)
    assert "".join(choice["text"] for event in events[:-1] for choice in event["choices"]) == expected


@pytest.fixture(scope="module")
def bos_bundle(tmp_path_factory):
    """A tiny bundle whose tokenizer adds a BOS to every text (Gemma's kind)."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from tests._utils.tiny import save_tiny_model_dir

    root = tmp_path_factory.mktemp("bos-bundle")
    model = save_tiny_model_dir(root / "model", tokenizer="gemma", layers=1, hidden=32, heads=2, kv_heads=1)
    return build(BuildConfig(target="host", model=str(model), out=root / "bundle",
                             export=ExportConfig(max_context=64), progress=False)).path


def test_an_empty_prompt_generates_from_the_bos_alone(bos_bundle):
    with edgesdk.load(bos_bundle, threads=1, max_tokens=3) as model:
        bos = model.tokenize("")
        assert len(bos) == 1
        answer = model.create_completion("", temperature=0)
        assert answer["usage"]["prompt_tokens"] == 1
        assert answer["choices"][0]["text"] == model.create_completion(bos, temperature=0)["choices"][0]["text"]
        streamed = "".join(chunk["choices"][0]["text"] for chunk in model.create_completion("", temperature=0,
                                                                                           stream=True))
        assert streamed == answer["choices"][0]["text"]
        assert model.create_completion("", temperature=0, echo=True)["choices"][0]["text"] == streamed


def test_an_empty_prompt_without_a_bos_is_refused_naming_why(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1, max_tokens=3) as model:
        assert model.tokenize("") == []
        with pytest.raises(RequestError) as caught:
            model.create_completion("")
    assert caught.value.param == "prompt"
    assert "adds no BOS token" in str(caught.value)


LONE = json.loads('"x\\ud800"')
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.mark.parametrize(("call", "tools"), [
    ({**CALL, "function": {"name": "f", "arguments": {"a": LONE}}}, None),
    ({**CALL, "function": {"name": LONE, "arguments": "{}"}}, None),
    ({**CALL, "id": LONE}, None),
    (CALL, [{"type": "function", "function": {"name": "f", "description": LONE, "parameters": {"type": "object"}}}]),
])
def test_a_lone_surrogate_in_a_tool_field_is_refused_as_not_utf8(call, tools):
    body = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [call]}],
            **({} if tools is None else {"tools": tools})}
    with pytest.raises(ApiError) as caught:
        parse_chat_request(body)
    assert caught.value.code == "not_utf8"
    assert "is not valid UTF-8" in caught.value.message
    assert "send each character whole" in caught.value.message


def test_the_chat_route_answers_a_lone_surrogate_in_a_call_as_the_completion_route_does(served):
    status, completion = served.post("/completion", {"prompt": LONE, "n_predict": 1})
    assert status == 400
    assert completion["error"]["code"] == "not_utf8"
    call = {**CALL, "function": {"name": "f", "arguments": {"a": LONE}}}
    status, chat = served.post("/v1/chat/completions", {"messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [call]}], "max_tokens": 1})
    assert status == 400
    assert chat["error"]["code"] == completion["error"]["code"]
    assert chat["error"]["param"] == "messages[1].tool_calls[0].function.arguments"
