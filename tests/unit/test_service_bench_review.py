"""``deploy --service`` on the board: the /health wait, lingering, a port another server holds, rollbacks
and concurrent deploys.

The board helper runs as the board runs it (a fresh Python), the server it waits for is the real
``edgesdk serve`` of the tiny bundle, and ``tests/_utils/fake_systemd.py`` stands in for systemctl,
journalctl and loginctl (systemd is not init here).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests._utils import fake_systemd
from tests._utils.deploy import current_id, edgesdk

REPO = Path(__file__).parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def answers(url: str) -> bool:
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def server(tiny_bundle):
    """A real ``edgesdk serve`` of the tiny bundle; yields its /health URL."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "edgesdk.cli", "serve", str(tiny_bundle.path), "--port",
                                str(port), "--threads", "1", "--quiet"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env={**os.environ, "EDGESDK_HUGE_PAGES": "0"})
    url = f"http://127.0.0.1:{port}/health"
    try:
        deadline = time.monotonic() + 120
        while not answers(url):
            assert process.poll() is None, "edgesdk serve exited before its /health answered"
            assert time.monotonic() < deadline, "edgesdk serve's /health did not answer within 120 s"
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=60)


def board_python(code: str, env: dict[str, str] | None = None) -> str:
    """``code`` in a fresh interpreter, as the board's helper runs; returns its stdout."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                            env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_health_is_asked_directly_not_through_the_boards_http_proxy(server):
    """A board behind a proxy has http_proxy set for apt and pip (/etc/environment); its own server's
    /health must still be asked directly, or a deploy waits out its 180 s and reports a healthy
    service as down."""
    code = f"from edgesdk.deploy.board_service import healthy; print(healthy({server!r}))"
    assert board_python(code) == "True"
    assert board_python(code, {"http_proxy": "http://127.0.0.1:9", "no_proxy": ""}) == "True"


def test_a_user_unit_without_lingering_is_said_to_stop_with_the_last_session(tmp_path):
    """logind stops a user's manager, and its units, when the user's last session ends; only lingering
    keeps it (loginctl(1)). Where enable-linger is denied (the fake loginctl denies it, as polkit does
    for a remote session), the service does not 'run now': it stops once the deploy's ssh session ends."""
    env = fake_systemd.install(tmp_path / "bin", tmp_path / "state")
    note = board_python("from edgesdk.deploy.board_service import enable_linger; print(enable_linger())", env)
    assert note.startswith("warning: lingering could not be turned on (Could not enable linger: Access denied)")
    assert "stops when" in note
    assert "this deploy's ssh session" in note
    assert "runs now" not in note
    assert "sudo loginctl enable-linger" in note
    assert ["loginctl", "enable-linger"] == fake_systemd.calls(tmp_path / "state")[-1][:2]


def test_a_port_another_server_answers_on_is_refused_before_anything_changes(tiny_bundle, tmp_path, systemd, server):
    """Another server on the service's port (llama-server's default is 8080 too) answers /health with 200
    while the unit's own server cannot listen: the deploy took that answer for its service and
    reported it up. It is refused at the checks, naming the address."""
    env, state = systemd
    root, port = tmp_path / "board", server.split(":")[-1].split("/")[0]
    result = edgesdk("deploy", tiny_bundle.path, "--to", root, "--service", "--service-port", port, env=env)
    assert result.returncode == 8, result.stderr
    assert f"already answers on {server}" in result.stderr
    assert "--service-port" in result.stderr
    assert current_id(root) is None
    assert not (root / "releases").exists()
    assert not (tmp_path / "units").exists()
    assert not [call for call in fake_systemd.calls(state) if call[:2] == ["systemctl", "restart"]]


def restarts(state: Path) -> int:
    return sum(1 for call in fake_systemd.calls(state) if call[:2] == ["systemctl", "restart"])


def two_releases_with_the_service(tiny_bundle, tmp_path, env, root: Path, port: int):
    """``root`` holds the tiny bundle (previous) and a variant of it (current), served by the unit."""
    from tests._utils.deploy import bundle_variant

    first = edgesdk("deploy", tiny_bundle.path, "--to", root, env=env)
    assert first.returncode == 0, first.stderr
    second = bundle_variant(tiny_bundle.path, tmp_path / "second", "second release")
    served = edgesdk("deploy", second.path, "--to", root, "--service", "--service-port", port, env=env)
    assert served.returncode == 0, served.stderr


def test_a_rollback_does_not_restart_a_unit_another_root_took_over(tiny_bundle, tmp_path, systemd):
    """One unit name per board: a deploy --service into a second root rewrites the unit to serve that
    root. A rollback in the first root restarted it anyway (the second root's server went down and
    up) and said it serves the release rolled back to, which it does not."""
    env, state = systemd
    port = free_port()
    first_root, other_root = tmp_path / "board", tmp_path / "other root"
    two_releases_with_the_service(tiny_bundle, tmp_path, env, first_root, port)
    other = edgesdk("deploy", tiny_bundle.path, "--to", other_root, "--service", "--service-port", port, env=env)
    assert other.returncode == 0, other.stderr
    assert restarts(state) == 2

    back = edgesdk("deploy", "--rollback", "--to", first_root, env=env)
    assert back.returncode == 0, back.stderr
    assert current_id(first_root) == tiny_bundle.bundle_id
    assert f"not restarted: it no longer serves {first_root}/current" in back.stderr
    assert "serves the release rolled back to" not in back.stderr
    assert restarts(state) == 2
    assert answers(f"http://127.0.0.1:{port}/health")  # the other root's server, untouched


def test_a_rollback_by_another_user_than_the_units_says_current_moved_and_how_to_restart(tiny_bundle, tmp_path,
                                                                                        systemd):
    """systemctl reaches only the caller's own user manager (and a system unit needs root): a unit that
    another user installed cannot be restarted by this one. That was tried ('Unit not found', shown as
    a unit that did not come up); now the refusal names the owner and the command, and says current
    was rolled back all the same."""
    env, state = systemd
    root = tmp_path / "board"
    two_releases_with_the_service(tiny_bundle, tmp_path, env, root, free_port())
    record = json.loads((root / "service.json").read_text())
    assert record["uid"] == os.geteuid()
    # As a deploy by another user (uid 4242, no name here) writes it: a user unit, this one's run as root.
    (root / "service.json").write_text(json.dumps({**record, "scope": "user", "uid": 4242}) + "\n")

    back = edgesdk("deploy", "--rollback", "--to", root, env=env)
    assert back.returncode == 8, back.stderr
    assert current_id(root) == tiny_bundle.bundle_id
    assert "current was rolled back, but the service is not serving it" in back.stderr
    assert "installed by uid 4242" in back.stderr
    assert "as uid 4242: systemctl --user restart edgesdk-serve" in back.stderr
    assert not [call for call in fake_systemd.calls(state)[-3:] if "--user" in call]  # root's manager not asked
    assert restarts(state) == 1


def test_the_unit_and_its_record_are_written_under_the_deploy_lock(tiny_bundle, tmp_path, systemd):
    """Two deploys into one root hold its lock in turn for every write (board_common.Lock); the unit,
    service.json and the restart did not take it, so two concurrent deploys --service wrote the same
    '.partial' files at once (a torn unit, or a rename that found its file gone)."""
    from edgesdk.deploy.board_common import Lock

    env, state = systemd
    root, port = tmp_path / "board", free_port()
    argv = [sys.executable, "-m", "edgesdk.cli", "serve", str(tiny_bundle.path), "--port", str(port), "--threads", "1"]
    params = {"root": str(root), "action": "install", "argv": argv, "health_url": f"http://127.0.0.1:{port}/health",
              "timeout_s": 120, "fix": "deploy again", "token": "0123456789abcdef"}
    code = ("import json, sys; from edgesdk.deploy.board_ops import main; "
            f"sys.exit(main(['service', json.dumps({params!r})]))")
    with Lock(str(root)):  # another deploy's step holds the root
        helper = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
        time.sleep(3)
        assert helper.poll() is None
        assert not (tmp_path / "units").exists()
        assert not (root / "service.json").exists()
    out, _ = helper.communicate(timeout=180)
    assert helper.returncode == 0, out
    assert json.loads(out)["restarted"] is True
    assert (tmp_path / "units" / "edgesdk-serve.service").is_file()
    assert [p.name for p in (tmp_path / "units").iterdir()] == ["edgesdk-serve.service"]  # no partial left
    assert restarts(state) == 1


def test_a_server_that_exits_is_seen_while_systemd_waits_to_restart_it(tmp_path):
    """Restart=on-failure: a server that exits (a release that cannot load, a port taken by something
    that is no HTTP server) waits out RestartSec as ActiveState "activating", SubState "auto-restart",
    and 'systemctl is-active' prints "activating" as for a unit still starting, so the deploy waited
    its whole 180 s before reporting 'no answer'. The systemctl here answers as systemd does then."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do case "$a" in\n'
        "  show) printf 'ActiveState=activating\\nSubState=auto-restart\\n'; exit 0;;\n"
        "  is-active) echo activating; exit 3;;\n"
        "esac; done\nexit 1\n")
    (bin_dir / "systemctl").chmod(0o755)
    code = (f"import time; from edgesdk.deploy.board_service import wait_until_healthy; start = time.monotonic(); "
            f"ok = wait_until_healthy('system', 'http://127.0.0.1:{free_port()}/health', 40); "
            "print(ok, round(time.monotonic() - start))")
    ok, seconds = board_python(code, {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}).split()
    assert ok == "False"
    assert int(seconds) < 10
