"""Shipping a bundle over a real sshd, review 62: the ssh options deploy builds and the transfers it resumes.

A ProxyJump hands the ``--ssh-config`` path to the jump host's ssh through a shell, unquoted (OpenSSH ssh.c), so a
path with a space failed with "Can't open user config file" and the fix said to pass an existing file, which it
was. A temporary directory with a space made deploy's own ``-o ControlPath=...`` a line ssh refuses, so no deploy
reached any board.

The board is the real helper behind the ``ssh_server`` fixture (tests/_utils/sshd.py); nothing is mocked."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from edgesdk.deploy.transport import DeployError, HostSpec, SshOptions, SshTransport


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
