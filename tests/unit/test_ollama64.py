"""Ollama's /api/chat and /api/generate (edgesdk/serve/ollama.py) where they answered otherwise than Ollama:

* a tool call cut short by ``num_predict`` came back as a call, its arguments partial or empty
  (``{"a": 3}``, ``{}``) beside ``done_reason`` "length", whole and streamed: the ``ollama`` package and LangChain's
  ChatOllama run the calls of a message without reading ``done_reason``. Ollama's tool parser gives out a call only
  once its JSON parses whole, and sends what it buffered as content where it found none;
* an answer cut mid-character ended in U+FFFD (``'...ラス�'``), which /api/generate's ``context`` held too, where
  Ollama's runner trims its text until it is valid UTF-8;
* a message of a role other than system / user / assistant / tool was refused, where Ollama gives the chat template
  any role; ``developer`` (OpenAI's newer name for the system message) was refused too."""

from __future__ import annotations

import codecs
import json

import pytest

from edgesdk.serve.api import ApiError
from edgesdk.serve.completion import Completer, Completion, ServeDefaults
from edgesdk.serve.ollama import Answer, parse_chat, parse_generate, windowed
from tests._utils.ollama_calls import post_error, post_ok

NAME = "tiny-host"
TOOLS = [{"type": "function", "function": {"name": "multiply", "description": "Multiply two numbers.",
                                           "parameters": {"type": "object", "required": ["a", "b"],
                                                          "properties": {"a": {"type": "integer"},
                                                                         "b": {"type": "integer"}}}}}]
ASK = [{"role": "user", "content": "What is 3 times 4?"}]
CUT_CALL = '{"tool_call": {"name": "multiply", "arguments": {"a": 3'
WHOLE_CALL_CUT = '{"tool_call": {"name": "multiply", "arguments": {"a": 3, "b": 4}'  # its envelope not closed


def _answer(runtime, body: dict) -> Answer:
    completer = Completer(runtime, ServeDefaults(max_tokens=16))
    asked = (parse_chat if "messages" in body else parse_generate)({"model": NAME, **body}, NAME)
    return Answer(completer, asked, windowed(completer, asked))


def _cut(text: str, reason: str = "length") -> Completion:
    return Completion(text=text, finish_reason=reason, prompt_tokens=10, completion_tokens=30)


def _streamed(answer: Answer, pieces: list[str], completion: Completion) -> list[dict]:
    """The stream's objects for the answer's ``pieces``, as the server writes them."""
    lines: list[dict] = []
    on_text = answer.listener(lines.append)
    for piece in pieces:
        on_text(piece, None)
    return lines + answer.closing(completion)


# ------------------------------------------------------------------------------------------------ cut calls


@pytest.mark.parametrize("text", [CUT_CALL, '{"tool_call": {"name": "multiply", "arguments": {',
                                  '{"tool_call": {"name": "multiply"'])
def test_a_call_cut_short_is_no_call_but_its_text_whole(runtime, text):
    message = _answer(runtime, {"messages": ASK, "tools": TOOLS, "stream": False}).whole(_cut(text))["message"]
    assert "tool_calls" not in message  # was a call of arguments {"a": 3} or {}
    assert message["content"] == text  # Ollama's tool parser's buffered text, as it sends it where it found no call


@pytest.mark.parametrize("text", [CUT_CALL, '{"tool_call": {"name": "multiply", "arguments": {'])
def test_a_call_cut_short_is_no_call_but_its_text_streamed(runtime, text):
    answer = _answer(runtime, {"messages": ASK, "tools": TOOLS, "stream": True})
    objects = _streamed(answer, [text[:20], text[20:]], _cut(text))
    assert not any("tool_calls" in body["message"] for body in objects)
    assert "".join(body["message"]["content"] for body in objects) == text
    assert objects[-1]["done"]
    assert objects[-1]["done_reason"] == "length"


def test_a_call_whose_arguments_ended_before_the_cut_stays(runtime):
    whole = _answer(runtime, {"messages": ASK, "tools": TOOLS, "stream": False}).whole(_cut(WHOLE_CALL_CUT))
    (call,) = whole["message"]["tool_calls"]
    assert (call["function"]["name"], call["function"]["arguments"]) == ("multiply", {"a": 3, "b": 4})
    assert whole["message"]["content"] == ""
    objects = _streamed(_answer(runtime, {"messages": ASK, "tools": TOOLS, "stream": True}), [WHOLE_CALL_CUT],
                        _cut(WHOLE_CALL_CUT))
    calls = [call for body in objects for call in body["message"].get("tool_calls", [])]
    assert [call["function"]["arguments"] for call in calls] == [{"a": 3, "b": 4}]
    assert "".join(body["message"]["content"] for body in objects) == ""


def test_a_whole_call_is_unchanged(runtime):
    text = WHOLE_CALL_CUT + "}"
    whole = _answer(runtime, {"messages": ASK, "tools": TOOLS, "stream": False}).whole(_cut(text, "stop"))
    assert whole["message"]["tool_calls"][0]["function"]["arguments"] == {"a": 3, "b": 4}


def _chats(served, stream: bool) -> list[dict]:
    """The tiny model's answers to ASK under TOOLS for a few seeds and limits: each the stream's objects (one, the
    answer, where not streamed)."""
    answers = []
    for seed in range(8):
        for limit in (20, 30):
            body = {"model": NAME, "messages": ASK, "tools": TOOLS, "stream": stream,
                    "options": {"seed": seed, "temperature": 1, "num_predict": limit}}
            status, _, payload = served.request("POST", "/api/chat", body)
            assert status == 200, payload
            answers.append([json.loads(line) for line in payload.decode().splitlines()])
    return answers


@pytest.mark.parametrize("stream", [False, True])
def test_a_served_answer_cut_by_num_predict_never_carries_a_partial_call(served, stream):
    answers = _chats(served, stream)
    cut_calls = 0
    for objects in answers:
        last = objects[-1]
        assert last["done"]
        calls = [call for body in objects for call in body["message"].get("tool_calls", [])]
        content = "".join(body["message"]["content"] for body in objects)
        if last["done_reason"] == "length":
            assert calls == [], objects  # the model's calls run to 30 tokens: any one here was cut short
        cut_calls += content.lstrip().startswith('{"tool_call"')
    assert cut_calls  # a call was cut (its text the content): the check above saw one


# ------------------------------------------------------------------------------------------------ a cut character


def test_a_character_cut_short_ends_no_answer_whole_or_streamed(runtime):
    body = {"prompt": "Say it.", "stream": False}
    whole = _answer(runtime, body).whole(_cut("ab\ufffd"))
    assert whole["response"] == "ab"
    answer = _answer(runtime, {**body, "stream": True})
    tokenizer = answer.tokenizer
    assert whole["context"] == tokenizer.encode(answer.prompt + "ab", add_special_tokens=False)
    objects = _streamed(answer, ["a", "b\ufffd"], _cut("ab\ufffd"))
    assert "".join(body["response"] for body in objects) == "ab"
    assert objects[-1]["context"] == whole["context"]
    chat = _answer(runtime, {"messages": ASK, "stream": False}).whole(_cut("ab\ufffd"))
    assert chat["message"]["content"] == "ab"


def _entry(token: str) -> dict:
    return {"token": token, "logprob": -1.0, "bytes": list(token.encode()), "top_logprobs": []}


def test_a_replacement_character_text_follows_still_goes_out_with_its_tokens(runtime):
    """Bytes that are no UTF-8 inside the answer: held back, with their tokens' logprobs, only until the next text
    shows the answer goes on; each object lists the tokens of its own text."""
    answer = _answer(runtime, {"prompt": "Say it.", "stream": True, "logprobs": True})
    lines: list[dict] = []
    on_text = answer.listener(lines.append)
    for piece in ("a", "\ufffd", "b", "c\ufffd"):
        on_text(piece, [_entry(piece)])
    objects = lines + answer.closing(_cut("a\ufffdbc\ufffd"))
    assert [body["response"] for body in objects[:-1]] == ["a", "\ufffdb", "c"]
    assert [[entry["token"] for entry in body["logprobs"]] for body in objects[:-1]] == [["a"], ["\ufffd", "b"],
                                                                                         ["c\ufffd"]]
    whole = _answer(runtime, {"prompt": "Say it.", "stream": False}).whole(_cut("a\ufffdb"))
    assert whole["response"] == "a\ufffdb"


def _incomplete(pieces: list[dict]) -> bool:
    """Whether the tokens' bytes (Ollama's logprobs ``bytes``) end inside a character."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    decoder.decode(b"".join(bytes(entry["bytes"]) for entry in pieces))
    return bool(decoder.getstate()[0])


@pytest.mark.parametrize("stream", [False, True])
def test_a_served_generate_cut_mid_character_ends_in_no_replacement_character(served, runtime, stream):
    cut = 0
    for seed in range(6):
        for limit in (3, 5, 8, 12):
            body = {"model": NAME, "prompt": "Translate to Japanese: cat, dog, bird.", "stream": stream,
                    "logprobs": True, "options": {"seed": seed, "temperature": 1, "num_predict": limit}}
            status, _, payload = served.request("POST", "/api/generate", body)
            assert status == 200, payload
            objects = [json.loads(line) for line in payload.decode().splitlines()]
            response = "".join(body["response"] for body in objects)
            entries = [entry for body in objects for entry in body.get("logprobs", [])]
            assert not response.endswith("\ufffd"), (seed, limit, response)
            context = runtime.tokenizer.tokenizer.decode(objects[-1]["context"])
            assert context.endswith(response)
            assert not context.endswith("\ufffd")
            cut += _incomplete(entries)
    assert cut  # some answer was cut inside a character: the checks above saw one


# ------------------------------------------------------------------------------------------------ roles


def test_developer_is_read_as_system():
    messages = parse_chat({"model": NAME, "messages": [{"role": "developer", "content": "Be brief."}, *ASK]},
                          NAME).request.messages
    assert messages[0] == {"role": "system", "content": "Be brief."}


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_another_role_goes_to_the_template_as_it_is(runtime, tools):
    completer = Completer(runtime, ServeDefaults(max_tokens=16))
    body = {"model": NAME, "messages": [*ASK, {"role": "ipython", "content": "12"}], **({"tools": tools} if tools
                                                                                          else {})}
    asked = parse_chat(body, NAME)
    assert asked.request.messages[-1] == {"role": "ipython", "content": "12"}
    assert asked.request.messages[-2]["role"] == "user"
    assert "<|im_start|>ipython\n12<|im_end|>" in completer.rendered_chat(windowed(completer, asked))


def test_a_served_chat_with_another_role_is_answered(served):
    answer = post_ok(served, "/api/chat", {"model": NAME, "stream": False, "options": {"num_predict": 2},
                                           "messages": [{"role": "narrator", "content": "It rains."}, *ASK]})
    assert answer["done"]


@pytest.mark.parametrize("role", [None, 5, "", ["user"]])
def test_a_role_that_is_no_name_is_still_refused_naming_it(served, role):
    message = {"content": "hi"} if role is None else {"role": role, "content": "hi"}
    status, error = post_error(served, "/api/chat", {"model": NAME, "stream": False, "messages": [message]})
    assert status == 400
    assert error.startswith("messages[0].role must be the name of who speaks, a string")
    with pytest.raises(ApiError) as refused:
        parse_chat({"model": NAME, "messages": [message]}, NAME)
    assert refused.value.param == "messages[0].role"
