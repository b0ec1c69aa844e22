"""Checks from a walk through the README's serve and run features."""

from __future__ import annotations

import pytest

from edgesdk.serve.api import ApiError, parse_chat_request, parse_text_request


@pytest.mark.parametrize("schema", [True, []])
def test_a_top_level_json_schema_of_any_value_is_refused_even_when_empty(schema):
    """llama-server constrains the answer to any ``json_schema`` present, so an empty one is no plain-text
    request; here an answer's root must be an object or an array, so one that may be any value (``true``) or is
    no schema (``[]``) is refused by name, not ignored. ``{}`` is any object, as llama.cpp's converter writes it
    (tests/unit/test_jsonschema48.py)."""
    with pytest.raises(ApiError) as caught:
        parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "json_schema": schema})
    assert (caught.value.status, caught.value.param) == (400, "json_schema")
    with pytest.raises(ApiError) as caught:
        parse_text_request({"prompt": "hi", "json_schema": schema})
    assert caught.value.param == "json_schema"


def test_an_empty_json_schema_constrains_the_answer_to_an_object():
    """``{}``: llama-server documents it as "any JSON", and llama.cpp's converter writes it as an object; the answer
    is constrained, not a plain-text request."""
    request = parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "json_schema": {}})
    assert request.json_schema is not None
    assert request.json_schema.root.kind == "object"


def test_a_null_json_schema_is_the_default():
    assert parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "json_schema": None})
