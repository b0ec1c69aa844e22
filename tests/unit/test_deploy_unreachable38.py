"""A board whose ssh port nothing listens on: the error names the port to check, whole sentences both ways.

Real ssh client, real refused TCP connection on 127.0.0.1; no sshd needed.
"""

from __future__ import annotations

import shutil

import pytest

from tests._utils.deploy import edgesdk
from tests._utils.sshd import free_port

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None, reason="OpenSSH client not installed")


def test_a_closed_port_given_in_host_is_named():
    port = free_port()
    refused = edgesdk("deploy", "--status", "--host", f"pi@127.0.0.1:{port}", "--ssh-config", "/dev/null",
                      timeout=60)
    assert refused.returncode == 8
    assert "Traceback" not in refused.stderr
    assert f"cannot reach pi@127.0.0.1:{port}: nothing accepts ssh connections on that port" in refused.stderr
    assert refused.stderr.rstrip().endswith(f"('sudo systemctl status ssh' on the board) and listens on port {port}")


def test_a_closed_port_from_the_ssh_config_says_where_the_port_comes_from(tmp_path):
    """--host without a port: the port is ssh's (22 or the config's), and the fix says so instead of ending
    on 'and the port'."""
    config = tmp_path / "ssh_config"
    config.write_text(f"Host myboard\n  HostName 127.0.0.1\n  Port {free_port()}\n")
    refused = edgesdk("deploy", "--status", "--host", "pi@myboard", "--ssh-config", config, timeout=60)
    assert refused.returncode == 8
    assert "nothing accepts ssh connections on that port" in refused.stderr
    fix = refused.stderr.split("fix: ", 1)[1]
    assert fix.rstrip().endswith("listens on the port ssh connects to (22, or the Port your ssh config gives the "
                                 "board; --host user@board:PORT picks another)")
