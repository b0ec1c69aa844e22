"""Deploy's ssh errors: the known_hosts file of a changed host key, a bad line of an included ssh config file, and
the key that ssh-copy-id is to install after a refused login."""

from __future__ import annotations

import pytest

from edgesdk.deploy.transport import DeployError, HostSpec, SshOptions, SshTransport, ssh_failure

# What OpenSSH without Debian's "remove with:" hint prints for a changed key (sshconnect.c check_host_key).
UPSTREAM_CHANGED_KEY = """\
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
Add correct host key in /home/me/.ssh/boards_known_hosts to get rid of this message.
Offending ED25519 key in /home/me/.ssh/boards_known_hosts:3
Host key for [192.168.1.20]:2222 has changed and you have requested strict checking.
Host key verification failed.
"""


def test_a_changed_host_key_is_removed_from_the_known_hosts_file_that_holds_it():
    """Without Debian's printed ssh-keygen line the fix was 'ssh-keygen -R NAME', which edits ~/.ssh/known_hosts,
    not the UserKnownHostsFile that ssh named as holding the offending key: the next deploy was refused again."""
    error = ssh_failure(HostSpec.parse("pi@192.168.1.20:2222"), UPSTREAM_CHANGED_KEY)
    assert "host key of pi@192.168.1.20:2222 has changed" in error.problem
    assert "'ssh-keygen -R \"[192.168.1.20]:2222\" -f \"/home/me/.ssh/boards_known_hosts\"'" in error.fix


def test_the_printed_ssh_keygen_line_in_single_quotes_names_its_file():
    text = UPSTREAM_CHANGED_KEY.replace(
        "Host key for", "  remove with:\n  ssh-keygen -f '/home/me/.ssh/other_hosts' -R '[192.168.1.20]:2222'\n"
        "Host key for")
    error = ssh_failure(HostSpec.parse("pi@192.168.1.20:2222"), text)
    assert "'ssh-keygen -R \"[192.168.1.20]:2222\" -f \"/home/me/.ssh/other_hosts\"'" in error.fix


def test_a_bad_line_in_an_included_ssh_config_file_is_named_not_the_network(tmp_path):
    """ssh refuses a bad line of a file its config Includes (Debian's /etc/ssh/ssh_config.d/*.conf, a
    ~/.ssh/config.d/ file) before it connects; that was 'the ssh connection failed: check the network, then run
    the same deploy again', which fails the same way every time."""
    included = tmp_path / "boards.conf"
    included.write_text("Host *\n  NoSuchOption yes\n")
    config = tmp_path / "ssh_config"
    config.write_text(f"Include {included}\n")
    transport = SshTransport(HostSpec.parse("pi@127.0.0.1:1"), SshOptions(ssh_config=str(config), multiplex=False))
    with pytest.raises(DeployError) as refused:
        transport.run(["true"], timeout=30)
    assert f"ssh refused its config file {included}, so it did not connect to pi@127.0.0.1:1" \
        in refused.value.problem
    assert "nosuchoption" in refused.value.problem.lower()
    assert f"correct that line of {included}" in refused.value.fix
    assert "check the network" not in refused.value.fix


def test_a_refused_login_says_to_install_the_key_deploy_was_given(ssh_server, tmp_path):
    """With -i KEY the fix said 'ssh-copy-id -p PORT user@board', which installs the default keys (or the
    agent's), not KEY that deploy logs in with (IdentitiesOnly): the next deploy was refused again."""
    from tests._utils.sshd import keygen

    stranger = keygen(tmp_path / "jetson key", "not-authorized")
    options = SshOptions(identity=str(stranger), ssh_config="/dev/null", multiplex=False,
                         options=(f"UserKnownHostsFile={ssh_server.known_hosts}", "GlobalKnownHostsFile=/dev/null"))
    with pytest.raises(DeployError) as refused:
        SshTransport(HostSpec.parse(ssh_server.destination), options).run(["true"], timeout=30)
    assert f"refused the login of user {ssh_server.user}" in refused.value.problem
    assert f"'ssh-copy-id -i '{stranger}' -p {ssh_server.port} {ssh_server.user}@127.0.0.1'" in refused.value.fix


def test_a_refused_login_without_a_key_keeps_the_plain_ssh_copy_id():
    error = ssh_failure(HostSpec.parse("pi@board:2222"), "pi@board: Permission denied (publickey).")
    assert "'ssh-copy-id -p 2222 pi@board'" in error.fix
