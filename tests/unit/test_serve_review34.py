"""``edgesdk serve``: what a client meets over real HTTP against the tiny bundle (real sockets, real sessions)."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.serve.completion import ServeDefaults
from edgesdk.serve.tools import answer_message
from tests.unit.test_serve_review import (
    PROMPT,
    RESET_ON_CLOSE,
    CountingHook,
    Served,
    post_bytes,
    read_until_closed,
    wait_for,
)


def test_an_error_for_a_client_that_left_is_dropped_without_a_traceback(runtime, capfd):
    """A queued request whose client reset its connection gets the stop's 503 at its turn: the write fails, and the
    server lets the connection go as it does a failed write of an answer, without socketserver's traceback."""
    hook = CountingHook(hold_at=1)
    server = Served(runtime, ServeDefaults(max_tokens=4), hook=hook)
    try:
        first = server.raw(post_bytes({"prompt": PROMPT}))
        assert hook.held.wait(30)
        leaving = server.raw(post_bytes({"prompt": PROMPT, "max_tokens": 4}))
        assert wait_for(lambda: server.completer.waiting == 1)
        leaving.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
        leaving.close()
        stopper = threading.Thread(target=server.server.stop_answers, kwargs={"timeout": 30})
        stopper.start()
        assert wait_for(lambda: server.completer.stopping)
        hook.release.set()
        stopper.join(60)
        assert first.recv(4096).startswith(b"HTTP/1.1 503")
        first.close()
        assert wait_for(lambda: server.server._answering == 0)
    finally:
        hook.release.set()
        server.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err, err


class FailingHook(CountingHook):
    """A StepHook whose decode steps fail with an EdgeSDKError that carries its fix, as the thermal watch's
    BoardNeverCooled does."""

    def before_step(self, kind):
        if kind == "decode":
            raise EdgeSDKError("the board never cooled below the guard's resume point", "lower --ambient")
        return 0.0


def test_an_error_in_a_stream_keeps_its_fix(runtime):
    """An error raised once a stream's headers are out is its last event, with the fix the error names."""
    server = Served(runtime, ServeDefaults(max_tokens=8), hook=FailingHook())
    try:
        client = server.raw(post_bytes({"prompt": PROMPT, "max_tokens": 8, "stream": True}))
        reply = read_until_closed(client).decode()
    finally:
        server.close()
    assert reply.startswith("HTTP/1.1 200"), reply
    last = json.loads(reply.rstrip().rsplit("data: ", 1)[1])
    assert "never cooled" in last["error"]["message"]
    assert "lower --ambient" in last["error"]["message"], last


def test_an_edgesdk_error_in_a_whole_answer_is_its_problem_and_fix_not_an_internal_error(runtime, capfd):
    """The error a stream ends with is the whole answer's 500 too: the problem and its fix, not 'internal error:'
    with the exception's class and a traceback in the log, which is for faults of the server."""
    server = Served(runtime, ServeDefaults(max_tokens=8), hook=FailingHook())
    try:
        status, body = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 8})
    finally:
        server.close()
    assert status == 500
    assert body["error"]["message"] == "the board never cooled below the guard's resume point; lower --ambient"
    assert body["error"]["type"] == "server_error"
    assert "Traceback" not in capfd.readouterr().err


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_a_tool_s_parameters_sent_as_json_text_are_refused_naming_the_field(served):
    """A client that sends a tool's schema as its JSON text (json.dumps of the object) met a 500 AttributeError;
    it is a 400 naming the field in the route's own terms, as OpenAI refuses a string there."""
    chat = {"messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": json.dumps(SCHEMA)}}]}
    status, body = served.post("/v1/chat/completions", chat)
    assert status == 400, body
    assert body["error"]["param"] == "tools[0].function.parameters"
    assert "string" in body["error"]["message"]
    message = {"max_tokens": 8, "messages": [{"role": "user", "content": "Weather in Paris?"}],
               "tools": [{"name": "get_weather", "input_schema": json.dumps(SCHEMA)}]}
    status, body = served.post("/v1/messages", message)
    assert status == 400, body
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("tools[0].input_schema ")


@pytest.mark.parametrize("number", ["1e999", "-1e999", "9" * 5000])
def test_a_call_holding_a_number_json_cannot_carry_comes_back_as_its_text(number):
    """The tools schema takes a number of any digits. 1e999 became Infinity, which is no JSON, in the call's
    arguments (and in a Messages answer's body); an integer past Python's 4,300 digits was a ValueError, a 500,
    or in a stream a second status line after the events. The answer is its text, as a cut answer is."""
    text = '{"tool_call": {"name": "f", "arguments": {"x": ' + number + "}}}"
    assert answer_message(text, "stop") == ({"content": text}, "stop")
    fields, finish = answer_message(text.replace(number, "1.5e300"), "stop")
    assert finish == "tool_calls"
    assert json.loads(fields["tool_calls"][0]["function"]["arguments"]) == {"x": 1.5e300}
