"""The OpenAI-compatible routes (edgesdk/serve/responses.py, tools.py, completion.py) on a real server over a tiny
bundle (tests/unit/test_openai_client37.py's), driven by raw HTTP: what a review against OpenAI's API reference and
llama-server found.
"""

from __future__ import annotations

import pytest

pytest.importorskip("openai")
pytest.importorskip("pydantic")

from tests.unit import test_openai_client37 as shared  # noqa: E402 (after the skips)

runtime, server = shared.runtime, shared.server

TOOL = {"type": "function", "name": "get_time", "description": "The time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def _error(server, path: str, body: dict) -> tuple[int, dict]:
    status, payload = server.post(path, body)
    assert set(payload["error"]) == {"message", "type", "param", "code"}, payload
    return status, payload["error"]


@pytest.mark.parametrize("bad", [0, 1])
@pytest.mark.parametrize("tools", [[], [TOOL]])
def test_text_the_prompt_cannot_hold_names_its_input_item_beside_tools(server, bad, tools):
    """A lone surrogate (a JSON escape no UTF-8 text holds) is refused naming the input item that carries it. With
    tools and no instructions the tools' description is a system message put before the input's messages
    (edgesdk.serve.tools.with_instructions); the error named the item after the one at fault (input[1] for input[0]),
    or, for the last item, 'input' with the chat route's 'messages[2]' in its message."""
    items = [{"role": "user", "content": "It is noon."}, {"role": "user", "content": "What time is it?"}]
    items[bad] = {"role": "user", "content": "\ud800 Oslo"}
    body = {"input": items, "max_output_tokens": 1, **({"tools": tools} if tools else {})}
    status, error = _error(server, "/v1/responses", body)
    assert (status, error["param"]) == (400, f"input[{bad}]"), error
    assert error["message"].startswith(f"input[{bad}] is not valid UTF-8"), error
    assert "messages" not in error["message"]
