"""A streamed Messages answer's ``message_start`` splits the prompt into ``input_tokens`` and
``cache_read_input_tokens`` as the closing ``message_delta`` does: it said the whole prompt was input and nothing
was read from the cache (the stream opens before the prefill, and it passed 0), where llama-server's
``message_start`` carries the split."""

from __future__ import annotations

from tests.unit.test_serve_anthropic import MESSAGES, _events, served  # noqa: F401 (a fixture)


def _usage(events, name):
    for event, data in events:
        if event == name:
            return data["message"]["usage"] if name == "message_start" else data["usage"]
    raise AssertionError(f"no {name} event")


def test_message_start_reports_the_cached_prompt_tokens(served):  # noqa: F811
    body = {"max_tokens": 3, "system": "You answer in one short line. " * 8, "messages": MESSAGES}
    first = _usage(_events(served, body), "message_start")
    again = _events(served, body)
    start, end = _usage(again, "message_start"), _usage(again, "message_delta")
    prompt = first["input_tokens"] + first.get("cache_read_input_tokens", 0)
    assert start["cache_read_input_tokens"] > 0
    assert start["input_tokens"] + start["cache_read_input_tokens"] == prompt
    assert (start["input_tokens"], start["cache_read_input_tokens"]) == \
        (end["input_tokens"], end["cache_read_input_tokens"])

