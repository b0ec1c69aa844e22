"""Deploy's service report and smoke-test reading: the URL a wildcard bind prints names the board as ssh reaches it,
a backend refusal spanning lines keeps the fallback warning, and --service-host/--service-port beside --remove,
--status or --rollback are refused with the one fix that works."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.deploy.remote import Board
from edgesdk.deploy.service import ServiceOptions, served_url
from edgesdk.deploy.session import backend_used
from edgesdk.deploy.transport import HostSpec, SshOptions, SshTransport


@pytest.mark.skipif(shutil.which("ssh") is None, reason="the OpenSSH client is not installed")
def test_a_wildcard_bind_names_the_host_an_ssh_config_alias_reaches(tmp_path):
    """``Host orin`` / ``HostName 192.168.1.50`` in the ssh config: "orin" is a name only this machine's ssh knows,
    so http://orin:8080/v1 reached nothing from any client; the URL names what ``ssh -G`` resolves (no connection)."""
    config = tmp_path / "ssh_config"
    config.write_text("Host orin\n    HostName 192.168.1.50\n    User nvidia\n")
    transport = SshTransport(HostSpec.parse("orin"), SshOptions(ssh_config=str(config), multiplex=False))
    board = Board(transport=transport, python="python3", root="~/edgesdk")
    assert served_url(board, ServiceOptions(host="0.0.0.0", port=8080)) == "http://192.168.1.50:8080/v1"
    # a name the config does not alias is the board's own, brackets for an IPv6 address
    plain = SshTransport(HostSpec.parse("pi@[fe80::1%eth0]"), SshOptions(ssh_config=str(config), multiplex=False))
    assert served_url(Board(plain, "python3", "~/edgesdk"), ServiceOptions(host="::", port=9000)) == \
        "http://[fe80::1%25eth0]:9000/v1"


def test_a_refusal_spanning_lines_keeps_the_fallback_warning():
    """The scan of --stats' notes stopped at the continuation line of a refusal, so the backends skipped read as none
    and the deploy gave no fallback warning."""
    stderr = ("edgesdk: tensorrt: no engine\nedgesdk: ort-cuda: libcudart.so.12: cannot open\n  more detail\n"
              "edgesdk: ort-cpu: used\n")
    assert backend_used(stderr) == ("ort-cpu", ["tensorrt: no engine",
                                                "ort-cuda: libcudart.so.12: cannot open more detail"])
    # the line a run without --stats prints, its reasons spanning lines too
    assert backend_used("edgesdk: backend ort-cpu (ort-cuda: libcudart.so.12:\n  cannot open)\n") == \
        ("ort-cpu", ["ort-cuda: libcudart.so.12: cannot open"])
    # an edgesdk line that is no backend note still ends the block
    assert backend_used("edgesdk: warning: x\nedgesdk: ort-cpu: used\n") == ("ort-cpu", [])


@pytest.mark.parametrize("mode", [["--remove", "abc"], ["--status"], ["--rollback"]])
def test_service_options_beside_a_mode_that_refuses_service_say_only_drop_it(mode, tmp_path):
    """"add --service or drop it", then with --service "drop --service": adding it was never the fix there."""
    result = CliRunner().invoke(main, ["deploy", *mode, "--service-port", "9000", "--to", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "works only with --service; drop it" in result.output
    assert "add --service" not in result.output
