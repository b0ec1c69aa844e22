"""The serve completer's core (edgesdk/serve/completion.py) against llama-server's slot and queue: an answer whose
client leaves, or whose server stops, once its turn has come is counted cancelled in GET /metrics whatever point it
ended at (before its first token too: a stream whose client left right after the headers)."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time

import pytest

from edgesdk.serve.api import ApiError, parse_text_request
from edgesdk.serve.completion import ClientGone, Completer, ServeDefaults
from tests.unit.test_serve import Served

PROMPT = "The quick brown fox jumps over"


def _request(max_tokens: int = 8):
    return parse_text_request({"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0})


def test_an_answer_whose_client_is_gone_when_its_turn_comes_is_counted_cancelled(runtime):
    completer = Completer(runtime, ServeDefaults(max_tokens=16))
    with pytest.raises(ClientGone):
        completer.complete(_request(), client_gone=lambda: True)
    assert completer.metrics.finished["cancelled"] == 1
    assert not completer.busy
    assert completer.slot is None


def test_an_answer_whose_stream_opening_finds_the_client_gone_is_counted_cancelled(runtime):
    """A stream's headers and first events go out from ``on_start``: a client that left right after asking makes
    that write fail (a broken pipe), which ends the answer before its first token; it was counted nowhere."""
    completer = Completer(runtime, ServeDefaults(max_tokens=16))

    def opening() -> None:
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(BrokenPipeError):
        completer.complete(_request(), on_start=opening)
    assert completer.metrics.finished["cancelled"] == 1
    assert sum(completer.metrics.finished.values()) == 1


def _waits(completer: Completer, count: int) -> None:
    deadline = time.monotonic() + 30
    while completer.waiting < count:
        assert time.monotonic() < deadline, "the request never queued"
        time.sleep(0.01)


def test_an_answer_waiting_while_the_server_stops_is_counted_cancelled(runtime):
    """Its turn comes after stop(): it gets the 503 server_stopping without running, as the answer the stop ended."""
    completer = Completer(runtime, ServeDefaults(max_tokens=16))
    outcome = {}

    def ask() -> None:
        try:
            completer.complete(_request())
        except ApiError as exc:
            outcome["code"] = exc.code

    with completer.exclusive():
        waiter = threading.Thread(target=ask)
        waiter.start()
        _waits(completer, 1)
        completer.stop()
    waiter.join(60)
    assert outcome == {"code": "server_stopping"}
    assert completer.metrics.finished["cancelled"] == 1


def test_a_waiter_dropped_for_a_full_queue_is_counted_cancelled(runtime):
    """A full queue first lets go of the waiters whose client left (FairTurn.drop_gone): each is an answer its client
    cancelled, as one whose client is gone when its turn comes."""
    completer = Completer(runtime, ServeDefaults(max_tokens=16, max_waiting=0))
    outcome = {}

    def ask() -> None:
        try:
            completer.complete(_request(), client_gone=lambda: True)
        except ClientGone:
            outcome["gone"] = True

    with completer.exclusive():
        waiter = threading.Thread(target=ask)
        waiter.start()
        _waits(completer, 1)
        later = threading.Thread(target=lambda: outcome.update(later=completer.complete(_request(2))))
        later.start()
        waiter.join(60)
        assert outcome == {"gone": True}
        _waits(completer, 1)  # the later request took the dropped one's place
    later.join(60)
    assert outcome["later"].completion_tokens == 2
    assert completer.metrics.finished["cancelled"] == 1
    assert completer.metrics.finished["length"] == 1
    assert completer.metrics.refused_busy == 0


def test_a_response_stream_whose_client_left_is_counted_cancelled(runtime):
    """The reviewer's case over a real socket: POST /v1/responses with stream, whose client leaves (a reset, SO_LINGER
    0) before its answer's first token. It waits behind work holding the board, so that the client is gone, for sure,
    when the stream's turn comes (right after, its headers would go out)."""
    served = Served(runtime, ServeDefaults(max_tokens=64))
    completer = served.completer
    try:
        body = json.dumps({"model": "tiny", "input": PROMPT, "stream": True, "max_output_tokens": 64}).encode()
        with completer.exclusive():
            client = socket.create_connection(("127.0.0.1", served.port), timeout=60)
            client.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            _waits(completer, 1)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
        deadline = time.monotonic() + 30
        finished = completer.metrics.finished
        while sum(finished.values()) == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert finished["cancelled"] == 1, finished
        assert completer.metrics.predicted_tokens == 0  # it never ran
    finally:
        served.close()
