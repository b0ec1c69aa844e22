"""A request may carry a lone UTF-16 surrogate as a JSON escape ("\\ud83d"). Into a prompt it is refused by name; in a
field the answer only repeats (a Responses request's metadata) it comes back as the escape it came in, where the
answer's UTF-8 writing failed with a 500 and a traceback in the server's log."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("openai")

from tests.unit.test_openai_client37 import runtime, server  # noqa: E402,F401

LONE = "\ud83d"


def test_metadata_holding_a_lone_surrogate_is_repeated_as_its_escape(server):  # noqa: F811
    body = {"model": "m", "input": "hi", "max_output_tokens": 2, "metadata": {"note": "a" + LONE}}
    status, headers, data = server.request("POST", "/v1/responses", raw=json.dumps(body).encode())
    assert status == 200, data
    assert b"\\ud83d" in data
    assert json.loads(data)["metadata"] == {"note": "a" + LONE}


def test_a_lone_surrogate_in_the_instructions_is_refused_naming_instructions(server):  # noqa: F811
    body = {"model": "m", "input": "hi", "max_output_tokens": 2, "instructions": "be " + LONE}
    status, headers, data = server.request("POST", "/v1/responses", raw=json.dumps(body).encode())
    error = json.loads(data)["error"]
    assert status == 400, data
    assert error["param"] == "instructions"
    assert error["message"].startswith("instructions is not valid UTF-8 (U+D83D at character 3)")


def test_a_streamed_answer_repeating_a_lone_surrogate_is_written_too(server):  # noqa: F811
    body = {"model": "m", "input": "hi", "max_output_tokens": 2, "stream": True, "metadata": {"note": LONE}}
    status, headers, data = server.request("POST", "/v1/responses", raw=json.dumps(body).encode())
    assert status == 200, data
    events = [json.loads(line[len(b"data: "):]) for line in data.splitlines() if line.startswith(b"data: ")]
    assert events[-1]["type"] == "response.incomplete"  # cut at max_output_tokens
    assert events[-1]["response"]["metadata"] == {"note": LONE}
