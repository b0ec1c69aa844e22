"""``edgesdk serve`` with several bundles (serve/model_pool.py, serve/http_server.py): a request waiting for another
model whose client leaves is not loaded for once its turn comes. Woken by the answer before it, it was taken for
there: the model the other clients were using was unloaded and its own loaded for nobody (Ollama's scheduler skips a
pending request whose client left, server/sched.go ``processPending``). Real bundles, a real pool and server on
127.0.0.1; no timing: each step waits on an event or a state, with limits far past what it takes.

And a path with no route under Ollama's ``/api/`` or the Messages API's ``/v1/messages/`` (a newer Ollama's route,
Anthropic's Message Batches) was refused in OpenAI's error shape, which those clients show as a whole object: its 404
is now in its API's shape, as every other refusal on those routes."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from edgesdk.runtime.session import open_runtime
from edgesdk.serve import model_pool
from edgesdk.serve.completion import ClientGone, Completer, ServeDefaults
from edgesdk.serve.http_server import ApiServer
from edgesdk.serve.model_pool import ModelPool, ServedModel
from tests.unit.test_model_pool47 import bundles  # noqa: F401  (two tiny bundles)
from tests.unit.test_serve_models42 import A, Server
from tests.unit.test_serve_review import CountingHook, read_until_closed

WAIT_S = 60  # far beyond what any step here takes: only a step that never comes reaches it
FIRST, SECOND = "first", "second"
CHAT = [{"role": "user", "content": "Say something."}]


def _completer(bundle, hook=None) -> Completer:
    return Completer(open_runtime(bundle.path, threads=1), ServeDefaults(max_tokens=4), hook=hook)


class CountedLoad:
    """A pool's loader that opens the real model and notes each model it loads."""

    def __init__(self, hook=None):
        self.hook, self.loaded = hook, []

    def __call__(self, model: ServedModel) -> Completer:
        self.loaded.append(model.name)
        return _completer(model.bundle, self.hook)


def _pool(tiny_bundle, load: CountedLoad) -> ModelPool:
    models = [ServedModel(FIRST, tiny_bundle), ServedModel(SECOND, tiny_bundle)]
    return ModelPool(models, load=load, loaded=_completer(tiny_bundle, load.hook), log=lambda line: None)


def _wait_until(condition) -> None:
    for _ in range(WAIT_S * 100):
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError("the state waited for never came")


@pytest.fixture
def woken_only_by_changes(monkeypatch):
    """A waiter wakes only when the pool changes (not on its poll for a client that left), so that the answer
    before it ending is what wakes it, whatever the machine's speed."""
    monkeypatch.setattr(model_pool, "WAIT_POLL_S", 3600.0)


def test_a_waiter_whose_client_left_is_not_loaded_for_when_its_turn_comes(tiny_bundle, woken_only_by_changes):
    load = CountedLoad()
    pool = _pool(tiny_bundle, load)
    before = pool.acquire(FIRST)
    gone, got = threading.Event(), []

    def wait_for_second() -> None:
        try:
            got.append(pool.acquire(SECOND, client_gone=gone.is_set))
        except BaseException as exc:
            got.append(exc)

    thread = threading.Thread(target=wait_for_second, daemon=True)
    thread.start()
    _wait_until(lambda: pool.queued == 1)
    gone.set()  # the client leaves while the answer before it is written
    pool.release(before)
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert isinstance(got[0], ClientGone), got
    assert load.loaded == []  # it was loaded, and the first unloaded, for nobody
    assert pool.state[0] == FIRST
    assert pool.state[2] is None
    assert pool.queued == 0


def test_a_waiter_whose_client_stays_is_still_loaded_for(tiny_bundle, woken_only_by_changes):
    load = CountedLoad()
    pool = _pool(tiny_bundle, load)
    before = pool.acquire(FIRST)
    got = []
    thread = threading.Thread(target=lambda: got.append(pool.acquire(SECOND, client_gone=lambda: False)), daemon=True)
    thread.start()
    _wait_until(lambda: pool.queued == 1)
    pool.release(before)
    thread.join(WAIT_S)
    assert got[0].name == SECOND
    assert load.loaded == [SECOND]
    pool.release(got[0])


def _post(port: int, body: dict, path: str = "/v1/chat/completions") -> socket.socket:
    data = json.dumps(body).encode()
    client = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    client.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                   b"Connection: close\r\n\r\n%s" % (path.encode(), len(data), data))
    return client


def test_a_request_for_another_model_cancelled_behind_a_stream_swaps_nothing(tiny_bundle, woken_only_by_changes):
    """Over HTTP: a stream on the first model holds the board, a request for the second waits behind it and its
    client leaves; once the stream ends the first model is still loaded, and answers the next request."""
    hook = CountingHook(hold_at=3)
    load = CountedLoad(hook)
    pool = _pool(tiny_bundle, load)
    server = ApiServer(("127.0.0.1", 0), pool.completer, FIRST, log=False, pool=pool)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        stream = _post(port, {"model": FIRST, "messages": CHAT, "stream": True, "max_tokens": 8})
        assert hook.held.wait(WAIT_S)
        waiting = _post(port, {"model": SECOND, "messages": CHAT, "max_tokens": 2})
        _wait_until(lambda: pool.queued == 1)
        waiting.close()
        hook.release.set()
        assert read_until_closed(stream).startswith(b"HTTP/1.1 200 OK")
        stream.close()
        _wait_until(lambda: pool.queued == 0)
        assert load.loaded == []
        again = _post(port, {"model": FIRST, "messages": CHAT, "max_tokens": 2})
        assert read_until_closed(again).startswith(b"HTTP/1.1 200 OK")
        again.close()
        assert load.loaded == []
        assert pool.state[0] == FIRST
    finally:
        server.shutdown()
        server.server_close()


class _Served:
    """One tiny bundle behind a real server on a free port."""

    def __init__(self, bundle, api_key=None):
        self.server = ApiServer(("127.0.0.1", 0), _completer(bundle), "tiny-host", api_key=api_key, log=False)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def ask(self, method: str, path: str, body: bytes = b"") -> tuple[bytes, dict]:
        client = socket.create_connection(("127.0.0.1", self.port), timeout=WAIT_S)
        client.sendall(b"%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                       % (method.encode(), path.encode(), len(body), body))
        head, _, payload = read_until_closed(client).partition(b"\r\n\r\n")
        client.close()
        return head.split(b"\r\n")[0], json.loads(payload)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def alone(tiny_bundle):
    served = _Served(tiny_bundle)
    yield served
    served.close()


@pytest.mark.parametrize(("method", "path"), [("GET", "/api/me"), ("POST", "/api/experimental/aliases"),
                                              ("GET", "/api/tags/extra"), ("DELETE", "/api/nothing?x=1")])
def test_no_route_under_ollamas_api_is_ollamas_404(alone, method, path):
    status, body = alone.ask(method, path, b"{}" if method == "POST" else b"")
    assert status == b"HTTP/1.1 404 Not Found"
    assert isinstance(body["error"], str), body
    assert body["error"].startswith(f"no route {method} {path.split('?')[0]}")


@pytest.mark.parametrize("path", ["/v1/messages/batches", "/v1/messages/batches/msgbatch_1/results"])
def test_no_route_under_the_messages_api_is_anthropics_not_found_error(alone, path):
    status, body = alone.ask("POST" if path.endswith("batches") else "GET", path, b"{}")
    assert status == b"HTTP/1.1 404 Not Found"
    assert body["type"] == "error"
    assert body["error"]["type"] == "not_found_error", body


def test_no_route_elsewhere_keeps_openai_s_404(alone):
    for path in ("/v1/nope", "/v1/api/chat", "/apis"):
        status, body = alone.ask("GET", path)
        assert status == b"HTTP/1.1 404 Not Found"
        assert body["error"]["code"] == "not_found", body


def test_an_ollama_path_without_the_key_is_refused_in_ollama_s_shape(tiny_bundle):
    served = _Served(tiny_bundle, api_key="secret")
    try:
        status, body = served.ask("GET", "/api/me")
        assert status == b"HTTP/1.1 401 Unauthorized"
        assert isinstance(body["error"], str), body
    finally:
        served.close()


# ----------------------------------------------------------------------------- the loaded model, read once
def test_ps_and_props_read_the_loaded_model_once(bundles, monkeypatch):  # noqa: F811
    """/api/ps and /props read the pool's completer, then its name and completer again: an unload between the two
    reads answered a 503 where Ollama lists no model. The first read is made to see a model that the second no
    longer has, as an unload landing between them would."""
    server = Server(bundles)
    try:
        server.post("/v1/completions", {"model": A, "prompt": "Once", "max_tokens": 1})
        seen = pool_completer = server.pool.completer
        assert seen is not None
        monkeypatch.setattr(ModelPool, "completer", property(lambda pool: pool_completer))  # the first read: loaded
        monkeypatch.setattr(ModelPool, "loaded", property(lambda pool: (None, None)))  # the second: unloaded since
        status, body = server.get("/api/ps")
        assert (status, body) == (200, {"models": []})
        status, body = server.get("/props")  # no model loaded: the default one's, loaded for it, as ?model= asks
        assert status == 200, body
        assert body["model_alias"] == A, body
    finally:
        monkeypatch.undo()
        server.close()
