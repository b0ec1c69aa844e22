"""``/health`` and ``/metrics`` report the board's temperature now, not the one the last request's steps read."""

from __future__ import annotations

import json
import time

import pytest

from edgesdk.profile import get_profile
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.thermal.watch import open_session
from tests._utils.metrics_server import MetricsServer
from tests._utils.sysfs import make_zone


@pytest.fixture
def board(runtime, tmp_path):
    """A server guarded by a real sensor poller over a sysfs tree whose ``cpu-thermal`` zone the test writes."""
    zone = make_zone(tmp_path / "thermal", 0, "cpu-thermal", "50000\n")
    thermal = open_session(get_profile("rpi5"), guard=True, simulate=False, status=False,
                           sysfs_root=str(tmp_path / "thermal"))
    server = MetricsServer(Completer(runtime, ServeDefaults(max_tokens=2), hook=thermal.hook), thermal)
    yield server, zone
    server.close()
    thermal.close()


def health_temperature(server) -> float | None:
    status, text = server.request("GET", "/health")
    assert status == 200, text
    return json.loads(text)["thermal"]["temperature_c"]


def test_an_idle_server_reports_the_sensor_s_temperature_not_the_last_request_s(board):
    """The temperature came from the hook's last step: ``null`` before the first request, and the value the last
    request read for as long as the server then stayed idle, however the board had heated or cooled since."""
    server, zone = board
    assert health_temperature(server) == 50.0  # before any request
    status, _ = server.request("POST", "/v1/completions", {"prompt": "hello", "max_tokens": 2})
    assert status == 200
    (zone / "temp").write_text("64500\n")
    deadline = time.monotonic() + 30.0  # the poller reads every 0.5 s; wait for its next poll, not a fixed time
    while health_temperature(server) != 64.5 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert health_temperature(server) == 64.5
    assert server.metrics()["edgesdk_thermal_temperature_celsius"] == 64.5
