"""Ollama's and Anthropic's routes (edgesdk/serve/ollama.py, edgesdk/serve/anthropic.py) where they read a field
otherwise than the API they answer for:

* Ollama's ``options.temperature`` above 2: Ollama's sampler takes any temperature from 0 up (sample/samplers.go
  ``NewSampler`` clamps it below 0 alone), where the chat route's (OpenAI's) range ends at 2; /api/chat and
  /api/generate answered 400 "'options.temperature' must be a number in [0, 2]";
* Anthropic's ``temperature`` below 0, or not a number: refused with the chat route's range, "[0, 2]", where
  Anthropic's is [0, 1] (and 1.5 was refused naming [0, 1]);
* Anthropic's ``top_k`` of a fraction or a string: refused with the chat route's "(0 or below: off)", where
  Anthropic refuses below 0 (as this route refuses -1);
* Anthropic's ``system`` neither a string nor an array: "'system' must be an array", where a string is what most
  clients send;
* an Anthropic ``text`` block whose ``text`` is not a string: refused as a block "this server" does not read ("is a
  'text' block in a user turn; this server reads text, ..."), not naming the field that is wrong."""

from __future__ import annotations

import pytest

from edgesdk.serve.anthropic import parse_messages_request
from edgesdk.serve.api import ApiError
from edgesdk.serve.ollama import parse_chat, parse_generate
from tests._utils.ollama_calls import post_error, post_ok

NAME = "tiny-host"
ASK = [{"role": "user", "content": "Say something."}]


@pytest.mark.parametrize("temperature", [2.5, 3, 10.0])
def test_an_ollama_temperature_above_2_is_sampled_as_given(temperature):
    chat = parse_chat({"model": NAME, "messages": ASK, "options": {"temperature": temperature}}, NAME)
    generate = parse_generate({"model": NAME, "prompt": "Say something.", "options": {"temperature": temperature}},
                              NAME)
    raw = parse_generate({"model": NAME, "prompt": "Say", "raw": True, "options": {"temperature": temperature}}, NAME)
    assert chat.request.temperature == generate.request.temperature == raw.request.temperature == temperature


def test_an_ollama_temperature_is_still_read_as_ollama_reads_it_elsewhere():
    """Below 0 it is 0 (greedy), as NewSampler clamps it; within [0, 2] as given; not a number: a 400 naming it."""
    def temperature(value):
        return parse_chat({"model": NAME, "messages": ASK, "options": {"temperature": value}}, NAME).request.temperature

    assert (temperature(-1), temperature(0.7), temperature(2)) == (0.0, 0.7, 2.0)
    for wrong in ("hot", True, [3]):
        with pytest.raises(ApiError) as caught:
            temperature(wrong)
        assert caught.value.param == "options.temperature"


def test_a_served_ollama_answer_at_temperature_3(served):
    """The server samples at temperature 3 (the old answer: 400 "'options.temperature' must be a number in
    [0, 2], got 3"), on both routes, streamed too."""
    options = {"temperature": 3, "seed": 7, "num_predict": 4}
    chat = post_ok(served, "/api/chat", {"model": NAME, "messages": ASK, "stream": False, "options": options})
    assert chat["done"]
    assert 1 <= chat["eval_count"] <= 4  # sampled: an end token may come first
    generate = post_ok(served, "/api/generate", {"model": NAME, "prompt": "Say", "raw": True, "stream": False,
                                                  "options": options})
    assert generate["done"]
    assert 1 <= generate["eval_count"] <= 4
    status, _, payload = served.request("POST", "/api/chat", {"model": NAME, "messages": ASK, "options": options})
    assert status == 200
    assert b'"done": true' in payload.splitlines()[-1]
    assert post_error(served, "/api/chat", {"model": NAME, "messages": ASK, "stream": False,
                                            "options": {"temperature": "hot"}})[0] == 400


def _refusal(body: dict) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_messages_request({"model": NAME, "max_tokens": 4, "messages": ASK, **body})
    return caught.value


@pytest.mark.parametrize("temperature", [-0.5, 1.5, "hot", True, float("nan")])
def test_an_anthropic_temperature_outside_0_to_1_is_refused_naming_anthropic_s_range(temperature):
    error = _refusal({"temperature": temperature})
    assert error.status == 400
    assert error.param == "temperature"
    assert "[0, 1]" in error.message
    assert "[0, 2]" not in error.message


@pytest.mark.parametrize("temperature", [0, 0.5, 1, None])
def test_an_anthropic_temperature_in_0_to_1_is_taken(temperature):
    request = parse_messages_request({"model": NAME, "max_tokens": 4, "messages": ASK, "temperature": temperature})
    assert request.temperature == (None if temperature is None else float(temperature))


@pytest.mark.parametrize("top_k", [2.5, "3", True, -1, float("inf")])
def test_an_anthropic_top_k_that_is_not_a_whole_number_from_0_is_refused_in_anthropic_s_words(top_k):
    error = _refusal({"top_k": top_k})
    assert error.param == "top_k"
    assert "Anthropic's range" in error.message
    assert "below: off" not in error.message


@pytest.mark.parametrize("top_k", [0, 40, 40.0, None])
def test_an_anthropic_top_k_that_is_a_whole_number_from_0_is_taken(top_k):
    request = parse_messages_request({"model": NAME, "max_tokens": 4, "messages": ASK, "top_k": top_k})
    assert request.top_k == (None if top_k is None else int(top_k))


@pytest.mark.parametrize("system", [5, {"type": "text", "text": "Be brief."}, True])
def test_an_anthropic_system_of_another_type_is_refused_naming_both_forms(system):
    error = _refusal({"system": system})
    assert error.param == "system"
    assert "a string or an array of text blocks" in error.message


@pytest.mark.parametrize("block", [{"type": "text", "text": 5}, {"type": "text"}, {"type": "text", "text": None}])
def test_an_anthropic_text_block_without_string_text_is_refused_naming_its_text(block):
    error = _refusal({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hello."}, block]}]})
    assert error.param == "messages[0].content[1].text"
    assert error.message.startswith("messages[0].content[1].text must be")
    assert "a string" in error.message
    assert "this server reads" not in error.message


def test_a_served_anthropic_refusal_names_the_field_in_anthropic_s_shape(served):
    status, body = served.post("/v1/messages", {"model": NAME, "max_tokens": 4, "temperature": -1, "messages": ASK})
    assert status == 400
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "[0, 1]" in body["error"]["message"]
