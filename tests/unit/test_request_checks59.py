"""Request checks of the OpenAI routes and llama-server's ``/completion``.

- A ``stop`` string that is not UTF-8 (a lone surrogate from a ``\\ud83d`` JSON escape) was taken; the answer's text
  is UTF-8, so it could never match and was ignored without a word. It is refused as the other text fields are: 400,
  code ``not_utf8``, param ``stop[i]`` (``stop`` for one string), with the fix.
- Refusals of ``logit_bias``, ``stream_options``, ``response_format`` and a ``/completion`` prompt's parts showed
  what came in Python's form (``got None``, ``got True``, ``{'include_usage': 'yes'}``); the client sent JSON and
  reads it back as JSON (``null``, ``true``, ``{"include_usage": "yes"}``).
- A generator passed as ``messages`` from the Python API was shown as ``got "<generator object ...>"``, reading as
  if a string had been sent; a value JSON has no text for is shown by its Python type (``a generator``).
"""

from __future__ import annotations

import pytest

import edgesdk
from edgesdk.serve.api import ApiError, json_shown, parse_chat_request, parse_text_request
from edgesdk.serve.llama_native import parse_completion_request, prompts

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
PROMPT = "Hello there"


# ------------------------------------------------------------------------------ a stop that is not UTF-8


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions", "/completion"])
@pytest.mark.parametrize(("stop", "param"), [(["e", "\ud83d"], "stop[1]"), ("\ud83d", "stop")])
def test_a_stop_string_that_is_not_utf8_is_refused_by_name(served, route, stop, param):
    body = dict(CHAT) if "chat" in route else {"prompt": PROMPT}
    status, answer = served.post(route, {**body, "max_tokens": 2, "stop": stop})
    assert status == 400, answer
    error = answer["error"]
    assert (error["code"], error["param"]) == ("not_utf8", param), error
    assert error["message"].startswith(f"'{param}' is not valid UTF-8 (U+D83D at character 0)"), error["message"]
    assert "send each character whole" in error["message"]
    # the whole character is taken
    status, answer = served.post(route, {**body, "max_tokens": 2, "stop": ["e", "\U0001f600"]})
    assert status == 200, answer


@pytest.mark.parametrize("parse", [lambda stop: parse_chat_request({**CHAT, "stop": stop}),
                                   lambda stop: parse_text_request({"prompt": PROMPT, "stop": stop}),
                                   lambda stop: parse_completion_request({"prompt": PROMPT, "stop": stop})])
def test_a_stop_string_of_bytes_that_are_not_utf8_is_refused(parse):
    with pytest.raises(ApiError) as caught:
        parse(["", "ab\udcff"])  # a Python caller's text decoded with surrogateescape
    assert (caught.value.status, caught.value.code, caught.value.param) == (400, "not_utf8", "stop[1]")
    assert "(byte 0xff at character 2)" in caught.value.message
    assert parse(["", "ab"]).stop == ("ab",)


def test_python_api_refuses_a_stop_that_is_not_utf8(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1, max_tokens=2) as model:
        with pytest.raises(edgesdk.RequestError, match="not valid UTF-8") as caught:
            model(PROMPT, stop=["\ud83d"])
        assert caught.value.param == "stop[0]"


# ------------------------------------------------------------------------------ what came, as JSON


@pytest.mark.parametrize(("fields", "param", "got"), [
    ({"logit_bias": [[1, None]]}, "logit_bias", "or false for a token never to be taken, got null"),
    ({"logit_bias": {"1": True}}, "logit_bias", "or false for a token never to be taken, got true"),
    ({"logit_bias": {"hi": "x"}}, "logit_bias", "'logit_bias' for \"hi\" must be a number"),
    ({"logit_bias": [[None, 1]]}, "logit_bias", "(or text to tokenize), got null"),
    ({"logit_bias": "x"}, "logit_bias", "array of [token id, bias] pairs, got \"x\""),
    ({"stream_options": {"include_usage": "yes"}}, "stream_options", 'got {"include_usage": "yes"}'),
    ({"stream_options": True}, "stream_options", "got true"),
    ({"response_format": {"type": "json_schema", "json_schema": None}}, "response_format",
     "got json_schema = null"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "strict": False}}},
     "response_format", 'got json_schema = {"name": "a", "strict": false}'),
    ({"stop": [None]}, "stop", "got [null]"),
])
def test_refusals_show_what_came_as_json(fields, param, got):
    for parse in (lambda body: parse_chat_request({**CHAT, **body}),
                  lambda body: parse_text_request({"prompt": PROMPT, **body})):
        with pytest.raises(ApiError) as caught:
            parse(fields)
        assert caught.value.param == param
        assert got in caught.value.message, caught.value.message
        assert "None" not in caught.value.message
        assert "True" not in caught.value.message


@pytest.mark.parametrize(("part", "got"), [(None, "got null"), (True, "got true"), ({"a": 1}, 'got {"a": 1}'),
                                           (1.5, "got 1.5")])
def test_completion_prompt_parts_are_shown_as_json(served, part, got):
    with pytest.raises(ApiError) as caught:
        prompts({"prompt": [12, part]})
    assert caught.value.message.endswith(f"an array holding token ids is one prompt; {got}"), caught.value.message
    status, answer = served.post("/completion", {"prompt": [12, part], "max_tokens": 2})
    assert status == 400, answer
    assert answer["error"]["param"] == "prompt"
    assert answer["error"]["message"].endswith(got), answer["error"]["message"]


def test_completion_stop_that_is_no_string_is_shown_as_json():
    with pytest.raises(ApiError) as caught:
        parse_completion_request({"prompt": PROMPT, "stop": [True]})
    assert caught.value.message == "'stop' must be a string or an array of strings, got [true]"


# ------------------------------------------------------------------------------ values JSON has no text for


def test_a_generator_for_messages_is_shown_by_its_type():
    with pytest.raises(ApiError) as caught:
        parse_chat_request({"messages": (message for message in CHAT["messages"])})
    assert caught.value.message.endswith("(one object is sent as [{...}]), got a generator"), caught.value.message
    with pytest.raises(ApiError) as caught:
        parse_chat_request({"messages": {"role": "user", "content": {"hi"}}})
    assert caught.value.message.endswith('got {"role": "user", "content": a set}'), caught.value.message


def test_python_api_shows_a_generator_for_messages_by_its_type(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1, max_tokens=2) as model:
        with pytest.raises(edgesdk.RequestError) as caught:
            model.create_chat_completion(message for message in CHAT["messages"])
    assert "got a generator" in str(caught.value)
    assert "<generator object" not in str(caught.value)


@pytest.mark.parametrize(("value", "shown"), [
    (None, "null"), (True, "true"), ("hi", '"hi"'), ([1, None], "[1, null]"), ({"a": False}, '{"a": false}'),
    (iter(()), "a tuple_iterator"), ((1, 2), "a tuple"), ({1}, "a set"), (b"x", "a bytes"),
    ({"a": [{2}, "<x>"], "b": object()}, '{"a": [a set, "<x>"], "b": an object}'),
])
def test_json_shown(value, shown):
    assert json_shown(value) == shown


def test_an_ollama_stop_option_that_is_not_utf8_is_refused_by_name():
    """Ollama's ``options.stop`` took a lone surrogate, a stop that could never match, as the OpenAI routes did."""
    from edgesdk.serve.ollama import _options

    with pytest.raises(ApiError) as caught:
        _options({"options": {"stop": ["ok", "\ud83d"]}})
    assert caught.value.param == "options.stop[1]"
    assert caught.value.code == "not_utf8"
    with pytest.raises(ApiError, match=r"got \[null\]") as caught:
        _options({"options": {"stop": [None]}})
    assert caught.value.param == "options.stop"
