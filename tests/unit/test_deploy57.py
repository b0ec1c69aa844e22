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


def bindv6only() -> str:
    """net.ipv6.bindv6only here; skips where there is no IPv6 to bind :: on (no such file, or no IPv6 socket)."""
    from pathlib import Path

    try:
        value = Path("/proc/sys/net/ipv6/bindv6only").read_text().strip()
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::", 0))
    except OSError as exc:
        pytest.skip(f"no IPv6 bind here ({exc})")
    return value


@pytest.mark.parametrize("host", ["::", "[::]"])
def test_the_service_check_refuses_an_ipv4_loopback_server_for_an_ipv6_wildcard_bind(board, host):  # noqa: F811
    """--service-host :: binds IPv4 too on Linux (bindv6only 0), so a server on 127.0.0.1:PORT (llama-server's
    default address) makes the unit's bind fail with EADDRINUSE. The check asked only ::1, the health URL, where
    nothing answers, and let the deploy go on to switch current before the unit failed. With bindv6only 1 the
    :: bind takes no IPv4 port, and the check lets it be."""
    from edgesdk.deploy import service
    from edgesdk.deploy.transport import DeployError
    from tests.unit.test_deploy48 import free_port, listening_only

    v6only = bindv6only()
    port = free_port()
    options = service.ServiceOptions(host=host, port=port)
    argv = service.serve_argv([sys.executable, "-m", "edgesdk"], board[0].path("current"), options, False)
    with listening_only(port):
        with socket.socket(socket.AF_INET6) as probe:  # what the server would meet
            if v6only == "0":
                with pytest.raises(OSError, match="in use"):
                    probe.bind(("::", port))
            else:
                probe.bind(("::", port))
        if v6only == "0":
            with pytest.raises(DeployError, match=rf"something other than the (system|user) unit edgesdk-serve "
                                                  rf"already answers on http://127\.0\.0\.1:{port}/health") as refused:
                service.check_service(board[0], options, argv)
            assert "its bind on :: takes the IPv4 port" in refused.value.problem
        else:
            assert service.check_service(board[0], options, argv).startswith("systemd answers")
    # nothing on the port: the check passes
    assert service.check_service(board[0], options, argv).startswith("systemd answers")


@pytest.mark.parametrize(("sysctl", "ipv4"), [("0\n", True), ("1\n", False), (None, True)])
def test_an_ipv6_wildcard_bind_needs_the_ipv4_port_only_where_bindv6only_is_0(tmp_path, monkeypatch, sysctl, ipv4):
    """serve sets no IPV6_V6ONLY, so net.ipv6.bindv6only decides whether its :: bind takes the IPv4 port: the check
    of 127.0.0.1 refused a server there with bindv6only 1 too, where the unit's server would have listened beside
    it. No such file (a kernel without IPv6): 0."""
    from edgesdk.deploy import board_service

    path = tmp_path / "bindv6only"
    if sysctl is not None:
        path.write_text(sysctl)
    monkeypatch.setattr(board_service, "BINDV6ONLY", str(path))
    url = "http://[::1]:8080/health"
    argv = ["edgesdk", "serve", "current", "--host", "::", "--port", "8080"]
    assert board_service.bind_conflict_urls(url, argv) == [url, *(["http://127.0.0.1:8080/health"] if ipv4 else [])]
    assert board_service.bind_conflict_urls(url, ["serve", "--host", "::1"]) == [url]


def test_the_ipv4_check_of_a_wildcard_bind_passes_the_roots_own_running_unit(tmp_path, monkeypatch):
    """The unit this root installed for --host :: holds 127.0.0.1:PORT itself. Whether a listener is the unit was
    asked of each URL, and the record (which holds the ::1 health URL) matched only the first: where the unit file
    did not say where it listens, the unit's own IPv4 port was refused as another program's."""
    from edgesdk.deploy import board_service
    from edgesdk.deploy.board_common import Refused
    from tests.unit.test_deploy48 import free_port, listening_only

    (tmp_path / "bindv6only").write_text("0\n")
    monkeypatch.setattr(board_service, "BINDV6ONLY", str(tmp_path / "bindv6only"), raising=False)
    port = free_port()
    url = f"http://[::1]:{port}/health"
    argv = ["edgesdk", "serve", "current", "--host", "::", "--port", str(port)]
    record = {"scope": "user", "unit": str(tmp_path / "edgesdk-serve.service"), "health_url": url}  # no unit file
    with listening_only(port):  # the unit's IPv4 side
        monkeypatch.setattr(board_service, "systemctl", lambda *args, **kwargs: (0, "active\n"))
        board_service.refuse_a_foreign_server("user", url, record, "fix", argv)
        monkeypatch.setattr(board_service, "systemctl", lambda *args, **kwargs: (3, "inactive\n"))
        with pytest.raises(Refused, match=rf"already answers on http://127\.0\.0\.1:{port}/health"):
            board_service.refuse_a_foreign_server("user", url, record, "fix", argv)  # not the unit: refused


@pytest.mark.parametrize(("running", "refused"), [("::1", True), ("::", False), ("0.0.0.0", False)])
def test_the_ipv4_check_of_a_wildcard_bind_asks_the_unit_file_whether_the_unit_holds_127_0_0_1(
        tmp_path, monkeypatch, running, refused):
    """--host ::1 and --host :: have one health URL (::1), so the record of a running unit on ::1 matched the new
    :: bind's health URL, and the IPv4 check took a foreign server on 127.0.0.1:PORT for that unit, which holds no
    IPv4 port: the deploy switched current and the new unit's bind then failed. The unit file says where the
    running unit listens: on :: or 0.0.0.0 it holds 127.0.0.1:PORT itself, on ::1 it does not."""
    from edgesdk.deploy import board_service
    from edgesdk.deploy.board_common import Refused
    from edgesdk.deploy.service import ServiceOptions
    from tests.unit.test_deploy48 import free_port, listening_only

    (tmp_path / "bindv6only").write_text("0\n")
    monkeypatch.setattr(board_service, "BINDV6ONLY", str(tmp_path / "bindv6only"), raising=False)
    monkeypatch.setattr(board_service, "systemctl", lambda *args, **kwargs: (0, "active\n"))
    port = free_port()
    url = f"http://[::1]:{port}/health"
    unit = tmp_path / "edgesdk-serve.service"
    unit.write_text(f'[Service]\nExecStart="edgesdk" "serve" "current" "--host" "{running}" "--port" "{port}"\n')
    running_url = ServiceOptions(host=running, port=port).health_url  # ::1 for ::1 and ::, 127.0.0.1 for 0.0.0.0
    record = {"scope": "user", "unit": str(unit), "health_url": running_url}  # the running unit's own record
    argv = ["edgesdk", "serve", "current", "--host", "::", "--port", str(port)]  # the redeploy's bind
    with listening_only(port):  # a server on 127.0.0.1:PORT: the unit's own only where it binds IPv4
        if refused:
            with pytest.raises(Refused, match=rf"already answers on http://127\.0\.0\.1:{port}/health"):
                board_service.refuse_a_foreign_server("user", url, record, "fix", argv)
        else:
            board_service.refuse_a_foreign_server("user", url, record, "fix", argv)


def test_a_smoke_test_that_exits_0_with_no_text_says_what_to_do_about_that(tmp_path):
    """The exit-0 refusal said to fix 'the problem shown above', and the stderr shown (if any) is not why; with
    none it printed '(no output)' right under the output it had just quoted."""
    from edgesdk.deploy.remote import Board
    from edgesdk.deploy.report import Reporter
    from edgesdk.deploy.session import DeployOptions, smoke_test
    from edgesdk.deploy.transport import DeployError, LocalTransport

    root = str(tmp_path)
    local = Board(LocalTransport(root), sys.executable, root)
    options, report = DeployOptions(to=tmp_path), Reporter(1, write=lambda line: None)
    blank = [sys.executable, "-c", "print()"]
    with pytest.raises(DeployError) as failed:
        smoke_test(local, blank, f"{root}/releases/b", options, report)
    assert failed.value.problem.splitlines()[1:] == ["    (nothing on stderr)"]
    assert "problem shown above" not in failed.value.fix
    assert "run the command quoted above on the board and see why the model answers nothing" in failed.value.fix
    assert failed.value.fix.startswith("the board keeps its current release; ")
    failing = [sys.executable, "-c", "import sys; sys.exit(3)"]
    with pytest.raises(DeployError) as failed:
        smoke_test(local, failing, f"{root}/releases/b", options, report, "stays; {what} and roll back again")
    assert failed.value.problem.splitlines()[1:] == ["    (no output)"]
    assert failed.value.fix == "stays; fix the problem shown above and roll back again"
