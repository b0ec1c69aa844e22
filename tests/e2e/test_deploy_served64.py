"""``edgesdk deploy --status`` names the release the service's server runs from the bundle id its /health names,
against a real OpenSSH server on 127.0.0.1 and the real ``edgesdk serve`` the unit starts.

The board's systemd is ``tests/_utils/fake_systemd.py``, set up as tests/e2e/test_deploy_status64.py does. Telling the
release by the server's start time against history.jsonl's switch times is only the fallback, for a server older than
bundle_id in /health: here that is the real ``edgesdk serve`` of the edgesdk before it, taken from this repository's
history. That test serves today's tiny bundle with the edgesdk package of that older commit: where that older serve
cannot load a bundle built by today's edgesdk, it skips with the old server's log rather than failing.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from edgesdk.deploy.board_ops import op_switch
from edgesdk.deploy.releases import REMOVE_KEYS
from tests._utils.deploy import bundle_variant, edgesdk
from tests._utils.sshd import free_port
from tests.e2e.test_deploy_status64 import deploy_args, gone, systemd_board  # noqa: F401 - the fixture, reused

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def service_deployed(server, tiny_bundle, tmp_path):
    """(board root, the release the unit serves, the release before it): a plain deploy, then one with --service."""
    root = tmp_path / "board"
    assert edgesdk(*deploy_args(server, root, tiny_bundle.path)).returncode == 0
    newer = bundle_variant(tiny_bundle.path, tmp_path / "newer", "newer")
    deployed = edgesdk(*deploy_args(server, root, newer.path, "--service", "--service-port", free_port()))
    assert deployed.returncode == 0, deployed.stderr
    return root, newer.bundle_id, tiny_bundle.bundle_id


def status(server, root) -> tuple[str, dict]:
    """(--status's text, --json's service)."""
    text = edgesdk(*deploy_args(server, root, "--status"))
    assert text.returncode == 0, text.stderr
    info = edgesdk(*deploy_args(server, root, "--status", "--json"))
    assert info.returncode == 0, info.stderr
    return text.stdout, json.loads(info.stdout)["service"]


def stop(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    while not gone(pid):
        time.sleep(0.05)


def edgesdk_before_bundle_id(base) -> str:
    """A folder holding the edgesdk package as it was just before /health named bundle_id (the parent of the commit
    that added it), for a server older than that; skips where this checkout has no such history."""
    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed: no older edgesdk to serve with")
    added = subprocess.run([git, "-C", REPO, "log", "-S", '"bundle_id": completer', "--format=%H", "--reverse", "--",
                            "edgesdk/serve/http_server.py"], capture_output=True, text=True)
    if added.returncode != 0 or not added.stdout.split():
        pytest.skip(f"this checkout's history does not hold the edgesdk before bundle_id in /health: {added.stderr}")
    shallow = subprocess.run([git, "-C", REPO, "rev-parse", "--is-shallow-repository"], capture_output=True, text=True)
    if shallow.stdout.strip() == "true":
        # a shallow clone's grafted oldest commit looks as if it added every file, and has no parent to take
        pytest.skip("this checkout is a shallow clone: it does not hold the edgesdk before bundle_id in /health")
    before = added.stdout.split()[0] + "^"
    if subprocess.run([git, "-C", REPO, "rev-parse", "--verify", "-q", before],
                      capture_output=True).returncode != 0:
        pytest.skip(f"this checkout's history does not hold {before}, the edgesdk before bundle_id in /health")
    folder = base / "edgesdk-before-bundle-id"
    folder.mkdir()
    archive = subprocess.run([git, "-C", REPO, "archive", before, "edgesdk"], capture_output=True)
    if archive.returncode != 0:
        pytest.skip(f"git archive {before} failed, so there is no edgesdk before bundle_id in /health to serve with: "
                    f"{archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return str(folder)


def test_release_is_the_bundle_health_names_not_one_worked_out_from_the_clock(systemd_board, tiny_bundle,  # noqa: F811
                                                                              tmp_path):
    server, _state, _bare = systemd_board
    root, newer, _older = service_deployed(server, tiny_bundle, tmp_path)
    # the switches were written while the board's clock ran a day ahead (a Pi with no RTC before NTP steps it back):
    # every switch reads as later than the server's start, and by the start time it served no release at all
    history = root / "history.jsonl"
    lines = [json.loads(line) for line in history.read_text().splitlines()]
    history.write_text("".join(json.dumps({**line, "time": line["time"] + 86400}) + "\n" for line in lines))
    text, info = status(server, root)
    assert f"release {newer} (current)\n" in text, text
    assert "told by its start time" not in text
    assert (info["health"]["bundle_id"], info["server"]["bundle_id"]) == (newer, newer)
    assert (info["server"]["release"], info["server"]["release_from"]) == (newer, "health")


def test_a_server_older_than_bundle_id_in_health_is_told_by_its_start_time(systemd_board, tiny_bundle,  # noqa: F811
                                                                           tmp_path):
    # the real edgesdk serve from before /health named bundle_id, run as the unit runs it: the release is worked out
    # from when it started, and the line says so
    server, state, _bare = systemd_board
    old_edgesdk = edgesdk_before_bundle_id(tmp_path)
    root, newer, older = service_deployed(server, tiny_bundle, tmp_path)
    unit = json.loads((root / "service.json").read_text())
    stop(int((state / "edgesdk-serve.pid").read_text()))
    exec_start = next(line for line in open(unit["unit"]).read().splitlines() if line.startswith("ExecStart="))
    argv = [arg.replace("%%", "%").replace("$$", "$") for arg in shlex.split(exec_start[len("ExecStart="):])]
    log = tmp_path / "old-serve.log"
    with open(log, "wb") as journal:
        old = subprocess.Popen(argv, stdout=journal, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               env={**os.environ, "PYTHONPATH": old_edgesdk}, start_new_session=True)
    (state / "edgesdk-serve.pid").write_text(str(old.pid))  # the unit's process now, stopped with the others
    body = None
    deadline = time.monotonic() + 120  # a bound on waiting for the old serve to load, not a measure of it
    while body is None:
        if time.monotonic() > deadline:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            pytest.fail(f"the edgesdk before bundle_id in /health neither answered /health nor exited:\n{tail}")
        if old.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            pytest.skip(f"the edgesdk before bundle_id in /health cannot serve this bundle (it exited "
                        f"{old.returncode}):\n{tail}")
        try:
            with urllib.request.urlopen(unit["health_url"], timeout=5) as reply:
                body = json.loads(reply.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.2)
    assert "bundle_id" not in body, f"{old_edgesdk} serves a /health with bundle_id: {body}"
    text, info = status(server, root)
    assert (f"release {newer} (current; told by its start time, as its /health names no bundle_id (an older "
            "edgesdk serve))\n") in text, text
    assert (info["server"]["release"], info["server"]["release_from"]) == (newer, "start time")
    assert info["server"]["bundle_id"] is None
    # current switched with no restart after it: still told, by the start time
    op_switch({"root": str(root), "bundle_id": older, "action": "rollback"})
    text, _info = status(server, root)
    assert f"release {newer} (told by its start time, as its /health names no bundle_id" in text, text
    assert f"it started before current switched to {older}, so it does not serve current; restart the unit" in text
    stop(old.pid)


def test_a_bundle_no_release_here_holds_is_said_plainly(systemd_board, tiny_bundle, tmp_path):  # noqa: F811
    server, _state, _bare = systemd_board
    root, newer, older = service_deployed(server, tiny_bundle, tmp_path)
    # current switched back with no restart after it (a switch whose restart failed), then the release the server
    # still runs removed: it is in history.jsonl, so by its start time the server ran a release here
    op_switch({"root": str(root), "bundle_id": older, "action": "rollback"})
    removed = edgesdk(*deploy_args(server, root, "--remove", newer, "--json"))
    assert removed.returncode == 0, removed.stderr
    assert list(json.loads(removed.stdout))[:len(REMOVE_KEYS)] == list(REMOVE_KEYS), removed.stdout  # as status's are STATUS_KEYS
    assert not (root / "releases" / newer).exists()
    text, info = status(server, root)
    assert (f"  serving  model tiny-llama-host on the {info['health']['backend']} backend, serves bundle {newer}, "
            f"which is not a release here; restart the unit to serve current ({older})\n") in text, text
    assert (info["server"]["bundle_id"], info["server"]["release"], info["server"]["release_from"]) == \
        (newer, None, "health")
