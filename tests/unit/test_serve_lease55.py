"""Several bundles served: a whole answer's lease on its model ends before the answer is written, so a client that
asks again as soon as it has its answer finds the model free. The lease was held until the handler's end, and with
``--max-queue 0`` such a next request got a 503 "server is busy" from a server with nothing left to do (the last CI
run's failure, a race a loaded machine loses)."""

from __future__ import annotations

import http.client
import json
import time

from edgesdk.serve.completion import ServeDefaults
from tests.unit.test_serve_models42 import CHAT, A, B, Server, bundles  # noqa: F401 (bundles: a fixture)


def test_a_whole_answers_lease_ends_before_its_client_reads_it(bundles):  # noqa: F811
    server = Server(bundles, defaults=ServeDefaults(max_tokens=2, max_waiting=0))
    pool = server.pool
    release = pool.release

    def slow_release(lease, unload=False, keep_alive=None):  # a loaded machine: the release comes late, wherever
        # it is called
        time.sleep(0.5)
        release(lease, unload=unload, keep_alive=keep_alive)

    pool.release = slow_release
    try:
        status, body = server.post("/v1/chat/completions", {"model": B, "messages": CHAT})
        assert (status, body.get("model")) == (200, B), body
        assert pool._holders == 0  # released before the answer was written: the client has it only after that
        status, body = server.post("/api/generate", {"model": A, "prompt": "x", "stream": False})
        assert status == 200, body  # the next request, at once: A loaded for it, no 503 under --max-queue 0
        for path, streamed, last in (
                ("/v1/chat/completions", {"model": B, "messages": CHAT, "stream": True}, b"data: [DONE]"),
                ("/completion", {"model": A, "prompt": "x", "n_predict": 2, "stream": True}, b'"stop": true'),
                ("/v1/responses", {"model": B, "input": "x", "max_output_tokens": 2, "stream": True},
                 b"event: response.incomplete"),  # its 2 tokens are its limit
                ("/v1/messages", {"model": A, "max_tokens": 2, "stream": True, "messages": CHAT},
                 b"event: message_stop")):
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
            connection.request("POST", path, json.dumps(streamed), {"Content-Type": "application/json"})
            response = connection.getresponse()
            assert response.status == 200, path
            while last not in (line := response.readline()):  # up to the stream's last event, the connection open
                assert line, (path, "the stream ended before its last event")
            assert pool._holders == 0, path  # released before the last event was written, not at the handler's end
            response.read()
            connection.close()
    finally:
        pool.release = release
        server.close()
