"""Deploy to many boards and across sessions: the retry line a fleet prints, the known_hosts entry a changed host
key names, and a ``~/`` board Python, over a real sshd where a board is needed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from edgesdk.deploy import fleet
from edgesdk.deploy.remote import Board
from edgesdk.deploy.session import DeployOptions, open_board
from edgesdk.deploy.transport import DeployError, HostSpec, SshOptions, SshTransport, ssh_failure


def ssh_options(server, **more) -> SshOptions:
    return SshOptions(identity=str(server.user_key), ssh_config="/dev/null",
                      options=(f"UserKnownHostsFile={server.known_hosts}", "GlobalKnownHostsFile=/dev/null"), **more)


def test_the_retry_line_picks_an_inventory_board_whose_host_a_host_option_shared(tmp_path):
    """--host pi@a and an inventory line 'pi@a remote_root=/data' are told apart by their roots ('pi@a /data');
    the retry of the inventory board alone (--hosts FILE --limit 'pi@a /data') has no --host sharing its host any
    more, and was refused: '--limit pi@a /data names no board'."""
    inventory = tmp_path / "boards.txt"
    inventory.write_text("pi@a remote_root=/data\npi@b\n")
    boards = fleet.fleet_boards(("pi@a",), inventory, (), "~/edgesdk")
    assert [b.label for b in boards] == ["pi@a ~/edgesdk", "pi@a /data", "pi@b"]
    words = fleet.retry_arguments([boards[1]])
    assert words == ["--hosts", str(inventory), "--limit", "pi@a /data"]
    again = fleet.fleet_boards((), inventory, tuple(words[3::2]), "~/edgesdk")
    assert [(b.host, b.remote_root) for b in again] == [("pi@a", "/data")]
    with pytest.raises(DeployError, match="--limit pi@a /other names no board"):
        fleet.fleet_boards((), inventory, ("pi@a /other",), "~/edgesdk")


def test_a_changed_host_key_on_port_22_names_the_known_hosts_entry_ssh_stored():
    """ssh stores a port-22 host bare ('board'), '[host]:port' only for another port (misc.c put_host_port)."""
    changed = "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\nHost key verification failed."
    for host in ("pi@board:22", "pi@board"):
        assert "'ssh-keygen -R \"board\"'" in ssh_failure(HostSpec.parse(host), changed).fix
    assert "'ssh-keygen -R \"[board]:2222\"'" in ssh_failure(HostSpec.parse("pi@board:2222"), changed).fix


def test_a_changed_host_key_of_an_ssh_config_alias_names_the_entry_ssh_printed(ssh_server, tmp_path):
    """Through an ~/.ssh/config alias, known_hosts holds the HostName's entry, not the alias: the fix is the
    'ssh-keygen -f FILE -R NAME' ssh printed itself, not 'ssh-keygen -R "myboard"', which removes nothing."""
    config = tmp_path / "ssh_config"
    config.write_text(f"Host myboard\n  HostName 127.0.0.1\n  Port {ssh_server.port}\n  User {ssh_server.user}\n")
    try:
        ssh_server.new_host_key()
        opts = SshOptions(identity=str(ssh_server.user_key), ssh_config=str(config), multiplex=False,
                          options=(f"UserKnownHostsFile={ssh_server.known_hosts}", "GlobalKnownHostsFile=/dev/null"))
        with pytest.raises(DeployError) as refused:
            SshTransport(HostSpec.parse("myboard"), opts).run(["true"], timeout=30)
    finally:
        ssh_server.write_known_hosts()  # the new key is the one known from here on
    assert "the host key of myboard has changed" in refused.value.problem
    assert f'-R "[127.0.0.1]:{ssh_server.port}"' in refused.value.fix
    assert f'ssh-keygen -R "[127.0.0.1]:{ssh_server.port}" -f "' in refused.value.fix
    assert '-R "myboard"' not in refused.value.fix


def test_a_board_python_under_the_home_directory_written_with_a_tilde_runs(ssh_server, tmp_path):
    """remote_python=~/venv/bin/python3 (an inventory setting, which no local shell expands) reached the board's
    shell quoted, where ~ is not expanded: the deploy failed with "'~/...' cannot be started". Here '~/../..'
    climbs from the home directory to / whatever its depth, then down to this interpreter."""
    python = "~/" + "../" * 40 + sys.executable.lstrip("/")
    root = tmp_path / "board"
    board = open_board(DeployOptions(host=ssh_server.destination, ssh=ssh_options(ssh_server),
                                     remote_python=python, remote_root=str(root)))
    try:
        facts = board.call("probe", {})
    finally:
        board.transport.close()
    assert facts["root"] == str(root)
    local = open_board(DeployOptions(to=tmp_path / "local", remote_python=python))
    assert isinstance(local, Board)
    assert Path(local.python).resolve() == Path(sys.executable).resolve()
    assert local.call("probe", {})["root"] == str((tmp_path / "local").resolve())


def test_a_refused_login_without_a_user_in_host_names_the_user_ssh_tried(ssh_server, tmp_path):
    """--host ALIAS without user@: ssh logs in as its config's User, else as the local user. The message said
    'user (from ~/.ssh/config)' even with no config at all; ssh's own line names the user it tried."""
    import getpass

    from tests._utils.sshd import keygen

    stranger = keygen(tmp_path / "stranger", "not-authorized")
    config = tmp_path / "ssh_config"
    config.write_text(f"Host aliased\n  HostName 127.0.0.1\n  Port {ssh_server.port}\n  User edgesdk-nobody\n")
    for host, ssh_config, user in ((f"127.0.0.1:{ssh_server.port}", "/dev/null", getpass.getuser()),
                                   ("aliased", str(config), "edgesdk-nobody")):
        opts = SshOptions(identity=str(stranger), ssh_config=ssh_config, multiplex=False,
                          options=(f"UserKnownHostsFile={ssh_server.known_hosts}", "GlobalKnownHostsFile=/dev/null"))
        with pytest.raises(DeployError) as refused:
            SshTransport(HostSpec.parse(host), opts).run(["true"], timeout=30)
        assert f"{host} refused the login of user {user}: " in refused.value.problem
        assert "ssh-copy-id" in refused.value.fix


@pytest.mark.parametrize(("letter", "length"), [("t", 30), ("t", 48), ("é", 24)])
def test_a_temporary_directory_of_30_to_48_characters_still_connects(ssh_server, monkeypatch, letter, length):
    """The ssh master's socket lives under the temporary directory, which was used up to 48 characters. ssh
    first binds 'ControlPath.<16 letters>' (mux.c), so from 29 characters on (Linux) every connection failed:
    'ControlPath too long' or 'path ... too long for Unix domain socket'. A socket path's limit is in bytes:
    24 characters of which some are 'é' (two bytes in UTF-8) are too many too."""
    import os
    import shutil
    import tempfile

    parent = f"/tmp/e46-{os.getpid()}-"
    parent += letter * (length - len(parent))
    os.makedirs(parent, exist_ok=True)
    monkeypatch.setattr(tempfile, "tempdir", parent)
    transport = SshTransport(HostSpec.parse(ssh_server.destination), ssh_options(ssh_server))
    try:
        assert transport.run(["echo", "reached"], timeout=60).stdout == b"reached\n"
        assert transport.run(["echo", "again"], timeout=60).stdout == b"again\n"  # through the master
    finally:
        transport.close()
        shutil.rmtree(parent, ignore_errors=True)


def test_a_user_name_with_an_at_sign_is_taken_as_ssh_takes_it(ssh_server, tmp_path):
    """A directory user (alice@corp.example, as sssd names them) logs in with ssh alice@corp.example@board:
    ssh splits at the last '@' (ssh.c strrchr). --host refused it as 'not of the form user@board[:port]'."""
    spec = HostSpec.parse(f"alice@corp.example@127.0.0.1:{ssh_server.port}")
    assert (spec.user, spec.host, spec.port) == ("alice@corp.example", "127.0.0.1", ssh_server.port)
    assert HostSpec.parse("alice@corp.example@[fe80::1%eth0]:2222").destination == "alice@corp.example@fe80::1%eth0"
    for bad in ("pi@@b1", "@b1", "pi@b1@"):
        with pytest.raises(DeployError, match="is not of the form user@board"):
            HostSpec.parse(bad)
    # the ssh client reads the destination the same way: it asks the board for that user (which it refuses here)
    with pytest.raises(DeployError) as refused:
        SshTransport(spec, ssh_options(ssh_server, multiplex=False)).run(["true"], timeout=30)
    assert "refused the login of user alice@corp.example: alice@corp.example@127.0.0.1: Permission denied" \
        in refused.value.problem


@pytest.mark.parametrize("root", ["edgesdk", "~/edgesdk/", "~/./edgesdk", "edgesdk//"])
def test_one_deploy_root_spelled_two_ways_is_a_board_given_twice(tmp_path, root):
    """ssh starts remote commands in the home directory, so '~/edgesdk' (the default) and 'edgesdk' or
    '~/edgesdk/' are one directory: two concurrent deploys into it were started instead of the refusal."""
    inventory = tmp_path / "boards.txt"
    inventory.write_text(f"pi@b1\npi@b2\npi@b1 remote_root={root}\n")
    with pytest.raises(DeployError) as twice:
        fleet.fleet_boards((), inventory, (), "~/edgesdk")
    assert f"board pi@b1 (deploy root {root}) is given twice: at {inventory}:1 and at {inventory}:3" \
        in twice.value.problem
    inventory.write_text("pi@b1\npi@b1 remote_root=~/edgesdk2\npi@b1 remote_root=/home/pi/edgesdk\n")
    assert len(fleet.fleet_boards((), inventory, (), "~/edgesdk")) == 3  # other roots (or not known to be one)
