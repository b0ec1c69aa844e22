"""``edgesdk deploy --status`` on the unit a ``deploy --service`` installed, and ``deploy --remove ID``, against a real
OpenSSH server on 127.0.0.1.

The board's systemd is ``tests/_utils/fake_systemd.py`` (systemd is not init here), put first on the PATH of the
ssh sessions by the server's own ``SetEnv``; the unit it starts is the real ``edgesdk serve``, asked over real HTTP.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time

import pytest

from edgesdk.deploy.board_install import write_stamp
from edgesdk.deploy.board_ops import op_switch
from tests._utils import fake_systemd
from tests._utils.deploy import bundle_variant, current_id, edgesdk, tree_state
from tests._utils.sshd import SshServer, find_sshd, free_port

pytestmark = pytest.mark.slow


def server_with_env(root, env: dict) -> SshServer:
    """An sshd whose sessions get ``env`` (sshd_config SetEnv, OpenSSH >= 7.8): the board's PATH."""
    server = SshServer(root=root)
    server.prepare()
    config = root / "sshd_config"
    config.write_text(config.read_text() + "SetEnv " + " ".join(f"{k}={v}" for k, v in env.items()) + "\n")
    try:
        return server.start()
    except RuntimeError as exc:
        pytest.skip(f"this sshd takes no SetEnv: {exc}")


@pytest.fixture(scope="module")
def systemd_board(tmp_path_factory):
    """(an sshd whose sessions find fake_systemd's systemctl first on PATH, its state folder, an sshd whose sessions
    find no systemctl at all)."""
    if find_sshd() is None or shutil.which("ssh") is None:
        pytest.skip("OpenSSH sshd and ssh are not installed")
    base = tmp_path_factory.mktemp("systemd-board")
    state = base / "state"
    env = fake_systemd.install(base / "bin", state)
    no_systemd = base / "no-systemd"  # the board's tools, systemd's left out
    no_systemd.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        for name in os.listdir(folder) if os.path.isdir(folder) else []:
            tool = os.path.join(folder, name)
            if (name not in ("systemctl", "journalctl", "loginctl") and not (no_systemd / name).exists()
                    and os.path.isfile(tool) and os.access(tool, os.X_OK)):
                (no_systemd / name).symlink_to(tool)
    common = {"EDGESDK_UNIT_DIR": str(base / "units"), "EDGESDK_HUGE_PAGES": "0"}
    with_systemd = server_with_env(base / "sshd", {**common, "PATH": env["PATH"], "FAKE_SYSTEMD_STATE": str(state)})
    without = server_with_env(base / "sshd-bare", {**common, "PATH": str(no_systemd)})
    yield with_systemd, state, without
    fake_systemd.stop_all(state)
    with_systemd.stop()
    without.stop()


def deploy_args(server, root, *extra) -> list:
    return ["deploy", *extra, *server.client_args(), "--host", server.destination, "--remote-root", root,
            "--remote-python", sys.executable, "--runtime-venv-system-site-packages"]


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (gone, or a zombie not reaped yet: it holds no port)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_status_says_what_the_service_runs_and_that_it_was_killed(systemd_board, tiny_bundle, tmp_path):
    server, state, bare = systemd_board
    root, port = tmp_path / "board", free_port()
    plain = edgesdk(*deploy_args(server, root, tiny_bundle.path))
    assert plain.returncode == 0, plain.stderr
    none = edgesdk(*deploy_args(server, root, "--status"))
    assert none.returncode == 0, none.stderr
    assert "service    none installed by deploy --service" in none.stdout

    newer = bundle_variant(tiny_bundle.path, tmp_path / "newer", "newer")
    deployed = edgesdk(*deploy_args(server, root, newer.path, "--service", "--service-port", port))
    assert deployed.returncode == 0, deployed.stderr
    scope = json.loads((root / "service.json").read_text())["scope"]
    status = edgesdk(*deploy_args(server, root, "--status"))
    assert status.returncode == 0, status.stderr
    assert (f"service    edgesdk-serve ({scope} unit, enabled, active), /health http://127.0.0.1:{port}/health"
            in status.stdout), status.stdout
    assert "  serving  model tiny-llama-host on the " in status.stdout
    assert f"release {newer.bundle_id} (current)" in status.stdout
    info = json.loads(edgesdk(*deploy_args(server, root, "--status", "--json")).stdout)["service"]
    assert (info["active"], info["enabled"], info["unit_exists"], info["serves_root"]) == \
        ("active", "enabled", True, True)
    assert info["health"]["ok"]
    assert info["health"]["model"] == "tiny-llama-host"
    assert info["health"]["backend"]
    assert info["server"]["release"] == newer.bundle_id

    # current switched with no restart after it (a switch whose restart failed): the server still runs the old one
    op_switch({"root": str(root), "bundle_id": tiny_bundle.bundle_id, "action": "rollback"})
    stale = edgesdk(*deploy_args(server, root, "--status"))
    assert (f"release {newer.bundle_id}: it started before current switched to {tiny_bundle.bundle_id}, so it "
            "does not serve current; restart the unit") in stale.stdout, stale.stdout

    pid = int((state / "edgesdk-serve.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    while not gone(pid):
        time.sleep(0.05)
    killed = edgesdk(*deploy_args(server, root, "--status"))
    assert killed.returncode == 0, killed.stderr
    assert f"service    edgesdk-serve ({scope} unit, enabled, failed)" in killed.stdout, killed.stdout
    assert "  serving  nothing: /health does not answer (Connection refused)" in killed.stdout
    info = json.loads(edgesdk(*deploy_args(server, root, "--status", "--json")).stdout)["service"]
    assert info["active"] == "failed"
    assert info["health"]["ok"] is False
    assert info["server"] is None

    # a board with no systemd: said, not an error
    bare_status = edgesdk(*deploy_args(bare, root, "--status"))
    assert bare_status.returncode == 0, bare_status.stderr
    assert f"service    edgesdk-serve ({scope} unit, no answer from systemd: the board has no systemctl)" \
        in bare_status.stdout, bare_status.stdout


def test_remove_takes_one_old_release_refuses_current_and_warns_for_previous(ssh_server, tiny_bundle, tmp_path):
    root = tmp_path / "board"
    first = bundle_variant(tiny_bundle.path, tmp_path / "a", "a")
    assert edgesdk(*deploy_args(ssh_server, root, first.path)).returncode == 0
    # a second runtime that only the first release ran with (as after a deploy by another edgesdk), paired with it
    # by a real switch
    key = os.readlink(root / "runtime" / "current")
    other = f"{key}-other"
    shutil.copytree(root / "runtime" / key, root / "runtime" / other, symlinks=True)
    stamp = json.loads((root / "runtime" / other / "edgesdk-runtime.json").read_text())
    write_stamp(str(root / "runtime" / other), {**stamp, "key": other})
    op_switch({"root": str(root), "bundle_id": first.bundle_id, "runtime_key": other})
    second = bundle_variant(tiny_bundle.path, tmp_path / "b", "b")
    assert edgesdk(*deploy_args(ssh_server, root, second.path, "--keep", "5")).returncode == 0
    assert json.loads((root / "runtimes.json").read_text())[first.bundle_id] == other

    before = tree_state(root)
    current = edgesdk(*deploy_args(ssh_server, root, "--remove", second.bundle_id[:6]))
    assert current.returncode != 0
    assert f"release {second.bundle_id} is current on {ssh_server.destination}, so it is not removed" \
        in current.stderr
    assert f"'edgesdk deploy --rollback' (to {first.bundle_id})" in current.stderr
    unknown = edgesdk(*deploy_args(ssh_server, root, "--remove", "zz"))
    assert unknown.returncode != 0
    assert f"--remove 'zz' is not a release on {ssh_server.destination} (it holds {second.bundle_id}, " \
           f"{first.bundle_id})" in unknown.stderr
    assert tree_state(root) == before

    removed = edgesdk(*deploy_args(ssh_server, root, "--remove", first.bundle_id[:8]))
    assert removed.returncode == 0, removed.stderr
    assert f"warning: releases/{first.bundle_id} is previous on {ssh_server.destination}: once it is removed, " \
           "'edgesdk deploy --rollback' has no release to go back to" in removed.stderr
    assert f"removed releases/{first.bundle_id}, and the edgesdk runtime {other} only it ran with" in removed.stdout
    assert not (root / "releases" / first.bundle_id).exists()
    assert not (root / "runtime" / other).exists()
    assert (root / "runtime" / "current").resolve().is_dir()  # the runtime current runs with stays
    assert not os.path.lexists(root / "previous")
    assert first.bundle_id not in json.loads((root / "runtimes.json").read_text())
    status = edgesdk(*deploy_args(ssh_server, root, "--status"))
    assert "previous   none\n" in status.stdout
    assert "has no previous release to roll back to" in edgesdk(*deploy_args(ssh_server, root, "--rollback")).stderr

    third = bundle_variant(tiny_bundle.path, tmp_path / "c", "c")
    assert edgesdk(*deploy_args(ssh_server, root, third.path, "--keep", "5")).returncode == 0
    assert edgesdk(*deploy_args(ssh_server, root, first.path, "--keep", "5")).returncode == 0
    old = edgesdk(*deploy_args(ssh_server, root, "--remove", second.bundle_id, "--json"))
    assert old.returncode == 0, old.stderr
    assert "warning" not in old.stderr
    assert json.loads(old.stdout)["removed"] == second.bundle_id
    assert sorted(os.listdir(root / "releases")) == sorted([first.bundle_id, third.bundle_id])
    assert (current_id(root), os.path.basename(os.readlink(root / "previous"))) == (first.bundle_id, third.bundle_id)


def test_remove_takes_one_board_and_nothing_else():
    both = edgesdk("deploy", "--remove", "abc", "--status", "--host", "pi@board")
    assert both.returncode == 2
    assert "drop --status" in both.stderr
    fleet = edgesdk("deploy", "--remove", "abc", "--host", "pi@a", "--host", "pi@b")
    assert fleet.returncode == 2
    assert "removes abc from one board" in fleet.stderr
