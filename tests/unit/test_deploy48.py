"""``edgesdk deploy``, review 48: the promise that a failed deploy leaves the board as it was.

The board side runs for real through a local transport (or a real sshd); ``tests/_utils/fake_systemd.py``
stands in for systemctl only, and what its units start is a real process answering over HTTP.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import sys
import threading

import pytest

from edgesdk.deploy import service
from edgesdk.deploy.remote import Board, BoardRefusal
from edgesdk.deploy.transport import DeployError, LocalTransport
from tests._utils import fake_systemd


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def board(tmp_path, monkeypatch):
    """(board, unit dir, systemd state): a deploy root in tmp whose helper sees the stand-in systemctl."""
    state = tmp_path / "systemd-state"
    for key, value in fake_systemd.install(tmp_path / "bin", state).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("EDGESDK_UNIT_DIR", str(tmp_path / "units"))
    root = tmp_path / "board"
    yield Board(LocalTransport(str(root)), sys.executable, str(root)), tmp_path / "units", state
    fake_systemd.stop_all(state)


def status_handler(code: int):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b"404 page not found" if code == 404 else b"loading")

        def log_message(self, *args):
            pass

    return Handler


@contextlib.contextmanager
def serving(port: int, code: int):
    """Another server (not the unit's) on ``port`` whose every answer, /health too, has status ``code``."""
    server = http.server.HTTPServer(("127.0.0.1", port), status_handler(code))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def listening_only(port: int):
    """A program that holds ``port`` and speaks no HTTP."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen(8)
        yield


@pytest.mark.parametrize("holder", ["ollama 404", "llama-server loading 503", "not http"])
def test_the_service_check_refuses_a_port_another_server_holds_whatever_it_answers(board, holder):
    """The check before anything changes refused only a server whose /health said 200. Ollama (404 on
    /health, and users put the unit on its port 11434 for its clients), llama-server while it loads (503) or a
    program that speaks no HTTP passed it; the unit then could not listen, after current was switched, and
    the deploy had to switch back. A port anything accepts connections on is refused up front now."""
    board, units, _state = board
    port = free_port()
    holding = {"ollama 404": lambda: serving(port, 404), "llama-server loading 503": lambda: serving(port, 503),
               "not http": lambda: listening_only(port)}[holder]
    with holding():
        with pytest.raises(DeployError, match="already answers") as refused:
            service.check_service(board, service.ServiceOptions(port=port), [sys.executable, "serve"])
        assert f"accepts connections on port {port}" in refused.value.problem
        assert "--service-port" in refused.value.fix
        with pytest.raises(BoardRefusal, match="already answers"):  # the install's own check, under the lock
            board.call("service", {"action": "install", "argv": [sys.executable, "serve"], "token": "t",
                                   "health_url": f"http://127.0.0.1:{port}/health", "timeout_s": 5, "fix": "fix"})
    assert not (units / "edgesdk-serve.service").exists()  # nothing was written


def test_the_service_check_passes_a_free_port(board):
    board, _units, _state = board
    port = free_port()
    assert service.check_service(board, service.ServiceOptions(port=port), [sys.executable, "serve"]).startswith(
        "systemd answers")


def effective(transport, *extra: str) -> dict[str, str]:
    """What ssh makes of the command line deploy runs (``ssh -G``: the options after every file and -o)."""
    import subprocess

    argv = [*transport.base, *transport.ssh_args(), *extra, "-G", "--", transport.spec.destination]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def test_the_timeouts_of_the_users_ssh_config_win_over_deploys_defaults(ssh_server, tmp_path):
    """ssh keeps the first value it reads, and a -o comes before every config file: deploy's own
    ConnectTimeout=15 and ServerAliveInterval=15 / ServerAliveCountMax=4 overrode what the user's ssh config
    gives the board (a slow link's ConnectTimeout 60, say), which 'ssh board' itself honours. They are
    defaults now, used where the config sets none; the config's Port, User and IdentityFile count as before."""
    from edgesdk.deploy.transport import HostSpec, SshOptions, SshTransport

    config = tmp_path / "ssh_config"
    config.write_text(f"Host edgeboard\n  HostName 127.0.0.1\n  Port {ssh_server.port}\n  User {ssh_server.user}\n"
                      f"  IdentityFile {ssh_server.user_key}\n  IdentitiesOnly yes\n"
                      f"  UserKnownHostsFile {ssh_server.known_hosts}\n  GlobalKnownHostsFile /dev/null\n"
                      "  ConnectTimeout 47\n  ServerAliveInterval 7\n  ServerAliveCountMax 9\n"
                      "Host plainboard\n  HostName 127.0.0.1\n")
    configured = SshTransport(HostSpec.parse("edgeboard"), SshOptions(ssh_config=str(config)))
    plain = SshTransport(HostSpec.parse("plainboard"), SshOptions(ssh_config=str(config)))
    given = SshTransport(HostSpec.parse("plainboard"), SshOptions(ssh_config=str(config),
                                                                  options=("ConnectTimeout=5",)))
    try:
        seen = effective(configured)
        assert (seen["connecttimeout"], seen["serveraliveinterval"], seen["serveralivecountmax"]) == ("47", "7", "9")
        seen = effective(plain)  # nothing configured: deploy's own
        assert (seen["connecttimeout"], seen["serveraliveinterval"], seen["serveralivecountmax"]) == ("15", "15", "4")
        assert effective(given)["connecttimeout"] == "5"  # --ssh-option still first
        root = tmp_path / "board"
        board = Board(configured, sys.executable, str(root))
        assert board.call("probe", {})["root"] == str(root)  # port, user and key from the config
    finally:
        for transport in (configured, plain, given):
            transport.close()


@pytest.mark.parametrize("host", ["localhost:8080", "http://127.0.0.1", "0.0.0.0:80", "[localhost]", "llama.sock"])
def test_a_service_host_that_is_not_an_address_is_refused_before_anything_changes(tmp_path, host):
    """--service-host took any text without blanks: 'localhost:8080' or a URL went into the unit, and only its
    server refused it ('cannot listen on [localhost:8080]:8080'), after the bundle was sent, smoke-tested and
    current switched, which the deploy then had to switch back. It is refused with the arguments now."""
    from click.testing import CliRunner

    from edgesdk.cli import main

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    root = tmp_path / "board"
    result = CliRunner().invoke(main, ["deploy", str(bundle), "--to", str(root), "--service", "--service-host", host],
                                prog_name="edgesdk")
    assert result.exit_code == 2, result.output
    assert "--service-host must be an address such as 127.0.0.1" in result.output
    assert repr(host) in result.output
    assert "without a scheme or a port (the port goes to --service-port)" in result.output
    assert not root.exists()


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "::", "[::]", "fe80::1%eth0", "localhost", "orin-nx.local"])
def test_the_addresses_serve_binds_to_are_service_hosts(host):
    assert service.ServiceOptions(host=host, port=8080).host == host


@pytest.mark.parametrize("comes_up", [True, False])
def test_a_redeploy_that_switches_the_runtime_alone_restarts_the_unit_onto_it(ssh_server, tiny_bundle, tmp_path,
                                                                               comes_up):
    """Deploying the release that is already current with another edgesdk (a new runtime key) switches
    runtime/current alone. The unit an earlier deploy --service installed was restarted only where current
    moved, so it went on serving with the old edgesdk while the deploy said runtime/current had moved. It is
    restarted onto the new runtime now, as after a switch of current; where its server does not come up
    there, runtime/current goes back and the unit serves with the edgesdk it ran before."""
    import os

    from tests._utils.deploy import edgesdk

    board = ServiceBoard(tmp_path, ssh_server, tiny_bundle)
    root, log, port, state, runtime, deploy = board.root, board.log, board.port, board.state, board.runtime, board.deploy
    try:
        runtime(None)
        first = edgesdk(*deploy, "--service", "--service-port", port)
        assert first.returncode == 0, first.stderr
        runtime("older")  # as if that deploy had run another edgesdk, the older runtime
        os.unlink(root / "runtime" / "current")
        os.symlink("older", root / "runtime" / "current")
        restarts = len([c for c in fake_systemd.calls(state) if c[-2:] == ["restart", "edgesdk-serve"]])

        key = runtime(None)
        if not comes_up:
            (root / "runtime" / key / "broken").touch()
        again = edgesdk(*deploy)
        assert f"current already is releases/{tiny_bundle.bundle_id}" in again.stderr
        assert f"runtime/current -> {key} (was older)" in again.stderr
        served = [line.split()[0] for line in log.read_text().splitlines() if line.endswith(" serve")]
        restarted = len([c for c in fake_systemd.calls(state) if c[-2:] == ["restart", "edgesdk-serve"]]) - restarts
        if comes_up:
            assert again.returncode == 0, again.stderr
            assert "(from an earlier --service deploy) restarted; it serves current" in again.stderr
            assert restarted == 1
            assert served[-1] == key  # the unit's server runs the runtime deploy switched to
        else:
            assert again.returncode == 8, again.stderr
            assert f"{key} is broken" in again.stderr  # the unit's journal
            assert "the deploy was undone: runtime/current switched back to older;" in again.stderr
            assert restarted == 2
            assert served[-2:] == [key, "older"]
            assert os.readlink(root / "runtime" / "current") == "older"
        assert os.readlink(root / "current") == f"releases/{tiny_bundle.bundle_id}"
        with urllib_open(f"http://127.0.0.1:{port}/health") as reply:
            assert reply.status == 200
    finally:
        fake_systemd.stop_all(state)


class ServiceBoard:
    """A board root for ``deploy --service`` against the real sshd: runtimes whose ``edgesdk`` logs each start to
    ``log`` (and fails ``serve`` where a ``broken`` file sits in the venv), the stand-in systemctl
    (tests/_utils/fake_systemd.py) on the board Python's PATH, and the deploy command line (``deploy``, without
    ``--service``)."""

    def __init__(self, tmp_path, ssh_server, tiny_bundle):
        self.root, self.log, self.port = tmp_path / "board", tmp_path / "started.log", free_port()
        self.state, units = tmp_path / "systemd-state", tmp_path / "units"
        self.env = {**fake_systemd.install(tmp_path / "bin", self.state), "EDGESDK_UNIT_DIR": str(units),
                    "EDGESDK_HUGE_PAGES": "0"}
        python = tmp_path / "board-python"  # the board's Python, with the stand-in systemctl on its PATH
        python.write_text("#!/bin/sh\n" + "".join(f"export {k}='{v}'\n" for k, v in self.env.items())
                          + f'exec "{sys.executable}" "$@"\n')
        python.chmod(0o755)
        self.deploy = ["deploy", tiny_bundle.path, "--host", ssh_server.destination, *ssh_server.client_args(),
                       "--remote-root", self.root, "--remote-python", python]

    def runtime(self, name: str | None) -> str:
        """A runtime already on the board, whose edgesdk logs that it started; ``name`` None: the one this
        checkout's deploy installs (its key hashes the sources, so it is taken right before each deploy)."""
        import time

        from edgesdk.deploy import install

        name = name or install.runtime_source(tuple(sys.version_info[:3]), False).key
        venv = self.root / "runtime" / name
        if not venv.exists():
            (venv / "bin").mkdir(parents=True)
            (venv / "edgesdk-runtime.json").write_text(json.dumps({"key": name, "version": "0",
                                                                   "installed": time.time(), "switched": time.time()}))
            script = venv / "bin" / "edgesdk"
            script.write_text(f'#!/bin/sh\necho "{name} $1" >> "{self.log}"\n'
                              f'if [ "$1" = serve ] && [ -e "{venv}/broken" ]; then echo "{name} is broken" >&2; exit 3; fi\n'
                              f'exec "{sys.executable}" -m edgesdk.cli "$@"\n')
            script.chmod(0o755)
        return name


def urllib_open(url: str):
    import urllib.request

    return urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=10)
