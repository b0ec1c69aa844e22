"""llama-server's native routes (edgesdk/serve/llama_native.py): review round 56."""

from __future__ import annotations

import pytest

from edgesdk.serve.api import ApiError
from edgesdk.serve.llama_native import parse_completion_request


@pytest.mark.parametrize("name", ["n_predict", "max_completion_tokens", "max_tokens"])
@pytest.mark.parametrize("flag", [True, False])
def test_a_boolean_token_limit_is_refused_naming_the_field_the_client_sent(name, flag):
    """true is no token count (it was passed on as OpenAI's max_tokens and refused under that name), and false is
    no 0 (it was read as n_predict 0: the prompt evaluated and an empty answer, status 200)."""
    with pytest.raises(ApiError) as caught:
        parse_completion_request({"prompt": "The fox", name: flag})
    assert caught.value.status == 400
    assert caught.value.param == name
    assert caught.value.message.startswith(f"'{name}' must be the most tokens to generate")
    assert caught.value.message.endswith(f"got {str(flag).lower()}")


@pytest.mark.parametrize(("value", "expected"), [(0, 0), (2, 2), (2.0, 2)])
def test_whole_token_limits_are_still_taken(value, expected):
    assert parse_completion_request({"prompt": "The fox", "n_predict": value}).max_tokens == expected
