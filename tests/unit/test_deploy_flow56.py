"""Deploy's ssh transport and flow against a real sshd: errors that name the host that failed."""

from __future__ import annotations

import pytest

from edgesdk.deploy.transport import DeployError, HostSpec, SshOptions, SshTransport


def failure(host: str, options: SshOptions) -> DeployError:
    board = SshTransport(HostSpec.parse(host), options)
    try:
        with pytest.raises(DeployError) as info:
            board.run(["true"], timeout=60)
    finally:
        board.close()
    return info.value


def test_a_jump_host_that_does_not_resolve_is_named_not_the_board(ssh_server):
    """With ControlPersist (deploy's shared connection) ssh sends a ProxyJump's stderr to /dev/null, so a jump
    host it could not resolve left only 'Connection closed by UNKNOWN port 65535' and the generic 'check the
    network' error; the jump host's name was nowhere."""
    options = SshOptions(ssh_config="/dev/null",
                         options=(f"UserKnownHostsFile={ssh_server.known_hosts}", "ProxyJump=no-such-jump.invalid"))
    error = failure(ssh_server.destination, options)
    assert "'no-such-jump.invalid'" in error.problem
    assert "board's name" not in error.problem
    assert "no-such-jump.invalid" in error.fix


def test_an_alias_whose_hostname_does_not_resolve_names_the_hostname(tmp_path):
    """ssh names the HostName it could not resolve; the error blamed the alias ('cannot resolve the board's name
    'lab-board'') and told the user to define the name in ~/.ssh/config, where it is defined."""
    config = tmp_path / "ssh_config"
    config.write_text("Host lab-board\n  HostName lab-board-typo.invalid\n")
    error = failure("pi@lab-board", SshOptions(ssh_config=str(config)))
    assert "'lab-board-typo.invalid'" in error.problem
    assert "board's name" not in error.problem
    assert "ssh -G pi@lab-board" in error.fix


def test_the_board_name_itself_unresolved_is_still_the_boards(tmp_path):
    error = failure("pi@no-such-board.invalid", SshOptions(ssh_config="/dev/null"))
    assert "cannot resolve the board's name 'no-such-board.invalid'" in error.problem


def test_a_jump_host_that_refuses_is_named_with_its_port_not_the_boards(ssh_server):
    """Through a ProxyJump, the 'connect to host H port P: Connection refused' line is the jump host's; the error
    said nothing of it (ControlPersist hid it), and once shown it was read as the board's sshd refusing on the
    board's port."""
    from tests._utils.sshd import free_port

    closed = free_port()
    options = SshOptions(ssh_config="/dev/null",
                         options=(f"UserKnownHostsFile={ssh_server.known_hosts}", f"ProxyJump=127.0.0.1:{closed}"))
    error = failure(ssh_server.destination, options)
    assert "jump host 127.0.0.1" in error.problem
    assert f"port {closed}: Connection refused" in error.problem
    assert f"port {closed}" in error.fix
    assert f"port {ssh_server.port}" not in error.fix
