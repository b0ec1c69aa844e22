"""The HTTP server (edgesdk/serve/http_server.py) and the model pool (edgesdk/serve/model_pool.py) where they
answered otherwise than they should:

* with several bundles, ``--max-queue`` was counted twice: once by the loaded model's own queue (the requests
  holding a lease on it and waiting for the one generating) and again by the pool's (those waiting for another
  model), so ``--max-queue 1`` let two requests wait, and one more per model named;
* a 413 named the body's size and the limit but not what to do, and an empty body (``Content-Length: 0``, as
  ``requests.post(url)`` sends it) was "not JSON in UTF-8: Expecting value: line 1 column 1 (char 0)", which did
  not say the body was empty."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from edgesdk.serve.api import ApiError, parse_text_request
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.model_pool import ModelPool, ServedModel
from tests.unit.test_serve_review import CountingHook, read_until_closed, wait_for


def _in_thread(work) -> tuple[threading.Thread, dict]:
    """``work()`` run in a thread; what it returned or raised lands in the dict."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # noqa: BLE001 (handed to the test)
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_max_queue_counts_the_loaded_model_s_waiters_and_the_pool_s_together(runtime, tiny_bundle):
    hook = CountingHook(hold_at=1)  # the first request's prefill is held: it stays generating
    completer = Completer(runtime, ServeDefaults(max_tokens=2, max_waiting=1), hook=hook)
    models = [ServedModel("first", tiny_bundle), ServedModel("second", tiny_bundle)]
    pool = ModelPool(models, load=lambda model: Completer(runtime, ServeDefaults(max_tokens=2, max_waiting=1)),
                     loaded=completer, log=lambda line: None)
    request = parse_text_request({"prompt": "x", "max_tokens": 2})

    def answer() -> None:
        lease = pool.acquire("first")
        try:
            lease.completer.complete(request)
        finally:
            pool.release(lease)

    threads = []
    try:
        threads.append(_in_thread(answer))
        assert hook.held.wait(30)  # one generating
        threads.append(_in_thread(answer))
        assert wait_for(lambda: completer.waiting == 1)  # one waiting behind it: --max-queue 1 is full
        other, outcome = _in_thread(lambda: pool.acquire("second"))
        threads.append((other, outcome))
        assert wait_for(lambda: outcome or pool.queued)
        assert "error" in outcome, "a second request was let wait under --max-queue 1"
        refused = outcome["error"]
        assert isinstance(refused, ApiError), refused
        assert (refused.status, refused.code) == (503, "server_busy"), refused.message
        assert "1 request(s) already wait" in refused.message
        assert "--max-queue 1" in refused.message
    finally:
        hook.release.set()
        for thread, outcome in threads:
            thread.join(60)
            if hasattr(outcome.get("value"), "completer"):
                pool.release(outcome["value"])


def _refusal(served, request: bytes) -> tuple[bytes, str]:
    client = socket.create_connection(("127.0.0.1", served.port), timeout=30)
    client.sendall(request)
    head, _, payload = read_until_closed(client).partition(b"\r\n\r\n")
    client.close()
    return head, json.loads(payload)["error"]["message"]


@pytest.mark.parametrize("framing", [b"Content-Length: 2000000\r\n\r\n",
                                     b"Transfer-Encoding: chunked\r\n\r\n200000\r\n" + b"x" * 0x200000])
def test_a_413_says_to_send_a_shorter_request(served, framing):
    head, message = _refusal(served, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + framing)
    assert head.startswith(b"HTTP/1.1 413"), head
    assert "1,048,576" in message
    assert "send a shorter request" in message


@pytest.mark.parametrize("body", [b"", b" \r\n"])
def test_an_empty_body_is_a_400_that_says_it_is_empty(served, body):
    head, message = _refusal(served, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    assert head.startswith(b"HTTP/1.1 400"), head
    assert message.startswith(f"the request body is empty ({len(body)} bytes)"), message
    assert "JSON object" in message
