"""Deploy pieces: the service's bind address."""

from __future__ import annotations

import socket
import sys

import pytest

from tests.unit.test_deploy48 import board  # noqa: F401 - the fixture: a deploy root with the stand-in systemctl


@pytest.mark.parametrize("host", ["[127.0.0.1]", "[0.0.0.0]", "[192.168.1.30]"])
def test_an_ipv4_address_in_brackets_is_refused_as_a_service_host(host):
    """Brackets hold an IPv6 address only (RFC 3986 IP-literal), and serve binds a host without ':' as an IPv4
    name: '[127.0.0.1]' does not resolve. --service-host took it, so the unit's server failed only once it started,
    after current was switched (which the deploy then had to switch back)."""
    from edgesdk.deploy.service import ServiceOptions, valid_bind_host

    with pytest.raises(socket.gaierror):  # what the unit's server would do with it
        socket.getaddrinfo(host, 0, socket.AF_INET, socket.SOCK_STREAM)
    assert not valid_bind_host(host)
    with pytest.raises(ValueError, match="--service-host must be an address") as refused:
        ServiceOptions(host=host)
    assert repr(host) in str(refused.value)
    assert "an IPv4 address without brackets" in str(refused.value)


@pytest.mark.parametrize("host", ["[::]", "[::1]", "127.0.0.1", "::"])
def test_bracketed_ipv6_and_bare_addresses_stay_service_hosts(host):
    from edgesdk.deploy.service import ServiceOptions, valid_bind_host

    assert valid_bind_host(host)
    assert ServiceOptions(host=host).health_url.endswith(":8080/health")


def test_a_smoke_test_that_generates_no_text_says_so_not_only_exit_0(tmp_path):
    """A run that exits 0 with nothing but whitespace on stdout (the model ended its answer at once) failed the smoke
    test as '(exit 0)' with the last stderr lines under it, a warning here, as if that were why; the fix then said
    to fix 'the problem shown above'. The refusal says the run generated no text, and what it printed."""
    from edgesdk.deploy.remote import Board
    from edgesdk.deploy.report import Reporter
    from edgesdk.deploy.session import DeployOptions, smoke_test
    from edgesdk.deploy.transport import DeployError, LocalTransport

    root = str(tmp_path)
    local = Board(LocalTransport(root), sys.executable, root)
    # a board edgesdk whose run exits 0 having printed a blank line, and a warning on stderr
    quiet = [sys.executable, "-c", "import sys; print(' '); print('warning: no thermal zone', file=sys.stderr)"]
    with pytest.raises(DeployError) as failed:
        smoke_test(local, quiet, f"{root}/releases/b", DeployOptions(to=tmp_path), Reporter(1, write=lambda line: None))
    head = failed.value.problem.splitlines()[0]
    assert head.startswith(f"the smoke test failed on local directory {root} (exit 0, but it generated no text: "
                           "its output was ' \\n'): ")
    assert "warning: no thermal zone" in failed.value.problem  # still shown, under the reason


@pytest.mark.parametrize("host", ["::", "[::]"])
def test_the_service_check_refuses_an_ipv4_loopback_server_for_an_ipv6_wildcard_bind(board, host):  # noqa: F811
    """--service-host :: binds IPv4 too on Linux (bindv6only 0), so a server on 127.0.0.1:PORT (llama-server's
    default address) makes the unit's bind fail with EADDRINUSE. The check asked only ::1, the health URL, where
    nothing answers, and let the deploy go on to switch current before the unit failed."""
    from pathlib import Path

    from edgesdk.deploy import service
    from edgesdk.deploy.transport import DeployError
    from tests.unit.test_deploy48 import free_port, listening_only

    port = free_port()
    options = service.ServiceOptions(host=host, port=port)
    argv = service.serve_argv([sys.executable, "-m", "edgesdk"], board[0].path("current"), options, False)
    with listening_only(port):
        if Path("/proc/sys/net/ipv6/bindv6only").read_text().strip() == "0":  # what the server would meet
            with socket.socket(socket.AF_INET6) as probe, pytest.raises(OSError, match="in use"):
                probe.bind(("::", port))
        with pytest.raises(DeployError, match=rf"something other than the (system|user) unit edgesdk-serve already "
                                              rf"answers on http://127\.0\.0\.1:{port}/health"):
            service.check_service(board[0], options, argv)
    # nothing on the port: the check passes
    assert service.check_service(board[0], options, argv).startswith("systemd answers")
