"""A chat answer under tools whose text begins with a character split across several tokens, and the log line of an
answer under tools its token limit cut, on every route.

- The chat route (edgesdk/serve/openai_answer.py) placed each token before the last one of such a character at
  nothing (a zero-length span at the text's first position), so :meth:`AnswerStream.shown` left it out of
  ``logprobs.content`` where the Ollama routes list it: a token that leaves a character unfinished holds some of it.
- The log line said "the call comes back cut short", which the Ollama routes do not do (a cut call is dropped and
  its text is the content): it names what happened and each route's limit, not what the client got.
"""

from __future__ import annotations

import json
import logging

import pytest

from edgesdk.serve.api import parse_chat_request
from edgesdk.serve.completion import Completer, Completion, ServeDefaults
from edgesdk.serve.ollama import Answer, parse_chat, windowed
from edgesdk.serve.openai_answer import StreamedAnswer, whole_answer
from edgesdk.serve.tools import AnswerStream
from tests.unit.test_ollama_logprobs64 import ASK, NAME, TOOLS
from tests.unit.test_tools import LIGHT
from tests.unit.test_tools import server as tools_server  # noqa: F401 (a fixture: 2,048 tokens of context)

TOOLS_LOG = "edgesdk.serve.tools"


def _entry(data: bytes) -> dict:
    """A chat token's logprobs entry, as the completer gives them."""
    return {"token": data.decode("utf-8", "ignore"), "logprob": -1.0, "bytes": list(data), "top_logprobs": []}


def _chat_listed(runtime, tokens: list[bytes], reason: str = "stop") -> tuple[list[bytes], list[bytes], str]:
    """(the whole answer's listed tokens, the stream's, the whole answer's content) on the chat route for an answer
    of ``tokens``, each token its own piece as the completer gives them out."""
    completer = Completer(runtime, ServeDefaults(max_tokens=16))
    request = parse_chat_request({"messages": ASK, "tools": TOOLS, "logprobs": True})
    text = b"".join(tokens).decode("utf-8", "replace")
    completion = Completion(text=text, finish_reason=reason, prompt_tokens=10, completion_tokens=len(tokens),
                            logprobs={"content": [_entry(token) for token in tokens], "refusal": None})
    whole = whole_answer(completer, request, "tiny", completion)
    answer = StreamedAnswer(completer, request, "tiny")
    chunks, said = [], ""
    for index, token in enumerate(tokens):
        piece = b"".join(tokens[:index + 1]).decode("utf-8", "ignore")[len(said):]
        said += piece
        chunks += answer.piece(piece, {"content": [_entry(token)], "refusal": None})
    if said != text:
        chunks += answer.piece(text[len(said):], None)  # the decoder's last piece: a character the end cut short
    chunks += answer.closing(completion)
    choice = whole["choices"][0]
    streamed = [bytes(entry["bytes"]) for chunk in chunks for c in chunk["choices"]
                for entry in ((c.get("logprobs") or {}).get("content") or [])]
    return [bytes(entry["bytes"]) for entry in choice["logprobs"]["content"]], streamed, choice["message"]["content"]


@pytest.mark.parametrize(("tokens", "listed"), [
    # U+EC95 is three bytes, each its own token (the tiny model's seed-1 answer begins so)
    ([b'{"', b"response", b'": "', b"\xee", b"\xb2", b"\x95ok", b'"}'], [b"\xee", b"\xb2", b"\x95ok"]),
    ([b'{"response": "', b"\xc3", b"\xa9t\xc3\xa9", b'"}'], [b"\xc3", b"\xa9t\xc3\xa9"]),
    # the quote and the first byte in one token, the rest in the next
    ([b'{"response": "\xe2', b"\x82\xac5", b'"}'], [b'{"response": "\xe2', b"\x82\xac5"]),
])
def test_a_text_beginning_with_a_character_of_several_tokens_lists_them_all(runtime, tokens, listed):
    whole, streamed, content = _chat_listed(runtime, tokens)
    assert content == b"".join(listed).decode().removeprefix('{"response": "')
    assert whole == listed  # was the last token of the first character alone (and those after it)
    assert streamed == listed


def test_a_character_split_inside_the_text_and_one_the_end_cut_stay_listed(runtime):
    """Those were listed before too (each span reaches past the text's first position): unchanged."""
    tokens = [b'{"response": "', b"a", b"\xee", b"\xb2", b"\x95", b"b\xc3"]
    whole, streamed, content = _chat_listed(runtime, tokens, reason="length")
    assert content.startswith("a\uec95b")
    assert whole == tokens[1:]
    assert streamed == whole


def _ollama_entries(body: dict) -> list[list[int]]:
    return [entry["bytes"] for entry in body.get("logprobs", [])]


def test_served_chat_route_lists_the_tokens_the_ollama_route_lists(tools_server):  # noqa: F811
    """The same sampled text answer on /api/chat and /v1/chat/completions, whole and streamed, lists the same tokens
    where its text begins with a character of several tokens (seed 1 of the tiny model's answers does)."""
    split = 0
    for seed in range(8):
        messages = [{"role": "user", "content": "Lamp?"}]
        status, ollama = tools_server.post("/api/chat", {
            "model": NAME, "messages": messages, "tools": [LIGHT], "logprobs": True, "top_logprobs": 1,
            "stream": False, "options": {"num_predict": 30, "seed": seed, "temperature": 1}})
        assert status == 200, ollama
        content = ollama["message"]["content"]
        if not content or content.startswith('{"tool_call"') or len(content[0].encode()) == 1:
            continue  # a call, or a text whose first character is one byte
        chat_body = {"messages": messages, "tools": [LIGHT], "logprobs": True, "top_logprobs": 1, "max_tokens": 30,
                     "seed": seed, "temperature": 1}
        status, chat = tools_server.post("/v1/chat/completions", chat_body)
        assert status == 200, chat
        choice = chat["choices"][0]
        if choice["message"]["content"].rstrip("\ufffd") != content:
            continue  # not the same answer
        listed = _ollama_entries(ollama)
        if not listed or len(bytes(listed[0]).decode("utf-8", "ignore")) > 0:
            continue  # its first token holds a whole character
        split += 1
        chat_listed = [entry["bytes"] for entry in choice["logprobs"]["content"]]
        assert chat_listed == listed  # was the tail of Ollama's: the first character's earlier tokens left out
        status, _, payload = tools_server.request("POST", "/v1/chat/completions", {**chat_body, "stream": True})
        assert status == 200, payload
        events = [json.loads(line[len(b"data: "):]) for line in payload.splitlines()
                  if line.startswith(b"data: {")]
        streamed = [entry["bytes"] for event in events for c in event["choices"]
                    for entry in ((c.get("logprobs") or {}).get("content") or [])]
        assert streamed == listed
    assert split, "no seed gave a same text answer beginning with a character of several tokens"


# ------------------------------------------------------------------------------------------- the log line


def _cut_lines(caplog, read) -> tuple[list[str], object]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=TOOLS_LOG):
        result = read()
    lines = [record.getMessage() for record in caplog.records if record.name == TOOLS_LOG]
    assert len(lines) == 1, lines
    return lines, result


@pytest.mark.parametrize("text", [
    '{"tool_call": {"name": "multiply", "arguments": {"a": 3',  # a call's name whole, its arguments not
    '{"tool_call": {"na',  # nothing whole
])
def test_the_cut_line_claims_nothing_the_ollama_route_does_not_do(runtime, caplog, text):
    """On /api/chat a call the limit cut is no call and its text is the content (Ollama's parser finds no call):
    the line names the limit each route takes and says nothing of what comes back."""
    completer = Completer(runtime, ServeDefaults(max_tokens=16))
    asked = parse_chat({"model": NAME, "messages": ASK, "tools": TOOLS, "stream": False}, NAME)
    completion = Completion(text=text, finish_reason="length", prompt_tokens=10, completion_tokens=12)
    lines, body = _cut_lines(caplog, lambda: Answer(completer, asked, windowed(completer, asked)).whole(completion))
    assert "tool_calls" not in body["message"]
    assert body["done_reason"] == "length"
    line = lines[0]
    assert "comes back" not in line  # was "the call comes back cut short" (here it is the content)
    assert "empty content" not in line
    for limit in ("max_tokens", "num_predict", "max_output_tokens"):
        assert limit in line
    assert "\n" not in line


def test_the_cut_line_is_the_same_for_the_chat_route_s_reading(caplog):
    stream = AnswerStream(False)
    stream.push('{"tool_call": {"name": "multiply", "arguments": {"a": 3')
    lines, (_, fields, finish) = _cut_lines(caplog, lambda: stream.finish("length"))
    assert (finish, fields["tool_calls"][0]["function"]["name"]) == ("length", "multiply")  # the partial call
    assert "comes back" not in lines[0]
    assert "num_predict" in lines[0]
