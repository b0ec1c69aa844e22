"""``edgesdk serve``: a port taken or an address this machine lacks refused before any bundle is verified or loaded,
as llama-server's bind fails before its model loads; with several bundles, Ollama's unload request (``keep_alive``
0, nothing to generate) answered at once while another request holds the model, which goes once that answer is
written, unless a request for it is granted meanwhile (Ollama's ``expireRunner``)."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import threading

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from tests.unit.test_serve_models42 import CHAT, A, B, Server, bundles  # noqa: F401 (bundles: a fixture)
from tests.unit.test_serve_review import CountingHook

WAIT_S = 30  # far beyond what any step here takes: only a request that waits for another answer reaches it


@pytest.fixture
def damaged(tiny_bundle, tmp_path):
    """A copy of the tiny bundle whose graph no longer matches its manifest's hash: opening it fails."""
    copy = shutil.copytree(tiny_bundle.path, tmp_path / "damaged")
    graph = next(copy.glob("*.onnx"))
    graph.write_bytes(graph.read_bytes() + b"\0")
    return copy


def test_a_port_in_use_is_refused_before_the_bundle_is_opened(damaged):
    """The port's error, not the damaged bundle's: the bind is tried before anything is opened (it came after the
    model had loaded, which takes minutes on a board, or here failed on the bundle first)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["serve", str(damaged), "--port", str(port)])
    assert result.exit_code == 1, result.output
    assert f"cannot listen on 127.0.0.1:{port} (Address already in use)" in result.output
    assert "pick another --port" in result.output
    assert "hash" not in result.output


def test_an_address_this_machine_lacks_is_refused_before_the_bundle_is_opened(damaged):
    result = CliRunner().invoke(main, ["serve", str(damaged), "--host", "192.0.2.1", "--port", "0"])  # TEST-NET-1
    assert result.exit_code == 1, result.output
    assert "cannot listen on 192.0.2.1:0" in result.output
    assert "pass an address of this machine to --host" in result.output


def test_a_free_port_still_serves_after_the_check(tiny_bundle):
    """The check lets its socket go: the server binds the same port after it."""
    from edgesdk.cli_serve import _check_can_listen

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    _check_can_listen("127.0.0.1", port)
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))


@pytest.fixture
def held(bundles):  # noqa: F811 (the fixture imported above)
    """Two bundles served, a hook that holds the first step of the first answer until released."""
    hook = CountingHook(hold_at=1)
    server = Server(bundles, hook=hook)
    yield server, hook
    hook.release.set()
    server.close()


def _in_thread(call) -> tuple[threading.Thread, threading.Event, list]:
    done, raised = threading.Event(), []

    def run():
        try:
            call()
        except BaseException as exc:
            raised.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, done, raised


def test_an_unload_request_does_not_wait_for_the_answer_holding_the_model(held):
    server, _ = held
    pool = server.pool
    lease = pool.acquire(A)
    try:
        _, done, raised = _in_thread(lambda: pool.unload(A))
        assert done.wait(WAIT_S), "the unload request waited for the answer holding the model"
        assert not raised, raised
        assert pool.loaded[0] == A  # held: not closed under the answer
    finally:
        pool.release(lease)
    assert pool.loaded == (None, None)  # gone with its last holder, as Ollama's expired runner


def test_a_request_granted_after_an_unload_request_keeps_the_model(held):
    """As Ollama's scheduler gives a later request the loaded runner and its keep_alive: the model is neither closed
    after the first answer nor loaded again for the second."""
    server, _ = held
    pool = server.pool
    first = pool.acquire(A)
    second = []
    try:
        _, done, raised = _in_thread(lambda: (pool.unload(A), second.append(pool.acquire(A))))
        assert done.wait(WAIT_S), "the unload request waited for the answer holding the model"
        assert not raised, raised
        pool.release(first)
        assert second[0].completer is first.completer
    finally:
        if not done.is_set():
            pool.release(first)
    pool.release(second[0])
    assert pool.loaded[0] == A


def test_an_unload_request_for_a_model_not_loaded_changes_nothing(held):
    server, _ = held
    server.pool.unload(B)
    assert server.pool.loaded[0] == A


def test_ollama_s_unload_answer_comes_while_an_answer_streams(held):
    """Over HTTP: the answer is held at its first step; Ollama's unload request for its model is answered at once,
    /api/ps lists the model until the answer is written, and not after."""
    server, hook = held
    streaming = http.client.HTTPConnection("127.0.0.1", server.port, timeout=WAIT_S * 3)
    streaming.request("POST", "/api/chat", body=json.dumps({"model": A, "messages": CHAT}),
                      headers={"Content-Type": "application/json"})
    assert hook.held.wait(WAIT_S)
    unloading = http.client.HTTPConnection("127.0.0.1", server.port, timeout=WAIT_S)
    try:
        unloading.request("POST", "/api/generate", body=json.dumps({"model": A, "keep_alive": 0}),
                          headers={"Content-Type": "application/json"})
        response = unloading.getresponse()
        assert (response.status, json.loads(response.read())["done_reason"]) == (200, "unload")
    finally:
        unloading.close()
    assert [entry["name"] for entry in server.get("/api/ps")[1]["models"]] == [f"{A}:latest"]
    hook.release.set()
    answer = streaming.getresponse()
    assert answer.status == 200
    lines = [json.loads(line) for line in answer.read().splitlines() if line.strip()]
    streaming.close()
    assert lines[-1]["done"] is True
    assert server.get("/api/ps")[1] == {"models": []}
