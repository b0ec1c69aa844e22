"""serve's Anthropic Messages API, embeddings, reasoning and response store (edgesdk/serve/anthropic.py,
embeddings.py, reasoning.py, response_store.py): defects found in review."""

from __future__ import annotations

import pytest

from edgesdk.serve.anthropic import parse_messages_request
from edgesdk.serve.api import ApiError
from edgesdk.serve.embeddings import parse_embedding_request

MESSAGES = [{"role": "user", "content": "Why is the sky blue?"}]


def test_a_thinking_budget_written_as_a_whole_float_is_taken():
    """Before, ``budget_tokens`` 2048.0 was refused while ``max_tokens`` 4096.0 and ``top_k`` 40.0 were taken."""
    request = parse_messages_request({"max_tokens": 4096.0, "messages": MESSAGES,
                                      "thinking": {"type": "enabled", "budget_tokens": 2048.0}})
    assert request.template_kwargs == {"enable_thinking": True}
    for budget in (2048.5, 512.0, float("inf")):
        with pytest.raises(ApiError) as caught:
            parse_messages_request({"max_tokens": 4096, "messages": MESSAGES,
                                    "thinking": {"type": "enabled", "budget_tokens": budget}})
        assert caught.value.param == "thinking"


@pytest.mark.parametrize(("value", "shown"), [
    (5, "got the number 5"),
    (1.5, "got the number 1.5"),
    ({"text": "hi"}, 'got an object {"text": "hi"}'),
    (True, "got true"),
    ([1.5], "got the number 1.5"),
    (["a", {"text": "b"}], 'got an object {"text": "b"}'),
    ([[1, "a"], [2.5]], "got the array [2.5]"),
    ([[True]], "got the array [true]"),
])
def test_an_embedding_input_refused_is_shown_in_json_s_words_with_its_value(value, shown):
    """Before: "got int", "got float", "got dict", "got bool" (Python's type names, without the value sent), and
    "got an array of other things" for an array that is no input."""
    with pytest.raises(ApiError) as caught:
        parse_embedding_request({"input": value})
    assert caught.value.message.endswith(shown)


@pytest.mark.parametrize(("value", "shown"), [
    (float("nan"), "got the number NaN"),
    ([[1, "a"], [float("nan")]], "got the array [NaN]"),
    (float("inf"), "got the number Infinity"),
])
def test_an_embedding_input_refused_is_shown_as_json_at_top_level_and_in_an_array(value, shown):
    """Before, NaN at the top level was "the number nan" (Python's repr) but "[NaN]" in an array (JSON's)."""
    with pytest.raises(ApiError) as caught:
        parse_embedding_request({"input": value})
    assert caught.value.message.endswith(shown), caught.value.message
