"""OpenAI's Responses API (edgesdk/serve/responses.py): review 59.

* Text the prompt cannot hold (a lone surrogate from a ``\\ud800`` JSON escape) in a ``function_call_output``'s
  ``output`` was refused naming the whole item (``input[2]``) at a character of the tool-result text the output
  becomes (``{"tool_response": ...}``), not of the output the client sent; in a message's ``input_text`` part it
  named the message at a character of its parts joined. The error now names the field that holds it
  (``input[2].output``, ``input[1].content[0].text``) at its place there, and every such error carries its fix
  (the Responses route dropped the fix the chat route's check gives).
"""

from __future__ import annotations

import pytest

from edgesdk.serve.api import ApiError
from edgesdk.serve.responses import parse_responses_request

CALL = {"type": "function_call", "call_id": "call_1", "name": "get_time", "arguments": "{}"}
FIX = "send each character whole"


def _refused(items: list) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_responses_request({"model": "m", "input": items})
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize("output", ["\ud800", [{"type": "input_text", "text": "\ud800"}]])
def test_a_tool_output_the_prompt_cannot_hold_is_named_where_it_is(output):
    error = _refused([{"role": "user", "content": "Time?"}, CALL,
                      {"type": "function_call_output", "call_id": "call_1", "output": output}])
    where = "input[2].output" if isinstance(output, str) else "input[2].output[0].text"
    assert error.param == where, error.message
    assert error.message.startswith(f"{where} is not valid UTF-8 (U+D800 at character 0)"), error.message
    assert FIX in error.message


def test_a_text_part_the_prompt_cannot_hold_is_named_where_it_is():
    error = _refused([{"role": "user", "content": "It is noon."},
                      {"role": "user", "content": [{"type": "input_text", "text": "Oslo"},
                                                   {"type": "input_text", "text": "\ud800 Bergen"}]}])
    assert error.param == "input[1].content[1].text", error.message
    assert error.message.startswith("input[1].content[1].text is not valid UTF-8 (U+D800 at character 0)")
    assert FIX in error.message


@pytest.mark.parametrize("body", [{"input": "\ud800 Oslo"}, {"input": "Time?", "instructions": "Be \udc00 brief"}])
def test_text_the_prompt_cannot_hold_is_refused_with_its_fix(body):
    with pytest.raises(ApiError) as caught:
        parse_responses_request({"model": "m", **body})
    assert caught.value.param == ("instructions" if "instructions" in body else "input")
    assert FIX in caught.value.message, caught.value.message
