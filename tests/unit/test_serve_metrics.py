"""``edgesdk serve --metrics``: GET /metrics in Prometheus' text format, counted from real answers."""

from __future__ import annotations

import http.client
import json
import threading

import pytest

from edgesdk.profile import get_profile
from edgesdk.runtime.session import open_runtime
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.http_server import ApiServer
from edgesdk.thermal.watch import open_session


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    return open_runtime(tiny_bundle.path, threads=1)


def start(runtime, metrics: bool, hook=None):
    completer = Completer(runtime, ServeDefaults(max_tokens=16), hook=hook)
    server = ApiServer(("127.0.0.1", 0), completer, "tiny", log=False, metrics=metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def ask(server, method: str, path: str, body: dict | None = None) -> tuple[int, str, str]:
    connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=60)
    connection.request(method, path, body=None if body is None else json.dumps(body))
    response = connection.getresponse()
    text = response.read().decode()
    connection.close()
    return response.status, response.getheader("Content-Type"), text


def samples(text: str) -> dict[str, float]:
    """name{labels} -> value, checking every line is a comment or a sample."""
    values = {}
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        name, value = line.rsplit(" ", 1)
        values[name] = float(value)
    return values


def test_metrics_count_what_the_answers_did(runtime):
    server = start(runtime, metrics=True)
    try:
        _, _, first = ask(server, "POST", "/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 5})
        _, _, second = ask(server, "POST", "/v1/completions", {"prompt": "Edge boards run", "max_tokens": 3})
        usage = [json.loads(body)["usage"] for body in (first, second)]
        reasons = [json.loads(body)["choices"][0]["finish_reason"] for body in (first, second)]
        status, kind, text = ask(server, "GET", "/metrics")
    finally:
        server.shutdown()
        server.server_close()
    assert status == 200
    assert kind.startswith("text/plain; version=0.0.4")
    values = samples(text)
    assert values["edgesdk_prompt_tokens_total"] == sum(u["prompt_tokens"] for u in usage)
    assert values["edgesdk_tokens_predicted_total"] == sum(u["completion_tokens"] for u in usage)
    assert values["edgesdk_prompt_seconds_total"] > 0
    for reason in ("stop", "length"):
        assert values[f'edgesdk_requests_finished_total{{finish_reason="{reason}"}}'] == reasons.count(reason)
    assert values["edgesdk_requests_processing"] == 0
    assert values["edgesdk_requests_deferred"] == 0
    assert "edgesdk_thermal_level" not in text  # no guard: no thermal samples


def test_metrics_report_the_guard(runtime):
    thermal = open_session(get_profile("rpi5"), guard=True, simulate=True, status=False)
    server = start(runtime, metrics=True, hook=thermal.hook)
    try:
        ask(server, "POST", "/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 4})
        values = samples(ask(server, "GET", "/metrics")[2])
    finally:
        server.shutdown()
        server.server_close()
        thermal.close()
    assert values['edgesdk_thermal_level{level="normal"}'] == 1
    assert values['edgesdk_thermal_level{level="hot"}'] == 0
    assert values["edgesdk_thermal_paused"] == 0
    assert 0 < values["edgesdk_thermal_temperature_celsius"] < 100


def test_metrics_are_off_unless_asked_for(runtime):
    server = start(runtime, metrics=False)
    try:
        status, _, text = ask(server, "GET", "/metrics")
    finally:
        server.shutdown()
        server.server_close()
    assert status == 501  # llama-server's answer with its metrics endpoint off
    assert json.loads(text)["error"]["type"] == "not_supported_error"
    assert "--metrics" in json.loads(text)["error"]["message"]
