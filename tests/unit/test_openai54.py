"""OpenAI request parsing (edgesdk/serve/api.py): content parts, a ``text`` response format's schema, the count of
chat ``stop`` strings and ``stream_options.include_usage`` null."""

from __future__ import annotations

import json

import pytest

from edgesdk.serve.api import ApiError, parse_chat_request

HI = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def refusal(body: dict) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_chat_request(body)
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize("part", [{"type": "text"}, {"type": "text", "text": 5}, {"type": "text", "text": None}])
def test_a_text_part_without_text_is_named_as_such(part):
    """A text part whose ``text`` is missing or not a string was refused as if its type were at fault ("is a 'text'
    part; this server reads only text parts")."""
    error = refusal({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, part]}]})
    assert error.param == "messages[0].content[1].text"
    assert "'text' must be a string" in error.message
    assert "reads only text parts" not in error.message


@pytest.mark.parametrize("kind", ["image_url", "input_audio", "file"])
def test_a_part_of_another_type_is_refused_with_the_fix(kind):
    error = refusal({"messages": [{"role": "user", "content": [{"type": kind, kind: {}}]}]})
    assert error.param == "messages[0].content[0]"
    assert error.code == "unsupported_parameter"
    assert f"of type {json.dumps(kind)}" in error.message
    assert "text alone" in error.message
    assert "send" in error.message


def test_text_parts_still_join():
    request = parse_chat_request({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                            {"type": "text", "text": "b"}]}]})
    assert request.messages[0]["content"] == "a\nb"


def test_a_text_format_with_a_schema_constrains_nothing():
    """llama-server reads a schema from ``json_object`` and ``json_schema`` formats alone; a ``text`` format's schema
    was compiled and enforced here, so a client asking for plain text got JSON."""
    request = parse_chat_request({"messages": HI, "response_format": {"type": "text", "schema": SCHEMA}})
    assert request.json_schema is None
    assert not request.json_object
    # beside a grammar, the grammar alone shapes the answer (it was joined by the schema before)
    request = parse_chat_request({"messages": HI, "response_format": {"type": "text", "schema": SCHEMA},
                                  "grammar": 'root ::= "yes"'})
    assert request.grammar is not None
    assert request.json_schema is None


def test_a_json_object_format_with_a_schema_still_constrains():
    request = parse_chat_request({"messages": HI, "response_format": {"type": "json_object", "schema": SCHEMA}})
    assert request.json_schema is not None
    assert request.json_object


def test_too_many_chat_stops_name_the_count():
    """Five long stop strings: the shortened repr hid that the count was at fault."""
    stops = [f"\n\n### Section {n} of the document" for n in range(5)]
    error = refusal({"messages": HI, "stop": stops})
    assert error.param == "stop"
    assert "at most 4 strings" in error.message
    assert "got 5 strings" in error.message
    assert parse_chat_request({"messages": HI, "stop": stops[:4]}).stop == tuple(stops[:4])


def test_include_usage_null_is_its_default():
    request = parse_chat_request({"messages": HI, "stream": True, "stream_options": {"include_usage": None}})
    assert request.stream
    assert not request.include_usage
    assert parse_chat_request({"messages": HI, "stream": True,
                               "stream_options": {"include_usage": True}}).include_usage
    assert refusal({"messages": HI, "stream": True, "stream_options": {"include_usage": "yes"}}).param == \
        "stream_options"


@pytest.mark.parametrize("modalities", [[{"type": "text"}], ["text", ["audio"]], ["text", "audio"]])
def test_modalities_other_than_text_are_a_400(modalities):
    """A modality that is no string (an object, a list) raised TypeError (unhashable) in the check: a 500."""
    error = refusal({"messages": HI, "modalities": modalities})
    assert error.param == "modalities"
    assert error.code == "unsupported_parameter"
    assert parse_chat_request({"messages": HI, "modalities": ["text"]}).messages[0]["content"] == "hi"
