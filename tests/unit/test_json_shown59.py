"""A request field refused by the HTTP routes shows the client's value as the JSON it sent (``true``, ``null``,
``"3"``), not as Python writes it (``True``, ``None``, ``'3'``); and :meth:`Model.embed` gives one vector for
one input that mixes token ids and text, as llama-server reads such an array as one prompt."""
from __future__ import annotations

import numpy as np
import pytest

from edgesdk.serve.anthropic import parse_messages_request
from edgesdk.serve.api import (
    ApiError,
    mixed_prompt_ids,
    parse_chat_request,
    parse_detokenize_request,
    parse_text_request,
    parse_tokenize_request,
)
from edgesdk.serve.llama_native import parse_completion_request, prompts, response_fields

CHAT = [{"role": "user", "content": "hi"}]


def _refusal(parse, body: dict) -> str:
    with pytest.raises(ApiError) as caught:
        parse(body)
    return caught.value.message


def _python_spelling(message: str) -> bool:
    return any(word in message for word in ("True", "False", "None", "'3'", "'yes'", "'x'", "{'"))


@pytest.mark.parametrize(("body", "got"), [
    ({"prompt": "hi", "stream": "yes"}, 'got "yes"'),
    ({"prompt": "hi", "echo": [True]}, "got [true]"),
    ({"prompt": "hi", "temperature": True}, "got true"),
    ({"prompt": "hi", "seed": "3"}, 'got "3"'),
    ({"prompt": "hi", "grammar": {"x": 1}}, 'got {"x": 1}'),
    ({"prompt": None}, "got null"),
    ({"prompt": [1, "a", None]}, 'got [1, "a", null]'),
    ({"prompt": "hi", "suffix": ["x"]}, "'suffix' = [\"x\"] is not supported"),
    ({"prompt": "hi", "top_p": float("nan")}, "got NaN"),
])
def test_openai_text_refusals_show_json(body, got):
    message = _refusal(parse_text_request, body)
    assert got in message, message
    assert not _python_spelling(message), message


@pytest.mark.parametrize(("body", "got"), [
    ({"messages": CHAT, "logprobs": "yes"}, 'got "yes"'),
    ({"messages": CHAT, "reasoning_format": False}, "got false"),
    ({"messages": [{"role": None, "content": "hi"}]}, "role null is not"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]}, "got null"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 'of type "image_url"'),
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": False}]}, "got false"),
])
def test_chat_refusals_show_json(body, got):
    message = _refusal(parse_chat_request, body)
    assert got in message, message
    assert not _python_spelling(message), message


@pytest.mark.parametrize(("body", "got"), [
    ({"prompt": "hi", "n_probs": True}, "got true"),
    ({"prompt": "hi", "n_probs": "3"}, 'got "3"'),
    ({"prompt": "hi", "n_predict": True}, "got true"),
    ({"prompt": "hi", "temperature": None, "t_max_predict_ms": "x"}, 'got "x"'),
    ({"prompt": "hi", "n_probs": 2, "post_sampling_probs": "x"}, "'post_sampling_probs' = \"x\""),
])
def test_llama_native_refusals_show_json(body, got):
    message = _refusal(parse_completion_request, body)
    assert got in message, message
    assert not _python_spelling(message), message


@pytest.mark.parametrize(("body", "got"), [
    ({"max_tokens": 4, "messages": CHAT, "stop_sequences": [None]}, "got [null]"),
    ({"max_tokens": 4, "messages": CHAT, "stop_sequences": {"a": None}}, 'got {"a": null}'),
    ({"max_tokens": True, "messages": CHAT}, "got true"),
    ({"max_tokens": 4, "messages": CHAT, "temperature": "x"}, 'got "x"'),
    ({"max_tokens": 4, "messages": [{"role": None, "content": "hi"}]}, "got null"),
    ({"max_tokens": 4, "messages": CHAT, "system": None, "top_k": False}, "got false"),
])
def test_anthropic_refusals_show_json(body, got):
    message = _refusal(parse_messages_request, body)
    assert got in message, message
    assert not _python_spelling(message), message


@pytest.mark.parametrize(("parse", "body", "got"), [
    (parse_tokenize_request, {"content": "hi", "with_pieces": "yes"}, 'got "yes"'),
    (parse_tokenize_request, {"content": None}, "got null"),
    (parse_tokenize_request, {"content": ["a", True]}, "got true"),
    (parse_detokenize_request, {"tokens": [1, None]}, "got null"),
    (parse_detokenize_request, {"tokens": {"a": 1}}, 'got {"a": 1}'),
])
def test_tokenize_refusals_show_json(parse, body, got):
    message = _refusal(parse, body)
    assert got in message, message
    assert not _python_spelling(message), message


def test_a_suffix_where_the_route_takes_one_is_shown_as_json():
    message = _refusal(lambda body: parse_text_request(body, takes_suffix=True), {"prompt": "hi", "suffix": False})
    assert message.endswith("got false"), message


def test_response_fields_are_shown_as_json():
    message = _refusal(response_fields, {"response_fields": [None]})
    assert message.endswith("got [null]"), message


def test_a_prompt_among_several_is_shown_as_json():
    message = _refusal(prompts, {"prompt": ["a", None]})
    assert message.endswith("got null"), message


def test_a_part_of_a_mixed_prompt_is_shown_as_json():
    with pytest.raises(ApiError) as caught:
        mixed_prompt_ids(None, [1, True, "a"], "prompt")
    assert caught.value.message.endswith("got true"), caught.value.message


def test_a_value_json_cannot_carry_is_named_by_its_type():
    """A Python caller's generator (Model.create_completion passes the fields on) reads as one, not as its repr."""
    message = _refusal(parse_text_request, {"prompt": (t for t in "ab")})
    assert message.count("a generator") == 1, message
    assert "<generator" not in message, message


@pytest.fixture(scope="module")
def model(tiny_bundle):
    import edgesdk

    with edgesdk.load(tiny_bundle.path, threads=1) as model:
        yield model


@pytest.mark.parametrize("one", ["The cat", [1, 2, 3], [1, "The cat"], ["The cat", 5]])
def test_one_input_gives_one_vector(model, one):
    """[1, "The cat"] is one prompt mixing a token id and text (llama-server's tokenize_input_prompts), so it is
    one input, as "The cat" and [1, 2, 3] are: a vector, not a list holding one."""
    vector = np.asarray(model.embed(one))
    assert vector.ndim == 1, vector.shape
    assert vector.shape[0] > 1, vector.shape
    counted, tokens = model.embed(one, return_count=True)
    assert np.asarray(counted).ndim == 1
    assert tokens >= 2


@pytest.mark.parametrize("several", [["The cat"], [[1, 2, 3]], [[1, "The cat"]], ["a", "b"], [[1, "a"], "b"]])
def test_a_list_of_inputs_gives_a_list_of_vectors(model, several):
    vectors = np.asarray(model.embed(several))
    assert vectors.shape[0] == len(several), vectors.shape
    assert vectors.ndim == 2, vectors.shape


def test_the_mixed_input_is_the_prompt_its_parts_make(model):
    """The vector of [ids, "text"] is that of the ids the parts make, the text tokenized after the ids."""
    text_ids = model.tokenize(" sat", add_special=False)
    assert np.allclose(model.embed([1, " sat"]), model.embed([1, *text_ids]), atol=1e-5)
