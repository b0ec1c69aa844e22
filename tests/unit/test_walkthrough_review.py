"""Checks from a walk through the README's serve and run features."""

from __future__ import annotations

import pytest

from edgesdk.serve.api import ApiError, parse_chat_request, parse_text_request


@pytest.mark.parametrize("schema", [{}, True, []])
def test_a_top_level_json_schema_of_any_value_is_refused_even_when_empty(schema):
    """llama-server constrains the answer to any ``json_schema`` present ({} meaning any JSON value), so an
    empty one is no plain-text request; here an answer's root must be an object or an array, so one that may
    be any value is refused by name, not ignored."""
    with pytest.raises(ApiError) as caught:
        parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "json_schema": schema})
    assert (caught.value.status, caught.value.param) == (400, "json_schema")
    with pytest.raises(ApiError) as caught:
        parse_text_request({"prompt": "hi", "json_schema": schema})
    assert caught.value.param == "json_schema"


def test_a_null_json_schema_is_the_default():
    assert parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "json_schema": None})
