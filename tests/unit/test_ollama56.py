"""Ollama's /api/generate (edgesdk/serve/ollama.py) where its errors named what the client never sent: a ``prompt``
or ``system`` that is not UTF-8 (a lone ``\\ud800`` JSON escape) was refused as "messages[0].content is not valid
UTF-8", the chat route's message the request is translated into, so the client was told to fix a ``messages`` field
/api/generate does not have (and, with a system prompt, ``messages[0]`` blamed the prompt for the system's fault)."""

from __future__ import annotations

import pytest

from edgesdk.serve.api import ApiError
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.ollama import parse_generate, windowed
from tests._utils.ollama_calls import post_error

NAME = "tiny-host"


@pytest.mark.parametrize(("body", "field"), [
    ({"prompt": "\ud800 hi"}, "prompt"),
    ({"prompt": "\ud800 hi", "system": "Be brief."}, "prompt"),
    ({"prompt": "hi", "system": "\ud800"}, "system"),
])
def test_a_prompt_or_system_that_is_not_utf8_is_refused_naming_that_field(runtime, body, field):
    completer = Completer(runtime, ServeDefaults(max_tokens=4))
    with pytest.raises(ApiError) as refused:
        windowed(completer, parse_generate({"model": NAME, **body}, NAME))
    assert refused.value.param == field
    assert "messages" not in refused.value.message
    assert refused.value.message.startswith(f"'{field}' is not valid UTF-8 (U+D800 at character 0)")


def test_the_served_refusal_names_the_system_field(served):
    status, error = post_error(served, "/api/generate", {"model": NAME, "prompt": "hi", "system": "\ud800",
                                                         "stream": False})
    assert status == 400
    assert error.startswith("'system' is not valid UTF-8")
    assert "messages" not in error
