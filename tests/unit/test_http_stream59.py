"""The HTTP server (edgesdk/serve/http_server.py) where an error after a stream's headers were out was answered with a
second status line and headers written into the open stream, where /health with several bundles read the loaded model
and the one a swap loads one after the other (a swap that ended between the two reads was told as no model at all),
and where a route with a trailing slash was a 404 on some routes and the route itself on others."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from edgesdk.runtime.session import open_runtime
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.http_server import ApiServer
from edgesdk.serve.model_pool import ModelPool, ServedModel
from tests.unit.test_serve import Served
from tests.unit.test_serve_review import CountingHook, read_until_closed

CLOSE_FAILED = "the backend's device went away as it closed"


class Pooled:
    """A real server over a pool of two models of the tiny bundle ("first" loaded, "second"), on a free port."""

    def __init__(self, pool: ModelPool):
        self.pool = pool
        self.server = ApiServer(("127.0.0.1", 0), pool.completer, "first", log=False, pool=pool)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def send(self, method: str, path: str, body: dict | None = None) -> socket.socket:
        data = b"" if body is None else json.dumps(body).encode()
        client = socket.create_connection(("127.0.0.1", self.port), timeout=60)
        client.sendall(b"%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                       b"Connection: close\r\n\r\n%s" % (method.encode(), path.encode(), len(data), data))
        return client

    def exchange(self, method: str, path: str, body: dict | None = None) -> tuple[bytes, bytes]:
        """The head and the body of the answer, read to the connection's close."""
        client = self.send(method, path, body)
        received = read_until_closed(client)
        client.close()
        head, _, payload = received.partition(b"\r\n\r\n")
        return head, payload

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _failing_to_close(tiny_bundle, hook=None) -> Completer:
    """A completer of its own runtime whose backend fails as the model is unloaded (closed)."""
    runtime = open_runtime(tiny_bundle.path, threads=1)

    def close() -> None:
        raise RuntimeError(CLOSE_FAILED)

    runtime.backend.close = close
    return Completer(runtime, ServeDefaults(max_tokens=4), hook=hook)


def _pool(tiny_bundle, loaded: Completer, load=None, kind=ModelPool) -> ModelPool:
    models = [ServedModel("first", tiny_bundle), ServedModel("second", tiny_bundle)]
    return kind(models, load=load or (lambda model: Completer(open_runtime(model.bundle.path, threads=1),
                                                              ServeDefaults(max_tokens=4))),
                loaded=loaded, log=lambda line: None)


# ---------------------------------------------------------------------------------------------------- a stream's error
def test_an_error_after_an_sse_stream_s_headers_is_the_stream_s_last_event(tiny_bundle):
    """The model of a streamed chat answer is unloaded as its answer ends (an Ollama unload request came while it
    streamed), and the unload fails: the error is the stream's own error event, as an error within the generation
    is, and the connection closes after it. It was a second ``HTTP/1.1 500`` status line with its headers written
    into the open event stream."""
    hook = CountingHook(hold_at=2)  # the opening and the first piece are out; the first decode is held
    served = Pooled(_pool(tiny_bundle, _failing_to_close(tiny_bundle, hook)))
    try:
        client = served.send("POST", "/v1/chat/completions", {"model": "first", "stream": True, "max_tokens": 4,
                                                              "messages": [{"role": "user", "content": "hi"}]})
        assert hook.held.wait(60)
        head, payload = served.exchange("POST", "/api/generate", {"model": "first", "keep_alive": 0})
        assert head.startswith(b"HTTP/1.1 200"), payload  # answered at once: the model goes as the stream ends
        hook.release.set()
        received = read_until_closed(client)
        client.close()
    finally:
        hook.release.set()
        served.close()
    head, _, stream = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"Content-Type: text/event-stream" in head
    assert b"HTTP/1.1" not in stream, stream
    events = [event for event in stream.decode().split("\n\n") if event]
    assert all(event.startswith("data: ") for event in events), events
    assert json.loads(events[0][len("data: "):])["object"] == "chat.completion.chunk"
    error = json.loads(events[-1][len("data: "):])["error"]
    assert CLOSE_FAILED in error["message"], error
    assert error["type"] == "server_error"
    assert "[DONE]" not in stream.decode()  # the stream ended in its error, as after an error within the generation


def test_an_error_after_an_ollama_stream_s_headers_is_the_stream_s_last_line(tiny_bundle):
    """Ollama's ``keep_alive`` 0 unloads the model as the streamed answer ends; an unload that fails is the stream's
    last line, Ollama's ``{"error": ...}``, not an HTTP answer written inside the newline-delimited JSON."""
    served = Pooled(_pool(tiny_bundle, _failing_to_close(tiny_bundle)))
    try:
        head, stream = served.exchange("POST", "/api/generate", {"model": "first", "prompt": "hi", "keep_alive": 0,
                                                                 "options": {"num_predict": 2}})
    finally:
        served.close()
    assert head.startswith(b"HTTP/1.1 200")
    assert b"Content-Type: application/x-ndjson" in head
    assert b"HTTP/1.1" not in stream, stream
    lines = [json.loads(line) for line in stream.decode().splitlines()]
    # the answer's lines (a piece ending in a cut character is held back on the Ollama routes), then the error
    assert all(line["done"] is False for line in lines[:-1]), lines
    assert set(lines[-1]) == {"error"}
    assert CLOSE_FAILED in lines[-1]["error"]


# ---------------------------------------------------------------------------------------------------- /health in a swap
class _SwapEndsBetweenReads(ModelPool):
    """A pool whose :attr:`loaded`, once armed, lets the swap under way end before it returns what it read: the
    interleaving of a /health that read ``loaded``, then ``loading`` as the swap ended between the two."""

    armed = False

    @property
    def loaded(self):
        read = ModelPool.loaded.fget(self)
        if self.armed and threading.current_thread() is not self.swapper:
            self.armed = False
            self.gate.set()
            self.swapper.join(60)
        return read


def test_health_reads_the_loaded_model_and_the_swap_together(tiny_bundle):
    gate, loading = threading.Event(), threading.Event()

    def load(model: ServedModel) -> Completer:
        loading.set()  # "first" is unloaded, "second" not yet loaded
        assert gate.wait(60)
        return Completer(open_runtime(model.bundle.path, threads=1), ServeDefaults(max_tokens=2))

    first = Completer(open_runtime(tiny_bundle.path, threads=1), ServeDefaults(max_tokens=2))  # closed by the swap
    pool = _pool(tiny_bundle, first, load, _SwapEndsBetweenReads)
    pool.gate, leases = gate, []
    pool.swapper = threading.Thread(target=lambda: leases.append(pool.acquire("second")), daemon=True)
    served = Pooled(pool)
    try:
        pool.swapper.start()
        assert loading.wait(60)
        pool.armed = True
        head, payload = served.exchange("GET", "/health")
    finally:
        gate.set()
        pool.swapper.join(60)
        for lease in leases:
            pool.release(lease)
        served.close()
    assert head.startswith(b"HTTP/1.1 200")
    body = json.loads(payload)
    # what was true at one moment: no model loaded, "second" being loaded (busy, a request waits for it)
    assert (body["model"], body.get("loading"), body["busy"]) == (None, "second", True), body


# ---------------------------------------------------------------------------------------------------- trailing slashes
@pytest.mark.parametrize("path", ["/health", "/v1/health", "/props", "/slots", "/metrics", "/v1/models", "/models",
                                  "/v1/models/tiny-host", "/api/tags", "/api/version", "/api/ps"])
def test_a_trailing_slash_names_the_same_route_on_every_route(served, path):
    """``/v1/models/`` and ``/api/tags/`` were their routes while ``/health/``, ``/props/`` and ``/slots/`` were a
    404: a path with a trailing slash is the route without it on every route (Ollama's router sends it there)."""
    status = served.request("GET", path)[0]
    assert status != 404
    assert served.request("GET", path + "/")[0] == status, path


def test_a_trailing_slash_keeps_the_route_s_place_under_an_api_key(runtime):
    """Under an API key /health/ is as open as /health (it was a 401) and /v1/models/ as open as /v1/models; /props/
    needs the key as /props does; a route that does not exist is a 401 without the key, as llama-server checks the
    key before it routes (its pre-routing handler), and a 404 with it."""
    server = Served(runtime, ServeDefaults(max_tokens=2), api_key="sesame")
    key = {"Authorization": "Bearer sesame"}
    try:
        for path, without, with_key in [("/health/", 200, 200), ("/v1/health/", 200, 200), ("/v1/models/", 200, 200),
                                        ("/props/", 401, 200), ("/slots/", 401, 200), ("/nothing/", 401, 404)]:
            assert server.request("GET", path)[0] == without, path
            assert server.request("GET", path, headers=key)[0] == with_key, path
        status, _, payload = server.request("POST", "/v1/completions/", {"prompt": "hi", "max_tokens": 1}, headers=key)
        assert status == 200, payload
    finally:
        server.close()
