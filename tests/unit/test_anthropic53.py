"""serve's Anthropic Messages route (edgesdk/serve/anthropic.py): the stop reason of an answer whose tool calls are
whole when a stop sequence ended it after them."""

from __future__ import annotations

from edgesdk.serve.anthropic import ToolStream, end_events, message_body, parse_messages_request
from edgesdk.serve.completion import Completion

STOP = "\n\nUser:"
BODY = {"max_tokens": 64, "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "stop_sequences": [STOP]}
# the answer's JSON (serve/tools.py's answer form) with a whole call, then the stop sequence it ended at
CALL = '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}'


def _message_delta(events: list) -> dict:
    return next(data for name, data in events if name == "message_delta")


def test_a_whole_call_ended_by_a_stop_sequence_is_tool_use():
    """A whole call is ``tool_use`` (the client must answer its block, agent loops run tools on that stop reason),
    as llama-server's Messages route reports it for an answer with calls ended by a stop word; the stop sequence
    is still named in ``stop_sequence``. Before, the stop sequence took precedence: ``stop_sequence``."""
    request = parse_messages_request(BODY)
    completion = Completion(CALL, "stop", 12, 20, stop_string=STOP)
    whole = message_body(request, "msg_1", "tiny", completion)
    assert [block["type"] for block in whole["content"]] == ["tool_use"]
    assert whole["content"][0]["input"] == {"city": "Paris"}
    assert (whole["stop_reason"], whole["stop_sequence"]) == ("tool_use", STOP)

    stream = ToolStream()
    events = stream.push(CALL)
    closing, finish_reason = stream.close(completion.finish_reason)
    delta = _message_delta(end_events(request, completion, events + closing, finish_reason))["delta"]
    assert (delta["stop_reason"], delta["stop_sequence"]) == ("tool_use", STOP)


def test_a_text_answer_ended_by_a_stop_sequence_stays_stop_sequence():
    request = parse_messages_request(BODY)
    completion = Completion('{"response": "Sunny"}', "stop", 12, 8, stop_string=STOP)
    whole = message_body(request, "msg_1", "tiny", completion)
    assert (whole["stop_reason"], whole["stop_sequence"]) == ("stop_sequence", STOP)
