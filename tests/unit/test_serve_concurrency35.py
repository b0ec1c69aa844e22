"""``edgesdk serve`` under many clients at once: clients that leave (mid-answer, queued, between requests
on a keep-alive connection), the queue's places and the counts /metrics gives; real bundle, real sockets."""

from __future__ import annotations

import http.client
import socket
import threading

from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve_review import PROMPT, RESET_ON_CLOSE, CountingHook, Served, post_bytes, wait_for


def read_response(client: socket.socket) -> bytes:
    """One whole answer (its Content-Length's bytes) from a keep-alive connection."""
    response = http.client.HTTPResponse(client)
    response.begin()
    return response.read()


def test_a_keep_alive_client_that_resets_between_requests_leaves_no_traceback(runtime, capsys):
    """A client that reads its whole answer, then closes with a reset (bytes it left unread, SO_LINGER 0) while
    the connection waits for its next request: the read of that request line failed with ConnectionResetError,
    which reached socketserver, and the server's log got its traceback for every such client."""
    server = Served(runtime, ServeDefaults(max_tokens=2))
    try:
        before = threading.active_count()
        client = server.raw(post_bytes({"prompt": PROMPT}))
        assert read_response(client)
        assert threading.active_count() == before + 1  # the connection's thread waits for the next request
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
        client.close()
        assert wait_for(lambda: threading.active_count() == before)
        err = capsys.readouterr().err
        assert "Traceback" not in err, err
        assert server.post("/v1/completions", {"prompt": PROMPT})[0] == 200
    finally:
        server.close()


def metric(server: Served, name: str) -> float:
    """One unlabelled sample of GET /metrics."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    connection.close()
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(f"edgesdk_{name} ")))


def test_queued_requests_whose_clients_left_give_their_places_to_live_ones(runtime):
    """Clients that leave while their requests wait behind a long answer (a client's timeout, then its retry):
    their requests kept their places until their turn came, so a live request got 503 server_busy with nobody
    really waiting. A request that finds the queue full takes the place of one whose client left."""
    hook = CountingHook(hold_at=1)
    server = Served(runtime, ServeDefaults(max_tokens=4, max_waiting=2), hook=hook)
    server.server.metrics = True
    try:
        first = server.raw(post_bytes({"prompt": PROMPT}))
        assert hook.held.wait(30)
        for queued in (1, 2):
            leaving = server.raw(post_bytes({"prompt": PROMPT, "stream": queued == 2}))
            assert wait_for(lambda: server.completer.waiting == queued)  # noqa: B023 (waited for here)
            leaving.close()
        live = []
        for queued in (1, 2):
            live.append(server.raw(post_bytes({"prompt": PROMPT})))
            # queued, not refused: the places of the requests whose clients left
            assert wait_for(lambda: server.completer._turn.queued == 1 + queued)  # noqa: B023 (waited for here)
        assert metric(server, "requests_refused_busy_total") == 0
        assert wait_for(lambda: metric(server, "requests_deferred") == 2)
        hook.release.set()
        for client in (first, *live):
            assert client.recv(4096).startswith(b"HTTP/1.1 200")
            client.close()
        assert hook.begins == 3  # the requests whose clients left never ran
        assert wait_for(lambda: server.completer._admitted._value == 3)
    finally:
        hook.release.set()
        server.close()
