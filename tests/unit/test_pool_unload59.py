"""Ollama's unload request for a model still loading (serve/model_pool.py): the model goes once the answer it was
loaded for is written, as Ollama expires a loading runner, where it stayed loaded; and the HTTP server
(serve/http_server.py): the stray CRLF a client sends after a POST body no longer starts the next request's head
deadline."""

from __future__ import annotations

import io
import json
import queue
import socket
import threading
import time

from edgesdk.runtime.session import open_runtime
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.http_server import ApiHandler, DeadlineReader
from edgesdk.serve.model_pool import ModelPool, ServedModel
from tests.unit.test_serve_review import read_until_closed

WAIT_S = 60  # far beyond what any step here takes: only a step that never comes reaches it
FIRST, SECOND = "first", "second"


def _completer(bundle) -> Completer:
    return Completer(open_runtime(bundle.path, threads=1), ServeDefaults(max_tokens=4))


class HeldLoad:
    """A pool's loader that opens the real model once let go: ``started`` is set as a load begins, ``fail`` makes
    the next load raise."""

    def __init__(self):
        self.started, self.go, self.fail = threading.Event(), threading.Event(), False

    def __call__(self, model: ServedModel) -> Completer:
        self.started.set()
        assert self.go.wait(WAIT_S), "the load was never let go"
        if self.fail:
            self.fail = False
            raise OSError("the board ran out of memory")
        return _completer(model.bundle)


def _pool(tiny_bundle, load: HeldLoad) -> ModelPool:
    models = [ServedModel(FIRST, tiny_bundle), ServedModel(SECOND, tiny_bundle)]
    return ModelPool(models, load=load, loaded=_completer(tiny_bundle), log=lambda line: None)


def _acquire_in_thread(pool: ModelPool, name: str) -> tuple[threading.Thread, list]:
    """``pool.acquire(name)`` in a thread: the lease, or what it raised, in the list once it ends."""
    got: list = []

    def run():
        try:
            got.append(pool.acquire(name))
        except BaseException as exc:
            got.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, got


def _wait_until(condition) -> None:
    for _ in range(WAIT_S * 100):
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError("the pool never reached the state waited for")


def _being_loaded(pool: ModelPool, load: HeldLoad) -> tuple[threading.Thread, list]:
    """A request for SECOND whose load is under way (held until ``load.go``)."""
    thread, got = _acquire_in_thread(pool, SECOND)
    assert load.started.wait(WAIT_S)
    assert pool.state == (None, None, SECOND)
    return thread, got


def test_an_unload_request_for_a_model_being_loaded_unloads_it_after_the_answer_it_is_loaded_for(tiny_bundle):
    """``ollama stop`` while the model loads: answered at once, and the model goes when the answer it was loaded for
    is written (it stayed loaded: the unload found no model loaded under its name and did nothing)."""
    load = HeldLoad()
    pool = _pool(tiny_bundle, load)
    thread, got = _being_loaded(pool, load)
    pool.unload(SECOND)
    load.go.set()
    thread.join(WAIT_S)
    lease = got[0]
    assert lease.name == SECOND
    assert pool.loaded[0] == SECOND  # not closed under the answer it was loaded for
    pool.release(lease)
    assert pool.loaded == (None, None)


def test_a_request_waiting_for_the_model_being_loaded_keeps_it_after_an_unload_request(tiny_bundle):
    """As a later request's keep_alive replaces the unload's: the model stays for the request that waited for it."""
    load = HeldLoad()
    pool = _pool(tiny_bundle, load)
    first_thread, first = _being_loaded(pool, load)
    second_thread, second = _acquire_in_thread(pool, SECOND)
    _wait_until(lambda: pool.queued == 2)
    pool.unload(SECOND)
    load.go.set()
    first_thread.join(WAIT_S)
    second_thread.join(WAIT_S)
    pool.release(first[0])
    pool.release(second[0])
    assert pool.loaded[0] == SECOND
    assert second[0].completer is first[0].completer


def test_an_unload_request_for_a_load_that_fails_does_not_unload_the_next_load(tiny_bundle):
    load = HeldLoad()
    load.fail = True
    pool = _pool(tiny_bundle, load)
    thread, got = _being_loaded(pool, load)
    pool.unload(SECOND)
    load.go.set()
    thread.join(WAIT_S)
    assert getattr(got[0], "status", None) == 500, got
    lease = pool.acquire(SECOND)
    pool.release(lease)
    assert pool.loaded[0] == SECOND


# ---------------------------------------------------------------------------------------------------- head deadline
class NotedReads(DeadlineReader):
    """A connection's reading side that notes each read: its bytes, and the head's first byte's time and deadline
    as they stand after it."""

    def __init__(self, connection: socket.socket, timeout: float | None):
        super().__init__(connection, timeout)
        self.reads: queue.Queue = queue.Queue()

    def readinto(self, buffer) -> int:
        count = super().readinto(buffer)
        self.reads.put((bytes(memoryview(buffer)[:count]), self.started, self.deadline))
        return count

    def until_read(self, start: bytes) -> tuple[float | None, float | None]:
        while True:
            data, started, deadline = self.reads.get(timeout=WAIT_S)
            if data.startswith(start):
                return started, deadline


def _answer(client: socket.socket) -> bytes:
    """One whole answer with a Content-Length read from ``client``: its status line."""
    received = b""
    while b"\r\n\r\n" not in received:
        received += client.recv(65536)
    head, _, body = received.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += client.recv(65536)
    return head.split(b"\r\n")[0]


def test_a_stray_crlf_after_a_post_body_does_not_start_the_next_request_s_head_deadline(served):
    """The CRLF after the body comes on its own, the client idles, then sends its next request: that request's
    head has its whole deadline from its own first byte (it counted from the CRLF, and the time the client idled
    was taken from it)."""
    readers: queue.Queue = queue.Queue()

    class Noting(ApiHandler):
        def setup(self) -> None:
            super().setup()
            self._reader = NotedReads(self.connection, self.timeout)
            self.rfile = io.BufferedReader(self._reader)
            readers.put(self._reader)

    server = served.server
    server.RequestHandlerClass = Noting
    body = json.dumps({"prompt": "hi", "max_tokens": 1}).encode()
    client = socket.create_connection(("127.0.0.1", served.port), timeout=WAIT_S)
    try:
        client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        reader = readers.get(timeout=WAIT_S)
        assert _answer(client) == b"HTTP/1.1 200 OK"
        client.sendall(b"\r\n")
        crlf_started, _ = reader.until_read(b"\r\n")
        assert crlf_started is not None  # the CRLF is the first byte read after the answer
        sent = time.monotonic()
        client.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        started, deadline = reader.until_read(b"GET")
        assert started is not None
        assert started >= sent, "the head's deadline counted from the stray CRLF"
        assert deadline == started + min(server.request_timeout_s, server.client_timeout_s or server.request_timeout_s)
        assert read_until_closed(client).startswith(b"HTTP/1.1 200 OK")
    finally:
        client.close()
