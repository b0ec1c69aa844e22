"""``edgesdk serve --watch-thermal`` between requests and while the guard holds one back: ``/health`` and ``/metrics``
report the level the board's temperature now gives (not the last request's beside a newer temperature), the server
says on stderr when the guard's level or pause changes, and an answer carries the time the guard held it back (real
sensor pollers over sysfs trees the tests write, a real ONNX Runtime session, real sockets)."""

from __future__ import annotations

import io
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from edgesdk.cli_serve import ThermalChanges
from edgesdk.profile import get_profile
from edgesdk.serve.api import CompletionRequest
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.http_server import thermal_health
from edgesdk.thermal.guard import Guard, GuardConfig, Level, Limits
from edgesdk.thermal.sensors import Reading
from edgesdk.thermal.watch import open_session
from tests._utils.metrics_server import MetricsServer
from tests._utils.sysfs import make_zone

# rpi5's guard: warm from 70 °C (resume), hot from 71.5 °C, paused from its 78 °C hard limit; hysteresis 1 °C, dwell 10 s


def rpi5_guard() -> Guard:
    profile = get_profile("rpi5")
    return Guard(Limits.resolve(profile.thermal)[0], profile.thermal_model)


def reading(at: float, temp_c: float) -> Reading:
    return Reading(at, {"cpu-thermal": temp_c})


def test_level_for_classifies_a_reading_as_the_guard_would_without_moving_it():
    """A rise at once; a fall only past the hysteresis and after the dwell; a pause only below the resume point; and
    the guard's own level, its time in it and its rate untouched."""
    guard = rpi5_guard()
    guard.observe(0.0, reading(0.0, 72.0))
    assert guard.level is Level.HOT
    before = (guard.level, guard.since, guard.fraction, guard.now)
    assert guard.level_for(80.0, 1.0) is Level.CRITICAL  # a rise: at once
    assert guard.level_for(50.0, 1.0) is Level.HOT  # a fall within the 10 s dwell: held
    assert guard.level_for(50.0, 20.0) is Level.NORMAL
    assert guard.level_for(71.0, 20.0) is Level.HOT  # 71 + 1 °C hysteresis is still above hot's 71.5 °C
    assert guard.level_for(70.2, 20.0) is Level.WARM
    assert (guard.level, guard.since, guard.fraction, guard.now) == before
    guard.observe(1.0, reading(1.0, 80.0))
    assert guard.paused
    assert guard.level_for(75.0, 30.0) is Level.CRITICAL  # a pause ends below the resume point, not before
    assert guard.level_for(69.0, 30.0) is Level.WARM  # 69 + 1 °C hysteresis reaches warm's 70 °C
    assert guard.level_for(68.5, 30.0) is Level.NORMAL
    # the guard moves by it: the next reading puts it where level_for said
    guard.observe(30.0, reading(30.0, 68.5))
    assert guard.level is Level.NORMAL
    assert not guard.paused


@pytest.fixture
def board(runtime, tmp_path):
    """A server guarded by a real sensor poller over a sysfs tree whose ``cpu-thermal`` zone the test writes; the
    guard leaves a level at once (no dwell), so that a pause ends as soon as the board reads cool."""
    zone = make_zone(tmp_path / "thermal", 0, "cpu-thermal", "50000\n")
    thermal = open_session(get_profile("rpi5"), guard=True, simulate=False, status=False,
                           sysfs_root=str(tmp_path / "thermal"), config=GuardConfig(min_dwell_s=0.0))
    server = MetricsServer(Completer(runtime, ServeDefaults(max_tokens=2), hook=thermal.hook), thermal)
    yield server, zone
    server.close()


def thermal_when(server, temp_c: float) -> dict:
    """/health's thermal once the poller has read ``temp_c`` (it reads every 0.5 s: waited for, not a fixed time)."""
    deadline = time.monotonic() + 30.0
    while True:
        status, text = server.request("GET", "/health")
        assert status == 200, text
        thermal = json.loads(text)["thermal"]
        if thermal["temperature_c"] == temp_c or time.monotonic() > deadline:
            return thermal
        time.sleep(0.1)


def test_health_takes_the_guard_s_own_level_while_a_request_generates(board):
    """While a request's steps run the guard's level is live (``level_source`` "request"); between requests the
    reading's ("reading")."""
    server, zone = board
    (zone / "temp").write_text("72000\n")
    thermal_when(server, 72.0)
    status, _ = server.request("POST", "/v1/completions", {"prompt": "hello", "max_tokens": 2})
    assert status == 200
    (zone / "temp").write_text("95000\n")
    thermal_when(server, 95.0)
    hook = server.thermal.hook
    assert thermal_health(hook, generating=True) == {"level": "hot", "temperature_c": 95.0, "paused": False,
                                                      "level_source": "request"}
    assert thermal_health(hook, generating=False) == {"level": "critical", "temperature_c": 95.0, "paused": True,
                                                       "level_source": "reading"}


def test_an_idle_server_reports_the_level_its_temperature_gives_not_the_last_request_s(board):
    """The level and pause were the guard's as the last request left them, beside the temperature read since: a
    board that heated past the hard limit while idle was shown "normal", not paused."""
    server, zone = board
    status, _ = server.request("POST", "/v1/completions", {"prompt": "hello", "max_tokens": 2})
    assert status == 200
    assert thermal_when(server, 50.0)["level"] == "normal"
    (zone / "temp").write_text("95000\n")
    thermal = thermal_when(server, 95.0)
    assert (thermal["level"], thermal["paused"]) == ("critical", True)  # was "normal", not paused
    assert thermal["level_source"] == "reading"
    metrics = server.metrics()
    assert metrics['edgesdk_thermal_level{level="critical"}'] == 1
    assert metrics['edgesdk_thermal_level{level="normal"}'] == 0
    assert metrics["edgesdk_thermal_paused"] == 1
    (zone / "temp").write_text("50000\n")
    assert thermal_when(server, 50.0)["level"] == "normal"
    assert server.metrics()["edgesdk_thermal_paused"] == 0


def test_serve_says_when_the_guard_pauses_and_resumes_and_the_answer_carries_the_wait(board):
    """A request on a board past the hard limit waited with nothing said on stderr and nothing in the answer to
    tell the wait from a slow model: a line goes out when the pause starts and another when it ends, none while the
    level stays, and the answer's ``thermal_wait_ms`` holds the pause."""
    server, zone = board
    hook = server.thermal.hook
    log = io.StringIO()
    hook.status = ThermalChanges(hook, file=log)
    completer = server.completer
    first = completer.complete(CompletionRequest(chat=False, prompt="hello", max_tokens=2))
    assert first.thermal_wait_ms == 0.0  # guarded, at 50 °C: no wait
    assert log.getvalue() == ""  # normal, as the guard starts: nothing to say
    (zone / "temp").write_text("80000\n")
    thermal_when(server, 80.0)
    answers: list = []
    worker = threading.Thread(target=lambda: answers.append(
        completer.complete(CompletionRequest(chat=False, prompt="hello again", max_tokens=2))))
    worker.start()
    deadline = time.monotonic() + 60.0
    while "paused" not in log.getvalue() and time.monotonic() < deadline:  # the pause's first wait record
        time.sleep(0.05)
    (zone / "temp").write_text("50000\n")
    worker.join(120.0)
    assert not worker.is_alive()
    lines = log.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("edgesdk thermal: 80.0 °C  critical  paused")
    assert lines[1].startswith("edgesdk thermal: 50.0 °C  normal")
    # the pause slept at least one 0.5 s chunk before its first record (the line the test waited for)
    assert answers[0].thermal_wait_ms >= 500.0
    # a third request at the same level says nothing
    completer.complete(CompletionRequest(chat=False, prompt="hello", max_tokens=2))
    assert len(log.getvalue().splitlines()) == 2


def test_an_unguarded_answer_has_no_thermal_wait(runtime):
    """Without a guard the field is left out of timings (None), as llama-server sends none."""
    completer = Completer(runtime, ServeDefaults(max_tokens=2))
    assert completer.complete(CompletionRequest(chat=False, prompt="hello", max_tokens=2)).thermal_wait_ms is None


def test_edgesdk_serve_prints_a_line_when_the_guard_starts_pacing(tiny_bundle, tmp_path):
    """The command itself: ``serve --watch-thermal`` opened its thermal session with no status, so a request the guard
    paced (a board at 72 °C, rpi5's hot level) left nothing on stderr to say why it was slow."""
    make_zone(tmp_path / "thermal", 0, "cpu-thermal", "72000\n")
    (tmp_path / "cpufreq").mkdir()
    env = {name: value for name, value in os.environ.items() if not name.startswith("LLAMA_")}
    env.update(EDGESDK_THERMAL_ROOT=str(tmp_path / "thermal"), EDGESDK_CPUFREQ_ROOT=str(tmp_path / "cpufreq"))
    process = subprocess.Popen([sys.executable, "-m", "edgesdk.cli", "serve", str(tiny_bundle.path), "--port", "0",
                                "--quiet", "--watch-thermal", "--thermal-target", "rpi5"],
                               stderr=subprocess.PIPE, text=True, env=env)
    lines: queue.Queue = queue.Queue()
    said: list[str] = []

    def read() -> None:
        for line in process.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        url = None
        while url is None:
            line = lines.get(timeout=120)
            assert line is not None, f"edgesdk serve ended without its start line: {''.join(said)}"
            said.append(line)
            found = re.search(r" on (http://\S+)/v1 ", line)
            url = found[1] if found else None
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        request = urllib.request.Request(f"{url}/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 2}).encode(),
                                         {"Content-Type": "application/json"})
        with opener.open(request, timeout=120) as answer:
            assert answer.status == 200
    finally:
        process.terminate()
        process.wait(timeout=120)
    while (line := lines.get(timeout=120)) is not None:  # the rest of stderr, to its end
        said.append(line)
    told = [line for line in said if line.startswith("edgesdk thermal: 72.0 °C  hot")]
    assert len(told) == 1, "".join(said)
