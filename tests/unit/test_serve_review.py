"""``edgesdk serve``: clients that leave, HTTP framing, stopping the server; real bundle, real sockets."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest

from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.session import open_runtime
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.http_server import ApiServer

PROMPT = "The quick brown fox"
RESET_ON_CLOSE = b"\x01\x00\x00\x00\x00\x00\x00\x00"  # SO_LINGER on, 0 s: close sends a reset


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    return open_runtime(tiny_bundle.path, threads=1)


class CountingHook:
    """A StepHook that counts requests and steps; ``hold_at`` holds the step of that number (1: the
    first prefill) until :attr:`release` is set, and :attr:`held` says it got there."""

    def __init__(self, hold_at: int | None = None):
        self.hold_at = hold_at
        self.held, self.release = threading.Event(), threading.Event()
        self.begins, self.steps, self.ends = 0, 0, []

    def begin(self, prompt_tokens, max_new_tokens):
        self.begins += 1

    def before_step(self, kind):
        if self.steps + 1 == self.hold_at:
            self.held.set()
            assert self.release.wait(60)
        return 0.0

    def after_step(self, kind, tokens, compute_s):
        self.steps += 1

    def end(self, stats):
        self.ends.append(stats)


class Served:
    def __init__(self, runtime, defaults: ServeDefaults, hook=None):
        self.completer = Completer(runtime, defaults, hook=hook)
        self.server = ApiServer(("127.0.0.1", 0), self.completer, "tiny-host", log=False)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        connection.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        payload = json.loads(response.read())
        connection.close()
        return response.status, payload

    def raw(self, data: bytes) -> socket.socket:
        client = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        client.sendall(data)
        return client

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def post_bytes(body: dict, path: str = "/v1/completions") -> bytes:
    data = json.dumps(body).encode()
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (path.encode(), len(data), data)


def wait_for(condition, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def runs_to_max_tokens(runtime, max_tokens: int) -> None:
    ids = runtime.tokenizer.prompt_ids(PROMPT, raw=True)
    _, stats = generate(runtime.backend, ids, SamplingConfig(max_new_tokens=max_tokens),
                        runtime.tokenizer.eos_token_ids)
    assert stats.stop_reason == "max_new_tokens", "the tiny model must run to max_tokens for this check"


# ------------------------------------------------------------------------------------ clients that leave


def test_a_request_whose_client_left_while_it_waited_never_runs(runtime):
    """llama-server drops a queued request whose connection closed; the board's turn goes to the next one."""
    hook = CountingHook(hold_at=1)
    server = Served(runtime, ServeDefaults(max_tokens=4), hook=hook)
    try:
        first = server.raw(post_bytes({"prompt": PROMPT}))
        assert hook.held.wait(30)
        free = server.completer.defaults.max_waiting  # places left in the queue
        for stream in (False, True):
            leaving = server.raw(post_bytes({"prompt": PROMPT, "max_tokens": 50, "stream": stream}))
            free -= 1
            assert wait_for(lambda: server.completer._admitted._value == free)  # noqa: B023 (waited for here)
            leaving.close()
        hook.release.set()
        assert first.recv(4096).startswith(b"HTTP/1.1 200")
        first.close()
        assert wait_for(lambda: server.completer._admitted._value == server.completer.defaults.max_waiting + 1)
        assert hook.begins == 1, "a request whose client had left was generated"
        assert server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 2})[0] == 200
    finally:
        hook.release.set()
        server.close()


def test_a_whole_answer_stops_when_its_client_leaves(runtime):
    """A request without stream writes nothing until its end, so no failed write tells that the client
    left; the generation stops at the next token all the same."""
    runs_to_max_tokens(runtime, 200)
    hook = CountingHook(hold_at=4)  # the third decode step
    server = Served(runtime, ServeDefaults(max_tokens=200), hook=hook)
    try:
        client = server.raw(post_bytes({"prompt": PROMPT, "max_tokens": 200}))
        assert hook.held.wait(30)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
        client.close()
        hook.release.set()
        assert wait_for(lambda: hook.ends)
        assert hook.ends == [None]  # ended early, through the hook's end of request
        assert hook.steps <= 5
        assert wait_for(lambda: not server.completer.busy)
        assert server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 2})[0] == 200
    finally:
        hook.release.set()
        server.close()
