"""Checks from a walk through the README's serve and run features."""

from __future__ import annotations

import pytest

from edgesdk.serve.api import ApiError, parse_chat_request, parse_text_request


def test_a_top_level_json_schema_that_is_no_schema_is_refused():
    """llama-server constrains the answer to any ``json_schema`` present, so one that is no schema (``[]``) is no
    plain-text request: it is refused by name, not ignored."""
    with pytest.raises(ApiError) as caught:
        parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "json_schema": []})
    assert (caught.value.status, caught.value.param) == (400, "json_schema")
    with pytest.raises(ApiError) as caught:
        parse_text_request({"prompt": "hi", "json_schema": []})
    assert caught.value.param == "json_schema"


def test_the_schema_true_constrains_the_answer_as_the_empty_schema_does():
    """``true`` is the empty schema's other spelling (JSON Schema 2020-12 core, section 4.3.2): any object at the root,
    as ``{}`` is here and in llama.cpp's converter (it was refused as a root that may be any value)."""
    for schema in (True, {}):
        request = parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "json_schema": schema})
        assert request.json_schema.root.kind == "object"
        assert parse_text_request({"prompt": "hi", "json_schema": schema}).json_schema.root.kind == "object"


def test_an_empty_json_schema_constrains_the_answer_to_an_object():
    """``{}``: llama-server documents it as "any JSON", and llama.cpp's converter writes it as an object; the answer
    is constrained, not a plain-text request."""
    request = parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "json_schema": {}})
    assert request.json_schema is not None
    assert request.json_schema.root.kind == "object"


def test_a_null_json_schema_is_the_default():
    assert parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "json_schema": None})
