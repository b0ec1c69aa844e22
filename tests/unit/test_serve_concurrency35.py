"""``edgesdk serve`` under many clients at once: clients that leave (mid-answer, queued, between requests
on a keep-alive connection), the queue's places and the counts /metrics gives; real bundle, real sockets."""

from __future__ import annotations

import http.client
import socket
import threading

from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve_review import PROMPT, RESET_ON_CLOSE, Served, post_bytes, wait_for


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
