"""Ollama's ``logprobs`` on /api/chat under ``tools`` (edgesdk/serve/ollama.py), whole and streamed.

They listed every token of the answer, the JSON this server wraps a text answer in (``{"response": "...``) too,
where the chat route lists the text's tokens only. Ollama's ChatHandler lists the logprobs of every token the model
writes, a call's included (server/routes.go sends them while its tool parser buffers the call), so its tokens spell
the thinking, the content and the call's text: here a text answer's tokens are its text's, and a call's (its JSON,
the form the prompt asks the model to call in) are all listed, a call ``num_predict`` cut short (its text the
content) too."""

from __future__ import annotations

import json

import pytest

from edgesdk.serve.completion import Completer, Completion, ServeDefaults
from edgesdk.serve.ollama import Answer, parse_chat, windowed
from tests.unit.test_tools import LIGHT
from tests.unit.test_tools import server as tools_server  # noqa: F401 (a fixture: 2,048 tokens of context)

NAME = "tiny-host"
TOOLS = [{"type": "function", "function": {"name": "multiply", "description": "Multiply two numbers.",
                                           "parameters": {"type": "object", "required": ["a", "b"],
                                                          "properties": {"a": {"type": "integer"},
                                                                         "b": {"type": "integer"}}}}}]
ASK = [{"role": "user", "content": "What is 3 times 4?"}]


def _entry(data: bytes) -> dict:
    """A token's logprobs entry, as the completer gives them (llama-server's completion_probabilities)."""
    return {"token": data.decode("utf-8", "replace"), "logprob": -1.0, "bytes": list(data), "top_logprobs": []}


def _answer(runtime, stream: bool) -> Answer:
    completer = Completer(runtime, ServeDefaults(max_tokens=16))
    asked = parse_chat({"model": NAME, "messages": ASK, "tools": TOOLS, "stream": stream, "logprobs": True}, NAME)
    return Answer(completer, asked, windowed(completer, asked))


def _told(runtime, tokens: list[bytes], text: str, reason: str) -> tuple[dict, list[dict]]:
    """The whole answer and the stream's objects for an answer of ``tokens`` (``text``, as the completer decodes
    them: a character the end cut short is U+FFFD), each token its own piece as the completer gives them out."""
    completion = Completion(text=text, finish_reason=reason, prompt_tokens=10, completion_tokens=len(tokens),
                            logprobs=[_entry(token) for token in tokens])
    whole = _answer(runtime, stream=False).whole(completion)
    answer = _answer(runtime, stream=True)
    lines: list[dict] = []
    on_text = answer.listener(lines.append)
    said = ""
    for index, token in enumerate(tokens):
        piece = b"".join(tokens[:index + 1]).decode("utf-8", "ignore")[len(said):]
        said += piece
        on_text(piece, [_entry(token)])
    if said != text:
        on_text(text[len(said):], None)  # the decoder's last piece: a character the end cut short
    return whole, lines + answer.closing(completion)


def _listed(body: dict) -> list[bytes]:
    return [bytes(entry["bytes"]) for entry in body.get("logprobs", [])]


def _streamed(objects: list[dict]) -> list[bytes]:
    return [data for body in objects for data in _listed(body)]


@pytest.mark.parametrize(("tokens", "text", "listed"), [
    ([b'{"', b"response", b'": "', b"Hi", b" there", b'"}'], "Hi there", [b"Hi", b" there"]),
    # a character of two tokens begins the text: both are the text's
    ([b'{"response": "', b"\xc3", b"\xa9t\xc3\xa9", b'"}'], "\u00e9t\u00e9", [b"\xc3", b"\xa9t\xc3\xa9"]),
])
def test_a_text_answer_lists_its_text_s_tokens_not_the_wrapper_s(runtime, tokens, text, listed):
    whole, objects = _told(runtime, tokens, b"".join(tokens).decode(), "stop")
    assert whole["message"]["content"] == text
    assert _listed(whole) == listed  # was every token, the JSON's too
    assert _streamed(objects) == listed
    # each piece of the text once (the stream's last object gave the whole text again)
    assert "".join(body["message"]["content"] for body in objects) == text


def test_a_text_cut_mid_character_lists_that_character_s_token(runtime):
    """Ollama's runner trims the cut character from the text but still lists its token's logprobs."""
    tokens = [b'{"response": "', b"ab", b"\xc3"]
    whole, objects = _told(runtime, tokens, '{"response": "ab\ufffd', "length")
    assert whole["message"]["content"] == "ab"
    assert _listed(whole) == [b"ab", b"\xc3"]
    assert _streamed(objects) == _listed(whole)


def test_a_text_of_one_cut_character_lists_its_token_whole_and_streamed(runtime):
    """A text answer whose only text is a character ``num_predict`` cut short: its content is empty (the bytes are
    trimmed) but its token is still listed, in the whole answer as in the stream, as Ollama lists a trimmed piece's
    token (the whole answer listed none: its trimmed text was empty, so nothing of it was read as the text)."""
    tokens = [b'{"response": "', b"\xc3"]
    whole, objects = _told(runtime, tokens, '{"response": "\ufffd', "length")
    assert whole["message"]["content"] == ""
    assert "".join(body["message"]["content"] for body in objects) == ""
    assert _listed(whole) == [b"\xc3"]
    assert _streamed(objects) == [b"\xc3"]


@pytest.mark.parametrize(("tokens", "text", "reason"), [
    ([b'{"response": "', b"\xc3"], '{"response": "\ufffd', "length"),
    ([b'{"response": "', b"ab", b"\xe2\x82"], '{"response": "ab\ufffd', "length"),
    ([b'{"tool_call": {"name": "multiply", "arguments": {"a": 3', b"\xc3"],
     '{"tool_call": {"name": "multiply", "arguments": {"a": 3\ufffd', "length"),
    ([b'{"resp', b'onse": "hi', b'"}', b" \xc3"], '{"response": "hi"} \ufffd', "length"),
])
def test_whole_and_streamed_answers_agree_where_the_end_cut_a_character(runtime, tokens, text, reason):
    """The whole answer gives the content and lists the tokens its stream gives where the answer's end cut a
    character short (its bytes trimmed from the text, its token still listed)."""
    whole, objects = _told(runtime, tokens, text, reason)
    assert _listed(whole) == _streamed(objects)
    assert whole["message"]["content"] == "".join(body["message"]["content"] for body in objects)


@pytest.mark.parametrize(("text", "reason"), [
    ('{"tool_call": {"name": "multiply", "arguments": {"a": 3, "b": 4}}}', "stop"),
    ('{"tool_call": {"name": "multiply", "arguments": {"a": 3', "length"),  # cut short: no call, its text the content
])
def test_a_call_s_tokens_are_all_listed_as_ollama_lists_them(runtime, text, reason):
    tokens = [text[at:at + 5].encode() for at in range(0, len(text), 5)]
    whole, objects = _told(runtime, tokens, text, reason)
    message = whole["message"]
    assert bool(message.get("tool_calls")) == (reason == "stop")
    assert _listed(whole) == tokens
    assert _streamed(objects) == tokens


def test_a_streamed_text_answer_gives_its_text_once(runtime):
    """The stream's last object gave a text answer's whole text again after its pieces (read as a cut call's)."""
    tokens = [b'{"response": "', b"Hi", b" there", b'"}']
    for reason in ("stop", "length"):
        _, objects = _told(runtime, tokens, b"".join(tokens).decode(), reason)
        assert [body["message"]["content"] for body in objects] == ["Hi", " there", ""]  # the last: done


def _same(got: list[dict], expected: list[dict]) -> None:
    """The same entries: tokens and bytes exactly, log-probabilities to within float rounding (a prompt evaluated
    again from the prompt cache's reused prefix sums in another order)."""
    def rounded(entries: list[dict]) -> list[dict]:
        return [{**e, "logprob": pytest.approx(e["logprob"], abs=1e-5),
                 **({"top_logprobs": rounded(e["top_logprobs"])} if "top_logprobs" in e else {})} for e in entries]

    assert got == rounded(expected)


def _spelled(entries: list[dict]) -> str:
    return b"".join(bytes(entry["bytes"]) for entry in entries).decode("utf-8", "replace")


def test_served_answers_under_tools_list_the_tokens_they_give_out(tools_server):  # noqa: F811
    """A sampled text answer lists its text's tokens, whole and streamed alike, as the chat route does for the same
    seed; a call lists every token (a call's logprobs are null on the chat route: OpenAI's content is null)."""
    kinds = set()
    for seed in range(8):
        body = {"model": NAME, "messages": [{"role": "user", "content": "Lamp?"}], "tools": [LIGHT], "logprobs": True,
                "top_logprobs": 1, "options": {"num_predict": 30, "seed": seed, "temperature": 1}}
        status, whole = tools_server.post("/api/chat", {**body, "stream": False})
        assert status == 200, whole
        status, _, payload = tools_server.request("POST", "/api/chat", {**body, "stream": True})
        assert status == 200, payload
        objects = [json.loads(line) for line in payload.decode().splitlines()]
        _same([entry for line in objects for entry in line.get("logprobs", [])], whole["logprobs"])
        content = whole["message"]["content"]
        if content.startswith('{"tool_call"'):  # a call num_predict cut short: its text is the content
            kinds.add("call")
            assert len(whole["logprobs"]) == whole["eval_count"]
            assert _spelled(whole["logprobs"]).startswith(content)
        elif content:
            kinds.add("text")
            spelled = _spelled(whole["logprobs"])
            assert '"response"' not in spelled
            assert content in spelled  # every token of the text (a token holding its first quote too)
            assert len(spelled) < len(content) + 4  # and little else: the quote its first and last tokens hold
            status, chat = tools_server.post("/v1/chat/completions", {
                "messages": body["messages"], "tools": [LIGHT], "logprobs": True, "top_logprobs": 1,
                "max_tokens": 30, "seed": seed, "temperature": 1})
            assert status == 200, chat
            choice = chat["choices"][0]
            if choice["message"]["content"].rstrip("\ufffd") == content:  # the same answer: the same tokens listed
                kinds.add("same")
                listed, chat_listed = [e["bytes"] for e in whole["logprobs"]], \
                    [e["bytes"] for e in choice["logprobs"]["content"]]
                assert chat_listed
                assert chat_listed == listed
    assert {"call", "text", "same"} <= kinds, kinds
