"""The ssh transport against a real sshd: a private key ssh cannot use, and a board command's own exit 255."""

from __future__ import annotations

import shutil

import pytest

from edgesdk.deploy.transport import DeployError, HostSpec, SshOptions, SshTransport


def transport(server, key) -> SshTransport:
    """The board on ``server``, reached with the private key ``key`` and the server's known_hosts only."""
    options = SshOptions(identity=str(key), ssh_config="/dev/null",
                         options=(f"UserKnownHostsFile={server.known_hosts}", "GlobalKnownHostsFile=/dev/null"))
    return SshTransport(HostSpec.parse(server.destination), options)


def refusal(server, key) -> DeployError:
    board = transport(server, key)
    try:
        with pytest.raises(DeployError) as info:
            board.run(["true"], timeout=60)
    finally:
        board.close()
    return info.value


def test_a_private_key_that_others_can_read_is_named_with_the_chmod_that_fixes_it(ssh_server, tmp_path):
    """ssh ignores a key whose mode lets others read it ('bad permissions') and logs in without it, so the board
    refused the login and the error blamed the user name or the key's absence on the board (pass -i, ssh-copy-id),
    where the key on this machine only needed chmod 600."""
    key = tmp_path / "board key"
    shutil.copyfile(ssh_server.user_key, key)
    key.chmod(0o644)
    error = refusal(ssh_server, key)
    assert str(key) in str(error)
    assert "0644" in str(error)
    assert f"chmod 600 '{key}'" in error.fix
    assert "ssh-copy-id" not in error.fix


def test_an_identity_file_that_is_not_there_is_named(ssh_server, tmp_path):
    missing = tmp_path / "id_missing"
    error = refusal(ssh_server, missing)
    assert f"cannot read the private key {missing} (No such file or directory)" in str(error)
    assert "existing private key" in error.fix


def test_an_identity_file_that_is_no_private_key_is_named(ssh_server, tmp_path):
    garbage = tmp_path / "not_a_key"
    garbage.write_text("not a key\n")
    garbage.chmod(0o600)
    error = refusal(ssh_server, garbage)
    assert f"cannot load the private key {garbage}" in str(error)
    assert "not its .pub" in error.fix


@pytest.mark.parametrize("data", [None, b"payload"], ids=["no input", "input"])
def test_a_board_command_that_exits_255_itself_is_not_taken_for_a_lost_connection(ssh_server, data):
    """ssh exits with 255 for a failed connection and passes a remote command's 255 on unchanged: a board command
    that exited 255 (a program's exit(-1)) was reported as 'the ssh connection failed: (ssh printed nothing)',
    with the advice to check the network. Its status and output come back now, as for any other status."""
    board = transport(ssh_server, ssh_server.user_key)
    try:
        proc = board.run(["sh", "-c", "cat >/dev/null; echo out; echo err >&2; exit 255"], input=data, timeout=60)
        assert proc.returncode == 255
        assert proc.stdout == b"out\n"
        assert proc.stderr.decode().startswith("err\n")
    finally:
        board.close()


def test_a_lost_connection_still_is_one(ssh_server, tmp_path):
    """The board's own 255 aside, ssh's 255 still names the failed connection."""
    from tests._utils.sshd import free_port

    options = SshOptions(identity=str(ssh_server.user_key), ssh_config="/dev/null",
                         options=(f"UserKnownHostsFile={ssh_server.known_hosts}", "GlobalKnownHostsFile=/dev/null"))
    board = SshTransport(HostSpec.parse(f"{ssh_server.user}@127.0.0.1:{free_port()}"), options)
    try:
        with pytest.raises(DeployError, match="nothing accepts ssh connections"):
            board.run(["true"], timeout=60)
    finally:
        board.close()


def test_closing_a_master_connection_that_does_not_answer_raises_nothing(ssh_server):
    """close() runs in the finally of a deploy, a status or a rollback: a master that did not answer 'ssh -O exit'
    within 15 s made it raise subprocess.TimeoutExpired, whose traceback replaced the outcome (a DeployError, or a
    deploy that had succeeded) and left the socket's directory behind. The master is stopped (SIGSTOP) here."""
    import os
    import re
    import signal
    import subprocess

    board = transport(ssh_server, ssh_server.user_key)
    assert board.run(["true"], timeout=60).returncode == 0
    check = subprocess.run([*board.base, *board.ssh_args(), "-O", "check", "--", board.spec.destination],
                           capture_output=True, text=True, timeout=30)
    master = int(re.search(r"pid=(\d+)", check.stderr)[1])
    control_dir = board._control_dir
    os.kill(master, signal.SIGSTOP)
    try:
        board.close()
        assert board._control_dir is None
        assert not os.path.exists(control_dir)
    finally:
        os.kill(master, signal.SIGCONT)
        os.kill(master, signal.SIGTERM)


def test_a_receive_killed_on_the_board_is_not_reported_as_a_lost_connection(ssh_server, tmp_path):
    """The bundle's stream runs without a deadline wrapper, as the board command itself: when the board killed it
    (the out-of-memory killer's SIGKILL), ssh exited with 255, its own status for a failed connection, and the
    deploy said 'the ssh connection ... failed while sending ...: (ssh printed nothing)'. The board's shell now
    waits for it, so it ends as 128 + 9 and the error names the signal and its usual cause."""
    import os
    import stat
    import sys

    from edgesdk.deploy.remote import Board
    from edgesdk.deploy.report import Reporter
    from edgesdk.deploy.transfer import send
    from tests.unit.test_deploy_board_facts37 import planned
    from tests.unit.test_deploy_helper import make_bundle

    board = Board(transport(ssh_server, ssh_server.user_key), sys.executable, str(tmp_path / "board"))
    try:
        bundle = make_bundle(tmp_path / "b", {"w.bin": os.urandom(20_000)})
        files, plan = planned(board, bundle)
        killed = tmp_path / "python killed"  # the board's Python, killed as it starts to receive
        killed.write_text("#!/bin/sh\nkill -KILL $$\n")
        killed.chmod(killed.stat().st_mode | stat.S_IXUSR)
        board.python = str(killed)
        with pytest.raises(DeployError) as info:
            send(board, bundle, files, plan, Reporter(1, write=lambda line: None))
        assert "ssh connection" not in str(info.value)
        assert "exit 137" in str(info.value)
        assert "SIGKILL" in str(info.value)
    finally:
        board.transport.close()
