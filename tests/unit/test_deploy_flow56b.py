"""Review 56b of deploy: a login or a host key refused by the jump host is the jump host's, not the board's; a
switch that leaves ``previous`` where it is does not look at it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from edgesdk.deploy.remote import Board
from edgesdk.deploy.transport import (
    DeployError,
    HostSpec,
    LocalTransport,
    SshOptions,
    ssh_failure,
)
from tests.unit.test_deploy_flow56 import failure
from tests.unit.test_deploy_helper import commit_by_hand, make_bundle


@pytest.fixture
def board(tmp_path) -> Board:
    root = str(tmp_path / "board")
    return Board(LocalTransport(root), sys.executable, root)


def jump_config(ssh_server, tmp_path, known: str, extra: str = "") -> Path:
    """An ssh config (ProxyJump hands the jump host's ssh this file only, not -o or -i) whose known_hosts holds
    ``known``; localhost, the jump host's name in these tests, is the same sshd as the board (127.0.0.1)."""
    (tmp_path / "known_hosts").write_text(known)
    config = tmp_path / "ssh_config"
    config.write_text(f"Host *\n  UserKnownHostsFile {tmp_path / 'known_hosts'}\n  GlobalKnownHostsFile /dev/null\n"
                      f"  IdentityFile {ssh_server.user_key}\n  IdentitiesOnly yes\n  BatchMode yes\n{extra}")
    return config


def test_a_login_the_jump_host_refuses_is_not_told_as_the_boards(ssh_server, tmp_path):
    """The jump host's 'ops@HOST: Permission denied' reached the board's refused-login error, which named the
    board's user and said to ssh-copy-id the key onto the board, never reached."""
    board_key = ssh_server.known_hosts.read_text()
    config = jump_config(ssh_server, tmp_path, board_key + board_key.replace("[127.0.0.1]", "[localhost]"))
    options = SshOptions(ssh_config=str(config), options=(f"ProxyJump=nobody@localhost:{ssh_server.port}",))
    error = failure(ssh_server.destination, options)
    assert "jump host localhost" in error.problem
    assert "refused the login of user nobody" in error.problem
    assert error.problem.startswith(f"cannot reach {ssh_server.destination}")
    assert "ssh-copy-id nobody@localhost" in error.fix
    assert "ssh-copy-id -p" not in error.fix  # the board's own fix


def test_a_jump_host_with_no_known_host_key_is_named_not_the_board(ssh_server, tmp_path):
    """The jump host's 'Host key verification failed.' was read as the board's: 'BOARD has no host key in
    known_hosts' and a fix of --accept-new-host-key, which ProxyJump does not hand on to the jump host."""
    config = jump_config(ssh_server, tmp_path, ssh_server.known_hosts.read_text(),  # the board's key only
                         "  StrictHostKeyChecking yes\n")
    options = SshOptions(ssh_config=str(config), options=(f"ProxyJump=localhost:{ssh_server.port}",))
    error = failure(ssh_server.destination, options)
    assert "jump host localhost" in error.problem
    assert "host key" in error.problem
    assert f"ssh -p {ssh_server.port} localhost" in error.fix
    assert "applies to the board only" in error.fix


def test_the_boards_own_refusal_through_a_jump_host_is_still_the_boards(ssh_server, tmp_path):
    board_key = ssh_server.known_hosts.read_text()
    config = jump_config(ssh_server, tmp_path, board_key + board_key.replace("[127.0.0.1]", "[localhost]"))
    options = SshOptions(ssh_config=str(config), options=(f"ProxyJump={ssh_server.user}@localhost:{ssh_server.port}",))
    error = failure(f"nobody@127.0.0.1:{ssh_server.port}", options)
    assert "refused the login of user nobody" in error.problem
    assert "jump host" not in error.problem
    assert "ssh-copy-id -p" in error.fix


def test_an_unresolved_jump_host_says_what_deploy_was_doing():
    """The jump-host branch of an unresolved name dropped the ' while ...' that every other unreachable-board
    error carries."""
    error = ssh_failure(HostSpec("jetson", "ubuntu"), "ssh: Could not resolve hostname gw.invalid: Name or service "
                        "not known\r\nConnection closed by UNKNOWN port 65535\r\n", during="sending the bundle")
    assert error.problem.startswith("cannot reach ubuntu@jetson while sending the bundle: ")
    assert "'gw.invalid'" in error.problem


def test_a_redeploy_of_the_current_release_ignores_a_stray_previous_directory(board, tmp_path):
    """A switch to the release current already points to moves no link, previous included; it was refused for a
    directory named previous that it would never touch, where it had gone through before."""
    root = Path(board.root)
    first = make_bundle(tmp_path / "a", {"w": b"1"})
    commit_by_hand(board, first)
    board.call("switch", {"bundle_id": first.bundle_id})
    (root / "previous").mkdir()
    result = board.call("switch", {"bundle_id": first.bundle_id})
    assert result["from"] == result["to"] == first.bundle_id
    assert os.readlink(root / "current") == f"releases/{first.bundle_id}"
    assert (root / "previous").is_dir()


def test_a_switch_that_moves_previous_still_refuses_a_previous_directory(board, tmp_path):
    root = Path(board.root)
    first, second = make_bundle(tmp_path / "a", {"w": b"1"}), make_bundle(tmp_path / "b", {"w": b"2"})
    commit_by_hand(board, first)
    board.call("switch", {"bundle_id": first.bundle_id})
    commit_by_hand(board, second)
    (root / "previous").mkdir()
    with pytest.raises(DeployError) as refused:
        board.call("switch", {"bundle_id": second.bundle_id})
    assert refused.value.problem.startswith(f"{root / 'previous'} on the board is a directory")
    assert os.readlink(root / "current") == f"releases/{first.bundle_id}"
