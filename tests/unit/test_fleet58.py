"""Deploy's systemd unit on the board: the review of fleet, releases, service and the board's service helper."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from edgesdk.deploy.board_service import render_unit
from tests._utils import fake_systemd

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def ssh_banner_port():
    """A port held by a program that is no HTTP server: it greets every connection as an ssh daemon does."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def greet():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_8.9p1 Ubuntu-3ubuntu0.10\r\n")
                try:
                    conn.recv(4096)
                except OSError:
                    pass

    threading.Thread(target=greet, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def board_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter, as the board's helper runs it."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, **(env or {})})


def test_a_port_held_by_a_program_that_is_no_http_server_is_not_healthy(ssh_banner_port):
    """A program that answers with no HTTP status line (an ssh daemon, a raw TCP service) on the service's port: http.client
    raises BadStatusLine through urllib, neither a URLError nor an OSError, and healthy() let it out, so the board's
    helper ended in a traceback while it waited for /health, which the host reads as a lost reply."""
    result = board_python("from edgesdk.deploy.board_service import healthy; "
                          f"print(healthy('http://127.0.0.1:{ssh_banner_port}/health'))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


class Health200(http.server.BaseHTTPRequestHandler):
    """Another model server on the port (llama-server, say), which answers 200 on /health too."""

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


def restart_unit_on_board(tmp_path: Path, port: int) -> dict:
    """op_service "restart" (a rollback's) of a failed, enabled unit whose server exits at once (it cannot bind its
    port), with systemd stood in for; its reply, or {"refused": problem, "fix": fix}."""
    root, units, state = tmp_path / "root", tmp_path / "units", tmp_path / "state"
    (root / "releases" / "r1").mkdir(parents=True)
    (root / "current").symlink_to("releases/r1")
    argv = [sys.executable, "-c", "import sys; print('cannot bind: port in use'); sys.exit(3)", str(root / "current"),
            "--host", "127.0.0.1", "--port", str(port)]
    units.mkdir()
    unit = units / "edgesdk-serve.service"
    unit.write_text(render_unit(argv, "user"))
    (root / "service.json").write_text(json.dumps({"scope": "user", "unit": str(unit), "uid": os.geteuid(),
                                                   "health_url": f"http://127.0.0.1:{port}/health"}))
    env = {**fake_systemd.install(tmp_path / "bin", state), "EDGESDK_UNIT_DIR": str(units)}
    (state / "edgesdk-serve.enabled").touch()
    code = ("import json\nfrom edgesdk.deploy.board_common import Refused\n"
            "from edgesdk.deploy.board_service import op_service\n"
            f"params = {{'root': {str(root)!r}, 'action': 'restart', 'argv': [], 'timeout_s': 30, "
            "'during': 'rollback', 'fix': 'FIX'}\n"
            "try:\n    print(json.dumps(op_service(params)))\n"
            "except Refused as exc:\n    print(json.dumps({'refused': exc.problem, 'fix': exc.fix}))\n")
    try:
        result = board_python(code, env)
    finally:
        fake_systemd.stop_all(state)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_restart_where_another_server_took_the_port_is_refused_not_reported_restarted(tmp_path):
    """A rollback restarts the unit and waits for its /health. Where another server took the port since the
    install (llama-server defaults to 8080 too, and says 200 on /health), its 200 was taken for the unit's: the
    rollback reported the unit "restarted; it serves the release rolled back to" while the unit's server could
    not listen there. The restart now refuses as the install does, naming the port."""
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health200)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    port = other.server_address[1]
    try:
        reply = restart_unit_on_board(tmp_path, port)
    finally:
        other.shutdown()
        other.server_close()
    assert "refused" in reply, reply
    assert f"already answers on http://127.0.0.1:{port}/health" in reply["refused"]
    assert "--service-port" in reply["fix"]
    assert "systemctl --user restart edgesdk-serve" in reply["fix"]


def test_a_server_that_systemd_queued_to_start_again_is_seen_as_exited(tmp_path):
    """From systemd 254 on, a service whose server exited waits out RestartSec as SubState "auto-restart", then as
    "auto-restart-queued" until its start job runs (ActiveState "activating" both times). Only "auto-restart" was
    taken for an exited server: in "auto-restart-queued" the deploy kept polling until its 180 s ran out, and then
    blamed the time ("no answer within 180 s") instead of the server that exited. The systemctl here answers as
    systemd does in that state, and logs each call."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(
        "#!/bin/sh\n"
        f"echo \"$*\" >> '{log}'\n"
        'for a in "$@"; do case "$a" in\n'
        "  show) printf 'SubState=auto-restart-queued\\n'; exit 0;;\n"
        "  is-active) echo activating; exit 3;;\n"
        "esac; done\nexit 1\n")
    (bin_dir / "systemctl").chmod(0o755)
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = board_python("from edgesdk.deploy.board_service import wait_until_healthy; "
                          f"print(wait_until_healthy('system', 'http://127.0.0.1:{port}/health', 10))",
                          {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
    shows = [line for line in log.read_text().splitlines() if line.startswith("show")]
    assert shows == ["show edgesdk-serve -p SubState"]  # seen at the first look, not polled until the time ran out


@pytest.mark.parametrize(("host", "url"), [("0", "http://127.0.0.1:8080/health"),
                                           ("0.0", "http://127.0.0.1:8080/health"),
                                           ("::0", "http://[::1]:8080/health"),
                                           ("[0:0:0:0:0:0:0:0]", "http://[::1]:8080/health"),
                                           ("0.0.0.0", "http://127.0.0.1:8080/health"),
                                           ("[::]", "http://[::1]:8080/health"),
                                           ("127.1", "http://127.1:8080/health")])
def test_the_health_url_of_a_wildcard_bind_is_the_loopback_however_the_wildcard_is_written(host, url):
    """--service-host takes 0 (inet_aton reads it as 0.0.0.0, as serve's bind does) and ::0 as the wildcards they
    are, but the health URL, which the board asks and the deploy reports as where it serves, was the loopback for
    the spellings 0.0.0.0, :: and [::] only: "serving on http://[::0]:8080/v1", an address no client can use."""
    from edgesdk.deploy.service import ServiceOptions

    assert ServiceOptions(host=host).health_url == url


@pytest.mark.parametrize(("state", "refused"), [("deactivating", False), ("reloading", False), ("active", False),
                                                ("inactive", True)])
def test_a_unit_stopping_or_reloading_is_the_server_on_its_port_not_a_foreign_one(tmp_path, state, refused):
    """A restart that arrives while the unit stops (ExecStop runs, its server has not exited yet) or reloads finds
    the unit's own server on its port. Only an ActiveState of "active" counted as the unit answering, so the
    restart was refused as though another program had taken the port."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do case "$a" in\n'
        f"  is-active) echo {state}; exit 3;;\n"
        "esac; done\nexit 1\n")
    (bin_dir / "systemctl").chmod(0o755)
    own = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health200)
    threading.Thread(target=own.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{own.server_address[1]}/health"
    record = {"scope": "user", "unit": str(tmp_path / "edgesdk-serve.service"), "health_url": url}
    code = ("import json\nfrom edgesdk.deploy.board_common import Refused\n"
            "from edgesdk.deploy.board_service import refuse_a_foreign_server\n"
            f"try:\n    refuse_a_foreign_server('user', {url!r}, {record!r}, 'FIX')\n    print('{{}}')\n"
            "except Refused as exc:\n    print(json.dumps({'refused': exc.problem}))\n")
    try:
        result = board_python(code, {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    finally:
        own.shutdown()
        own.server_close()
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout.strip().splitlines()[-1])
    assert ("refused" in reply) == refused, reply
