"""OpenAI's Responses API (``POST /v1/responses``, edgesdk/serve/responses.py): what OpenAI refuses is refused here
too, rather than read as nothing.

* The chat completions fields the Responses API has moved (``max_tokens`` to ``max_output_tokens``,
  ``response_format`` to ``text.format``, ...): OpenAI answers "Unsupported parameter: 'response_format'. In the
  Responses API, this parameter has moved to 'text.format'." Read as nothing, ``max_tokens`` left the answer
  unbounded (the server's default limit) and ``response_format`` left it unshaped, with a 200.
* ``include`` entries that are none of OpenAI's (``ResponseIncludable``): OpenAI answers "Invalid value: ...
  Supported values are: ..." (``invalid_value``). A misspelt ``message.output_text.logprob`` gave an answer
  without the log-probabilities it asked for.

The official ``openai`` client on a real server over a tiny bundle (tests/unit/test_openai_client37.py's).
"""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai")

from edgesdk.serve.api import ApiError  # noqa: E402 (after the skips)
from edgesdk.serve.responses import parse_responses_request  # noqa: E402
from tests.unit import test_openai_client37 as shared  # noqa: E402

runtime, server, client = shared.runtime, shared.server, shared.client

MOVED = [("max_tokens", 3, "max_output_tokens"), ("max_completion_tokens", 3, "max_output_tokens"),
         ("response_format", {"type": "json_object"}, "text.format"),
         ("reasoning_effort", "low", "reasoning.effort"),
         ("messages", [{"role": "user", "content": "Hi"}], "input"),
         ("logprobs", True, "include")]


@pytest.mark.parametrize(("field", "value", "moved"), MOVED)
def test_a_chat_field_the_responses_api_moved_is_refused_naming_where_it_went(field, value, moved):
    with pytest.raises(ApiError) as caught:
        parse_responses_request({"model": "tiny", "input": "Hello", field: value})
    error = caught.value
    assert (error.status, error.param, error.code) == (400, field, "unsupported_parameter")
    assert f"Unsupported parameter: '{field}'" in error.message
    assert f"In the Responses API, this parameter has moved to '{moved}'" in error.message


def test_a_moved_field_left_null_is_no_field():
    asked = parse_responses_request({"model": "tiny", "input": "Hello", "max_tokens": None, "response_format": None,
                                     "max_output_tokens": 4})
    assert asked.max_output_tokens == 4


def test_max_tokens_is_a_400_in_openai_s_error_shape_not_an_unbounded_answer(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="tiny", input="Hello", extra_body={"max_tokens": 3})
    body = caught.value.body
    assert (body["param"], body["code"], body["type"]) == ("max_tokens", "unsupported_parameter",
                                                          "invalid_request_error")
    assert "moved to 'max_output_tokens'" in body["message"]


def test_response_format_is_a_400_not_an_unshaped_answer(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="tiny", input="Hello", max_output_tokens=3,
                                extra_body={"response_format": {"type": "json_object"}})
    assert caught.value.body["param"] == "response_format"
    assert "moved to 'text.format'" in caught.value.body["message"]
    # the same answer asked for as the Responses API asks for it is taken
    shaped = client.responses.create(model="tiny", input="Hello", max_output_tokens=3,
                                     text={"format": {"type": "json_object"}})
    assert shaped.text.format.type == "json_object"


def test_an_include_entry_that_is_none_of_openai_s_is_refused(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="tiny", input="Hello", max_output_tokens=2,
                                include=["message.output_text.logprob"])  # type: ignore[list-item]
    body = caught.value.body
    assert (body["param"], body["code"]) == ("include[0]", "invalid_value")
    assert body["message"].startswith('Invalid value: "message.output_text.logprob". Supported values are: ')
    assert "message.output_text.logprobs" in body["message"]
    # OpenAI's entries are taken: the logprobs one gives them, the others change nothing here
    answer = client.responses.create(model="tiny", input="Hello", max_output_tokens=2,
                                     include=["reasoning.encrypted_content", "message.output_text.logprobs"])
    assert len(answer.output[0].content[0].logprobs) == answer.usage.output_tokens


def test_the_input_tokens_count_refuses_them_too(client):
    for extra in ({"max_tokens": 3}, {"include": ["nope"]}):
        with pytest.raises(openai.BadRequestError):
            client.responses.input_tokens.count(model="tiny", input="Hello", extra_body=extra)
