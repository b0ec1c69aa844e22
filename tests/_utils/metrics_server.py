"""A real ``edgesdk serve`` server with ``/metrics`` over a Completer, in a background thread: requests to it, its
metrics read back, and the thermal session its guard holds closed with it."""

from __future__ import annotations

import http.client
import json
import threading

from edgesdk.serve.http_server import ApiServer


class MetricsServer:
    """``completer`` served on a free port of 127.0.0.1 with /metrics; ``thermal`` (the session whose hook the
    completer steps, or None) is closed after the server."""

    def __init__(self, completer, thermal=None):
        self.completer, self.thermal = completer, thermal
        self.server = ApiServer(("127.0.0.1", 0), completer, "tiny", log=False, metrics=True)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, str]:
        connection = http.client.HTTPConnection("127.0.0.1", self.server.server_address[1], timeout=120)
        connection.request(method, path, None if body is None else json.dumps(body),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        text = response.read().decode()
        connection.close()
        return response.status, text

    def metrics(self) -> dict[str, float]:
        """Every sample of GET /metrics: its name with labels -> its value."""
        status, text = self.request("GET", "/metrics")
        assert status == 200, text
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines() if not line.startswith("#")}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self.thermal is not None:
            self.thermal.close()
