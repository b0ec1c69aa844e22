"""Shipping a bundle over a real sshd, review 62: the ssh options deploy builds and the transfers it resumes.

A ProxyJump hands the ``--ssh-config`` path to the jump host's ssh through a shell, unquoted (OpenSSH ssh.c), so a
path with a space failed with "Can't open user config file" and the fix said to pass an existing file, which it
was. A temporary directory with a space made deploy's own ``-o ControlPath=...`` a line ssh refuses, so no deploy
reached any board. And a transfer cut by Ctrl-C, or by a connection the board dropped, leaves its ``.partial``, and
the next deploy sends only the rest.

The board is the real helper behind the ``ssh_server`` fixture (tests/_utils/sshd.py); nothing is mocked. The deploy
that is cut runs in a process of its own, whose read of the bundle file waits after its first bytes until the test
has cut it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from edgesdk.deploy.transfer import bundle_files
from edgesdk.deploy.transport import DeployError, HostSpec, SshOptions, SshTransport
from tests.unit.test_deploy_board_facts37 import planned, ssh_board
from tests.unit.test_deploy_helper import make_bundle


def jump_config(server, path: Path) -> Path:
    """An ssh config at ``path``: ``board`` is the server, and ``jumped`` is the server reached through ``board``."""
    block = (f"  HostName 127.0.0.1\n  Port {server.port}\n  User {server.user}\n  IdentityFile {server.user_key}\n"
             f"  IdentitiesOnly yes\n  UserKnownHostsFile {server.known_hosts}\n  GlobalKnownHostsFile /dev/null\n")
    path.write_text(f"Host board\n{block}Host jumped\n{block}  ProxyJump board\n")
    return path


def echo(transport: SshTransport) -> bytes:
    try:
        return transport.run(["echo", "from the board"], timeout=60).stdout
    finally:
        transport.close()


def test_a_config_path_with_a_space_behind_a_proxyjump_is_not_called_missing(ssh_server, tmp_path):
    plain = jump_config(ssh_server, tmp_path / "ssh_config")
    assert echo(SshTransport(HostSpec.parse("jumped"), SshOptions(ssh_config=str(plain)))) == b"from the board\n"

    spaced = jump_config(ssh_server, tmp_path / "my ssh config")
    with pytest.raises(DeployError) as info:
        echo(SshTransport(HostSpec.parse("jumped"), SshOptions(ssh_config=str(spaced))))
    assert "ProxyJump" in info.value.problem
    assert f"--ssh-config {spaced}" in info.value.problem
    assert "' '" in info.value.problem
    assert "existing file" not in info.value.fix
    assert "path without spaces" in info.value.fix


def test_a_missing_config_file_is_still_called_missing(ssh_server, tmp_path):
    with pytest.raises(DeployError) as info:
        echo(SshTransport(HostSpec.parse("jumped"), SshOptions(ssh_config=str(tmp_path / "no such config"))))
    assert info.value.fix == "pass an existing file to --ssh-config (ssh does not expand ~ in it)"


@pytest.fixture
def spaced_tmpdir(monkeypatch):
    """A temporary directory with a space in its name, short enough for a socket path, as tempfile's default: ssh
    refused deploy's ``-o ControlPath=DIR/%C`` under it ("keyword controlpath extra arguments at end of line")."""
    folder = tempfile.mkdtemp(prefix="e d")
    monkeypatch.setattr(tempfile, "tempdir", folder)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_temporary_directory_with_a_space_does_not_break_the_shared_connection(ssh_server, spaced_tmpdir):
    opts = SshOptions(identity=str(ssh_server.user_key), ssh_config="/dev/null",
                      options=(f"UserKnownHostsFile={ssh_server.known_hosts}", "GlobalKnownHostsFile=/dev/null"))
    transport = SshTransport(HostSpec.parse(ssh_server.destination), opts)
    shared = transport._control_dir
    assert echo(transport) == b"from the board\n"
    assert not any(c.isspace() for c in shared)


# A deploy's transfer in a process of its own; its read of w.bin stops after ``stall_after`` bytes and waits for the
# file ``go`` (Ctrl-C ends it there).
DEPLOY = r"""
import builtins, json, os, sys, time
from pathlib import Path

import edgesdk.deploy.transfer as transfer
from edgesdk.bundle import Bundle
from edgesdk.deploy.remote import Board
from edgesdk.deploy.report import Reporter
from edgesdk.deploy.transport import HostSpec, SshOptions, SshTransport

args = json.loads(sys.argv[1])


class Stalling:
    def __init__(self, handle):
        self.handle, self.given = handle, 0

    def __getattr__(self, name):
        return getattr(self.handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.close()

    def read(self, size):
        if self.given >= args["stall_after"]:
            print("STALLED", flush=True)
            while not os.path.exists(args["go"]):
                time.sleep(0.05)
            return self.handle.read(size)
        block = self.handle.read(min(size, args["stall_after"] - self.given))
        self.given += len(block)
        return block


def stalling_open(path, *rest, **kw):
    handle = builtins.open(path, *rest, **kw)
    return Stalling(handle) if Path(path).name == "w.bin" and args["stall_after"] else handle


transfer.open = stalling_open
path = Path(args["bundle"])
bundle = Bundle(path, json.loads((path / "manifest.json").read_text()))
opts = SshOptions(identity=args["key"], ssh_config="/dev/null",
                  options=("UserKnownHostsFile=" + args["known_hosts"], "GlobalKnownHostsFile=/dev/null"))
board = Board(SshTransport(HostSpec.parse(args["destination"]), opts), sys.executable, args["root"])
try:
    files = transfer.bundle_files(bundle)
    raw = board.call("probe", {"bundle_id": bundle.bundle_id, "files": files,
                               "manifest_sha256": files["manifest.json"]["sha256"]})
    plan = transfer.make_plan(files, raw["plan"])
    print("PLAN " + json.dumps(plan.send), flush=True)
    transfer.send(board, bundle, files, plan, Reporter(1, write=lambda line: None))
    print("SENT", flush=True)
finally:
    board.transport.close()
"""


def deploy(server, root: Path, bundle, stall_after: int = 0) -> subprocess.Popen:
    args = {"bundle": str(bundle.path), "key": str(server.user_key), "known_hosts": str(server.known_hosts),
            "destination": server.destination, "root": str(root), "stall_after": stall_after,
            "go": str(root) + ".go"}
    return subprocess.Popen([sys.executable, "-c", DEPLOY, json.dumps(args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, cwd=os.getcwd())


def wait_for(condition, child: subprocess.Popen) -> None:
    """Until ``condition()`` holds; the deploy must still run meanwhile."""
    import time

    while not condition():
        assert child.poll() is None, child.communicate()
        time.sleep(0.05)


@pytest.mark.parametrize("cut", ["ctrl-c", "dropped connection"])
def test_a_transfer_cut_midway_leaves_its_partial_and_the_next_deploy_sends_only_the_rest(ssh_server, tmp_path, cut):
    root = tmp_path / "board"
    data = os.urandom(3_000_000)
    bundle = make_bundle(tmp_path / "b", {"w.bin": data})
    partial = root / "staging" / bundle.bundle_id / "w.bin.partial"

    child = deploy(ssh_server, root, bundle, stall_after=1_000_000)
    wait_for(lambda: child.stdout.readline().startswith(b"STALLED"), child)
    wait_for(lambda: partial.exists() and partial.stat().st_size == 1_000_000, child)
    if cut == "ctrl-c":
        os.killpg(child.pid, signal.SIGINT)  # as the terminal sends it to deploy and its ssh
    else:
        assert ssh_server.kill_sessions()
        Path(str(root) + ".go").write_text("")
    _out, err = child.communicate()
    assert child.returncode != 0
    if cut == "ctrl-c":
        assert b"KeyboardInterrupt" in err, err
    else:
        # what the host had written into the pipe to its ssh as the connection went counts as sent
        assert b"the ssh connection to" in err, err
        assert b"failed while sending w.bin (after " in err, err
        assert b"it resumes" in err, err
        os.unlink(str(root) + ".go")
    assert partial.read_bytes() == data[:1_000_000]

    again = deploy(ssh_server, root, bundle)
    out, err = again.communicate()
    assert again.returncode == 0, err.decode()
    assert json.loads(out.decode().splitlines()[0][len("PLAN "):]) == [["w.bin", 1_000_000]]
    assert (root / "staging" / bundle.bundle_id / "w.bin").read_bytes() == data
    assert not partial.exists()
    board = ssh_board(ssh_server, root)
    try:
        files = bundle_files(bundle)
        assert planned(board, bundle)[1].send == []
        assert board.call("commit", {"bundle_id": bundle.bundle_id,
                                     "manifest_sha256": files["manifest.json"]["sha256"]})["problems"] == []
    finally:
        board.transport.close()
