"""``edgesdk serve`` where a llama.cpp user meets llama-server's behaviour (its tools/server README and
server sources): requests served in arrival order, over real HTTP against the tiny bundle."""

from __future__ import annotations

import threading
import time

import pytest

from edgesdk.serve.api import parse_text_request
from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve import Served

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(tiny_bundle.path, threads=1)


@pytest.fixture
def served(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=16))
    yield server
    server.close()


def wait_for(condition, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


class OrderHook:
    """A StepHook that lists each request's token limit as its turn begins, and holds the first
    request's prefill until :attr:`release` is set."""

    def __init__(self):
        self.held, self.release = threading.Event(), threading.Event()
        self.order: list[int] = []

    def begin(self, prompt_tokens, max_new_tokens):
        self.order.append(max_new_tokens)

    def before_step(self, kind):
        if len(self.order) == 1 and kind == "prefill":
            self.held.set()
            assert self.release.wait(60)
        return 0.0

    def after_step(self, kind, tokens, compute_s):
        pass

    def end(self, stats):
        pass


# ------------------------------------------------------------------------------------ the queue


def test_queued_requests_take_their_turns_in_arrival_order(runtime):
    """A slow first request, then five queued one by one: each runs in the order it arrived (the
    token limit tells the requests apart), and all are answered."""
    hook = OrderHook()
    server = Served(runtime, ServeDefaults(max_tokens=16), hook=hook)
    results: dict[int, tuple[int, dict]] = {}

    def send(limit: int) -> threading.Thread:
        thread = threading.Thread(target=lambda: results.update(
            {limit: server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": limit})}))
        thread.start()
        return thread

    try:
        threads = [send(1)]
        assert hook.held.wait(30)
        limits = [6, 2, 5, 3, 4]  # not sorted: the order is the arrival's, not the requests' own
        for count, limit in enumerate(limits, start=2):
            threads.append(send(limit))
            assert wait_for(lambda: server.completer._turn.queued == count)  # noqa: B023 (waited for here)
        assert server.completer.waiting == len(limits)
        hook.release.set()
        for thread in threads:
            thread.join(60)
        assert hook.order == [1, *limits]
        assert {limit: status for limit, (status, _) in results.items()} == dict.fromkeys([1, *limits], 200)
        assert server.completer.waiting == 0
        assert server.completer._turn.queued == 0
    finally:
        hook.release.set()
        server.close()


def test_a_thread_that_asks_again_at_once_goes_behind_the_one_waiting(runtime):
    """A client whose next request follows its answer at once (a script in a loop) does not take the
    turn back from a request that was already waiting for it."""
    hook = OrderHook()
    server = Served(runtime, ServeDefaults(max_tokens=16), hook=hook)
    completer = server.completer
    ids = runtime.tokenizer.encode(PROMPT, add_special_tokens=False)  # token ids: no tokenizing between turns
    again = parse_text_request({"prompt": ids, "max_tokens": 1})

    def again_and_again() -> None:
        for _ in range(4):
            completer.complete(again)

    try:
        looping = threading.Thread(target=again_and_again)
        looping.start()
        assert hook.held.wait(30)
        waiting = threading.Thread(target=lambda: completer.complete(
            parse_text_request({"prompt": PROMPT, "max_tokens": 7})))
        waiting.start()
        assert wait_for(lambda: completer._turn.queued == 2)
        hook.release.set()
        looping.join(60)
        waiting.join(60)
        assert hook.order == [1, 7, 1, 1, 1]
    finally:
        hook.release.set()
        server.close()


# ------------------------------------------------------------------------------------ browsers (CORS)

ORIGIN = "http://webui.example:5173"


def test_a_preflight_is_answered_without_the_api_key(runtime):
    """llama-server answers OPTIONS before its API key check (a browser sends no Authorization there):
    the request's origin, credentials, GET and POST, and the headers the browser asked for."""
    server = Served(runtime, api_key="sesame")
    try:
        status, headers, payload = server.request("OPTIONS", "/v1/chat/completions", headers={
            "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert (status, payload) == (200, b"")
        assert headers["Access-Control-Allow-Origin"] == ORIGIN
        assert headers["Access-Control-Allow-Credentials"] == "true"
        assert headers["Access-Control-Allow-Methods"] == "GET, POST"
        # echoed: '*' would not cover Authorization, which a browser then refuses to send
        assert headers["Access-Control-Allow-Headers"] == "authorization, content-type"
        assert headers["Vary"] == "Origin"
        assert headers["Content-Length"] == "0"
        status, headers, _ = server.request("OPTIONS", "/no/such/route", headers={"Origin": ORIGIN})
        assert (status, headers["Access-Control-Allow-Headers"]) == (200, "*")
    finally:
        server.close()


def test_answers_and_refusals_carry_the_origin(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=4), api_key="sesame")
    key = {"Authorization": "Bearer sesame", "Origin": ORIGIN}
    try:
        body = {"prompt": PROMPT, "max_tokens": 2}
        for path, request_headers, expected in [
                ("/v1/completions", key, 200),
                ("/v1/completions", {"Origin": ORIGIN}, 401),  # no key: the browser can still read why
                ("/v1/nothing", key, 404),
                ("/completion", {**key}, 200)]:
            status, headers, payload = server.request("POST", path, body, headers=request_headers)
            assert status == expected, payload
            assert headers["Access-Control-Allow-Origin"] == ORIGIN, (path, headers)
        status, headers, payload = server.request("POST", "/v1/completions", {**body, "stream": True}, headers=key)
        assert (status, headers["Content-Type"]) == (200, "text/event-stream")
        assert headers["Access-Control-Allow-Origin"] == ORIGIN
        status, headers, _ = server.request("GET", "/health", headers={"Origin": ORIGIN})
        assert (status, headers["Access-Control-Allow-Origin"]) == (200, ORIGIN)
        status, headers, _ = server.request("PUT", "/v1/completions", headers={"Origin": ORIGIN})  # the base class's 501
        assert (status, headers["Access-Control-Allow-Origin"]) == (501, ORIGIN)
        status, headers, _ = server.request("GET", "/health")  # no Origin (curl, a script): no CORS headers
        assert status == 200
        assert not any(name.startswith("Access-Control-") for name in headers)
    finally:
        server.close()


def test_a_keep_alive_connection_goes_on_after_a_preflight_and_forgets_its_origin(runtime):
    import http.client
    import socket

    server = Served(runtime, ServeDefaults(max_tokens=2))
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        connection.request("OPTIONS", "/completion", headers={"Origin": ORIGIN})
        first = connection.getresponse()
        assert (first.status, first.read()) == (200, b"")
        connection.request("POST", "/completion", body=b'{"prompt": "The quick brown fox", "n_predict": 2}',
                           headers={"Origin": ORIGIN, "Content-Type": "application/json"})
        second = connection.getresponse()
        assert second.status == 200
        assert second.getheader("Access-Control-Allow-Origin") == ORIGIN
        second.read()
        connection.close()
        # a request line refused after a request with an Origin: its answer does not carry that origin
        client = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        client.sendall(b"OPTIONS / HTTP/1.1\r\nHost: x\r\nOrigin: " + ORIGIN.encode() + b"\r\n\r\nGET /a b HTTP/1.1\r\n\r\n")
        received = b""
        while chunk := client.recv(65536):
            received += chunk
        client.close()
        preflight, _, refused = received.partition(b"\r\n\r\n")
        assert b"Access-Control-Allow-Origin: " + ORIGIN.encode() in preflight
        assert refused.startswith(b"HTTP/1.1 400"), refused
        assert b"Access-Control-Allow-Origin" not in refused
    finally:
        server.close()
