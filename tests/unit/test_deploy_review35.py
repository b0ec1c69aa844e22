"""``deploy --service`` undoing itself: the board's ``service.before.json``, a stale one, the unit's enablement.

The board side runs for real through a local transport; ``tests/_utils/fake_systemd.py`` stands in for
systemctl only, and the unit's ExecStart it starts is a real process answering (or not) over HTTP.
"""

from __future__ import annotations

import contextlib
import http.server
import socket
import sys
import threading

import pytest

from edgesdk.deploy.remote import Board, BoardRefusal
from edgesdk.deploy.transport import LocalTransport
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


def good_argv(tmp_path, port: int) -> list[str]:
    """A server whose /health answers 200."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "health").write_text("ok")
    return [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(site)]


class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def answering(port: int):
    """Another server (not the unit's) answering 200 on ``port``."""
    server = http.server.HTTPServer(("127.0.0.1", port), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


# A server that reads the release behind current once, at its start, and answers with it.
LOADS_AT_START = """import http.server, sys
which = open(sys.argv[1] + "/which", "rb").read()
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(which)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[2])), Handler).serve_forever()
"""

BAD_ARGV = [sys.executable, "-c", "raise SystemExit(3)"]


def install(board: Board, argv: list[str], port: int, token: str) -> dict:
    return board.call("service", {"action": "install", "argv": argv, "health_url": f"http://127.0.0.1:{port}/health",
                                  "timeout_s": 20, "fix": "fix", "token": token})


def revert(board: Board, token: str) -> dict:
    return board.call("service", {"action": "revert", "argv": [], "timeout_s": 20, "fix": "fix", "token": token})


def test_a_stale_before_file_is_not_put_back_by_a_later_deploy(board, tmp_path):
    """A deploy killed after its install left service.before.json behind. A later deploy whose install was
    refused before it changed anything ran the revert, which put back that stale state: here it stopped,
    disabled and removed the unit the killed deploy had written. Only what this install saved is put back."""
    board, units, state = board
    port = free_port()
    with pytest.raises(BoardRefusal, match="did not come up"):
        install(board, BAD_ARGV, port, "killed")  # the deploy is killed here: no revert follows
    unit = (units / "edgesdk-serve.service").read_text()
    with answering(port):  # something else answers on the port: refused before any change
        with pytest.raises(BoardRefusal, match="already answers"):
            install(board, good_argv(tmp_path, port), port, "later")
    assert revert(board, "later") == {"ok": True, "reverted": False}
    assert (units / "edgesdk-serve.service").read_text() == unit


def systemctl(*args: str) -> str:
    import subprocess

    return subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=60).stdout.strip()


def test_a_unit_stopped_and_disabled_before_is_put_back_disabled(board, tmp_path):
    """The install enables the unit; the revert wrote its text back and left it stopped but still enabled, so a
    unit its owner had stopped and disabled started at the next boot. It is disabled again, as it was."""
    board, units, state = board
    port = free_port()
    assert install(board, good_argv(tmp_path, port), port, "first")["restarted"]
    systemctl("stop", "edgesdk-serve")  # its owner stops and disables it by hand
    systemctl("disable", "edgesdk-serve")
    assert systemctl("is-enabled", "edgesdk-serve") == "disabled"
    unit = (units / "edgesdk-serve.service").read_text()
    with pytest.raises(BoardRefusal, match="did not come up"):
        install(board, BAD_ARGV, port, "second")
    assert revert(board, "second")["outcome"] == "stopped"
    assert (units / "edgesdk-serve.service").read_text() == unit
    assert systemctl("is-active", "edgesdk-serve") == "failed"
    assert systemctl("is-enabled", "edgesdk-serve") == "disabled"


def test_an_install_whose_reply_is_lost_leaves_the_server_on_current(board, tmp_path):
    """The install ran to the end on the board (its unit restarted on the new release) but its reply was lost.
    The undo switched current back and, finding nothing to put back, said the deploy was undone while the server
    kept serving the release switched away from. The unit is restarted, so it serves current again."""
    import subprocess
    import urllib.request

    from edgesdk.deploy.orchestrate import undo_service
    from edgesdk.deploy.report import Reporter
    from edgesdk.deploy.transport import DeployError
    from tests.unit.test_deploy_helper import commit_by_hand, make_bundle

    board, units, state = board
    port, root = free_port(), board.root
    old, new = (make_bundle(tmp_path / name, {"health": b"ok", "which": name.encode()}) for name in ("old", "new"))
    for bundle in (old, new):
        commit_by_hand(board, bundle)
    board.call("switch", {"bundle_id": old.bundle_id})
    (tmp_path / "server.py").write_text(LOADS_AT_START)
    argv = [sys.executable, str(tmp_path / "server.py"), f"{root}/current", str(port)]  # as edgesdk serve loads
    assert install(board, argv, port, "first")["restarted"]
    board.call("switch", {"bundle_id": new.bundle_id})  # the deploy's switch

    class LosesTheInstallReply(LocalTransport):
        def run(self, argv, input=None, timeout=None, what=None):
            proc = super().run(argv, input, timeout, what)
            if '"action": "install"' in argv[-1]:  # done on the board; its answer never comes back
                raise DeployError("Connection to board closed by remote host.", "run the same deploy again")
            return proc

    lossy = Board(LosesTheInstallReply(root), sys.executable, root)
    with pytest.raises(DeployError) as lost:
        install(lossy, argv, port, "second")
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/which", timeout=30).read() == b"new"
    lines: list[str] = []
    error = undo_service(lossy, Reporter(9, write=lines.append), lost.value, "second", old.bundle_id, new.bundle_id,
                         None, None)
    assert f"current switched back to releases/{old.bundle_id}" in error.problem
    assert subprocess.run(["readlink", f"{root}/current"], capture_output=True, text=True).stdout.strip().endswith(
        old.bundle_id)
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/which", timeout=30).read() == b"old"
    assert "restarted: it serves current again" in error.problem
