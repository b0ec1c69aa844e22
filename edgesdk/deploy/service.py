"""``deploy --service``: a systemd unit on the board that serves ``current`` with ``edgesdk serve``.

The board helper (``board_service.py``) writes and enables the unit, restarts it and waits for its
``/health``; this module builds the serve command line and turns the reply into report lines. The
unit guards the board (``--watch-thermal``): a server runs for hours, which is when boards heat-soak.
A rollback restarts an installed unit, so it serves the release rolled back to; a deploy whose
service does not come up switches back and puts the unit back as it was (``revert_service``), so the
server that ran before runs again.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass

from edgesdk.deploy.board_common import Refused
from edgesdk.deploy.board_service import SERVICE_NAME, systemd_program
from edgesdk.deploy.remote import Board, BoardRefusal
from edgesdk.deploy.transport import DeployError

HEALTH_TIMEOUT_S = 180.0  # loading a bundle takes seconds; a TensorRT engine is built by deploy beforehand
SERVICE_FIX = ("fix what the journal shows (a port in use: pass another --service-port) and deploy again, "
               "which installs and restarts the service")
# After a deploy without --service, whose restart of the unit an earlier --service deploy installed failed: a
# plain deploy again restarts the unit but never rewrites it, so its port changes only with --service.
RESTART_FIX = (f"fix what the unit's journal shows (journalctl -u {SERVICE_NAME}, with --user for a user unit), then "
               "deploy again; where its port is in use, deploy with --service --service-port PORT, which rewrites "
               "the unit")


@dataclass(frozen=True)
class ServiceOptions:
    """Where the deployed server listens."""

    host: str = "127.0.0.1"  # 0.0.0.0 (or ::) serves the network
    port: int = 8080

    def __post_init__(self):
        if not 1 <= self.port <= 65535:
            raise ValueError(f"--service-port must be a TCP port in 1..65535, got {self.port}")
        if _NUMERIC_NAME.fullmatch(self.host) and not _inet_aton_reads(self.host):
            raise ValueError(f"--service-host {self.host!r} is not an IPv4 address (four numbers 0..255 joined by "
                             "dots, such as 192.168.1.30), and no host name is all digits: pass the board's address")
        if not valid_bind_host(self.host):
            raise ValueError(f"--service-host must be an address such as 127.0.0.1 or 0.0.0.0 (an IP address, [::] "
                             f"style brackets allowed around an IPv6 one only, or a host name), got {self.host!r}: "
                             "pass the address alone, without a scheme or a port (the port goes to --service-port), "
                             "and an IPv4 address without brackets")

    @property
    def health_url(self) -> str:
        """Where the board itself asks: the loopback address for a wildcard bind, however it is written (``0.0.0.0``
        or ``0``, which inet_aton(3) reads as 0.0.0.0; ``::``, ``[::]`` or ``::0``)."""
        host = self.host.strip("[]")
        if _is_wildcard(host):
            host = "::1" if ":" in host else "127.0.0.1"
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.port}/health"


# A host name as getaddrinfo(3) takes it: dot-separated labels of letters, digits, '-' and '_' (RFC 1123 names,
# and the '_' some LANs use), at most 253 characters.
_HOST_NAME = re.compile(r"(?=.{1,253}\.?$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
                        r"(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?")


def valid_bind_host(host: str) -> bool:
    """Whether ``host`` is what ``edgesdk serve --host`` (like llama-server's ``--host``) binds to: an IPv4 or IPv6
    address (an IPv6 one in brackets too, as ``[::]``; not ``[127.0.0.1]``), or a host name. Not ``host:port`` nor
    a URL, nor a name ending in ``.sock`` (a unix socket's path to llama-server, which serve refuses: TCP only), nor
    digits and dots that are no IPv4 address (``192.168.1.300``: getaddrinfo(3) reads such a name as inet_aton(3)
    does, ``127.1`` included, and finds nothing else for it): the server would refuse it only once the unit starts, after the deploy switched
    ``current``, which then has to be switched back."""
    if not host or host.endswith(".sock"):
        return False
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        pass
    else:  # brackets hold an IPv6 address only (RFC 3986 IP-literal): serve binds "[127.0.0.1]" as a name, and fails
        return bare == host or address.version == 6
    if bare != host or _HOST_NAME.fullmatch(host) is None:
        return False
    return _NUMERIC_NAME.fullmatch(host) is None or _inet_aton_reads(host)


_NUMERIC_NAME = re.compile(r"[0-9.]+")  # no top-level domain is all digits (RFC 3696 §2): an address, or nothing


def _is_wildcard(host: str) -> bool:
    """Whether ``host`` (no brackets) is the IPv4 or the IPv6 wildcard address, in any spelling serve binds."""
    if _NUMERIC_NAME.fullmatch(host):  # digits and dots: as getaddrinfo(3) reads them (inet_aton: "0" is 0.0.0.0)
        return _inet_aton_reads(host) and socket.inet_aton(host) == bytes(4)
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def _inet_aton_reads(host: str) -> bool:
    """Whether inet_aton(3), which getaddrinfo(3) applies to a numeric host, reads ``host`` as an IPv4 address."""
    try:
        socket.inet_aton(host)
    except OSError:
        return False
    return True


def serve_argv(edgesdk: list[str], current: str, service: ServiceOptions, ignore_target: bool) -> list[str]:
    """The unit's command line: ``edgesdk serve <root>/current`` guarded, on the chosen address."""
    return [*edgesdk, "serve", current, "--host", service.host, "--port", str(service.port), "--watch-thermal",
            *(["--ignore-target"] if ignore_target else [])]


def check_service(board: Board, service: ServiceOptions, argv: list[str] | None = None) -> str:
    """Refuse --service before anything changes where the board has no systemd that answers, or where
    something other than the unit already answers on the service's address.

    ``argv`` is the unit's command line (:func:`serve_argv`, as the service step will install it): a program
    that systemd refuses in ExecStart (a quote, an apostrophe, a backslash or a control character in its path,
    or a relative path; systemd.service(5) "Command lines", src/core/load-fragment.c config_parse_exec) is
    refused here, by the same check the board's install applies (``board_service.systemd_program``), instead of
    after ``current`` was switched, when the failed install has to switch it back."""
    if argv:
        try:
            systemd_program(argv[0])
        except Refused as exc:
            raise DeployError(exc.problem, exc.fix) from None
    reply = board.call("service", {"action": "check", "argv": list(argv or []), "health_url": service.health_url,
                                   "timeout_s": 0, "fix": ""})
    return f"systemd answers; the {reply['scope']} unit goes to {reply['unit']}" + (
        " (installed already: it is restarted)" if reply["installed"] else "")


def install_service(board: Board, argv: list[str], service: ServiceOptions, token: str) -> tuple[dict, list[str]]:
    """Write, enable and (re)start the unit; wait for /health. ``token`` names this install's saved state, which
    ``revert_service`` puts back. Returns the reply and lines to report."""
    reply = board.call("service", {"action": "install", "argv": argv, "health_url": service.health_url,
                                   "timeout_s": HEALTH_TIMEOUT_S, "token": token,
                                   "fix": SERVICE_FIX},
                       timeout=HEALTH_TIMEOUT_S + 300)
    user = " --user" if reply["scope"] == "user" else ""
    # a system unit is chosen only when deploying as root (board_service), so its commands need no sudo, as the
    # journalctl and disable line below says them
    systemctl = f"systemctl{user}"
    lines = [f"{reply['scope']} unit {reply['unit']} {'written and ' if reply['changed'] else ''}enabled; "
             f"serving on {served_url(board, service)}" + _on_backend(reply),
             *reply["notes"]]
    if not _is_loopback(service.host.strip("[]")) and reply.get("api_key") is False:
        lines.append(f"warning: no API key: anyone who can reach port {service.port} of the board can use the "
                     f"server; to require one, run '{systemctl} edit {SERVICE_NAME}' on the board, add the lines "
                     f"[Service] and Environment={API_KEY_ENV}=<a long random secret>, then '{systemctl} restart "
                     f"{SERVICE_NAME}' (redeploys keep it); clients send 'Authorization: Bearer <the secret>'")
    lines += [f"its log on the board: journalctl{user} -u {SERVICE_NAME} -f; to stop it and keep it stopped: "
              f"systemctl{user} disable --now {SERVICE_NAME}",
              # the unit file is rewritten by each deploy --service; a drop-in (<unit>.d/override.conf) is not
              f"settings that serve reads from the environment (LLAMA_ARG_* and EDGESDK_*, e.g. "
              f"Environment=LLAMA_ARG_ENDPOINT_METRICS=1 for /metrics) go in a drop-in, which redeploys keep: "
              f"{systemctl} edit {SERVICE_NAME}, then {systemctl} restart {SERVICE_NAME}"]
    return reply, lines


def _on_backend(reply: dict) -> str:
    """", on backend NAME": the backend the server's /health names (the board's reply carries it), or "" where it
    names none."""
    return f", on backend {reply['backend']}" if reply.get("backend") else ""


API_KEY_ENV = "EDGESDK_API_KEY"  # what edgesdk serve's --api-key reads from the environment (cli_serve.py)


def served_url(board: Board, service: ServiceOptions) -> str:
    """Where clients reach the deployed server's OpenAI routes: on a wildcard bind (0.0.0.0, ::) the board by the
    host name ssh reaches it at (:func:`ssh_hostname`: an alias of ~/.ssh/config, ``Host orin`` with ``HostName
    192.168.1.50``, is a name only this machine's ssh knows, so a URL naming it reaches nothing), not the loopback
    address the board asks its own /health on (which no other machine reaches); a deploy ``--to`` a local directory
    says the loopback, on every address of this machine. Any other bind: its own address."""
    host = service.host.strip("[]")
    spec = getattr(board.transport, "spec", None)
    if not _is_wildcard(host):
        return f"{service.health_url.removesuffix('/health')}/v1"
    if spec is None:
        return f"{service.health_url.removesuffix('/health')}/v1 (it listens on every address of this machine)"
    reached = ssh_hostname(board.transport)
    name = reached.replace("%", "%25")  # an IPv6 zone (fe80::1%eth0) in a URL (RFC 6874)
    return f"http://{'[' + name + ']' if ':' in reached else name}:{service.port}/v1"


def ssh_hostname(transport) -> str:
    """The host name or address ssh connects to for this transport's ``--host``: the ``hostname`` that ``ssh -G``
    prints (:meth:`edgesdk.deploy.transport.SshTransport.ssh_config`: the configuration after evaluating Host and
    Match blocks, with the client, ssh config and options the transport connects with). ``--host`` itself where
    ``ssh -G`` fails or prints none (an ssh command that does not take -G)."""
    return transport.ssh_config().get("hostname") or transport.spec.host


def _is_loopback(host: str) -> bool:
    """Whether ``host`` (no brackets) binds the loopback only: ``localhost``, 127.0.0.0/8 however inet_aton(3) spells
    it (``127.1``), ``::1``. Any other name is taken for one other machines may reach."""
    if host.lower() == "localhost" or host.lower().endswith(".localhost"):
        return True
    if _NUMERIC_NAME.fullmatch(host):
        return _inet_aton_reads(host) and socket.inet_aton(host)[0] == 127
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def restart_service(board: Board) -> str | None:
    """Restart the unit deploy installed (the board's ``service.json`` names it) after a rollback; None
    where there is none. A failure says that current was rolled back all the same."""
    try:
        reply = board.call("service", {"action": "restart", "argv": [], "timeout_s": HEALTH_TIMEOUT_S,
                                       "during": "rollback",
                                       "fix": "fix what the journal shows, then restart the unit (systemctl "
                                              "restart edgesdk-serve, with --user for a user unit)"},
                           timeout=HEALTH_TIMEOUT_S + 300)
    except BoardRefusal as exc:
        raise DeployError(f"current was rolled back, but the service is not serving it: {exc.problem}",
                          exc.fix) from exc
    except DeployError as exc:  # no answer: ssh's own fix would have the rollback run again, switching back
        raise DeployError(f"current was rolled back, but the board's reply to restarting the service that "
                          f"deploy --service installed (if any) did not come back: {exc.problem}",
                          "do not run the rollback again: current is switched, and the same --rollback would "
                          "switch it back; once the board answers, restart the unit if there is one "
                          "(systemctl restart edgesdk-serve, with --user for a user unit)") from exc
    if not reply["installed"]:
        return None
    if not reply["restarted"]:
        return f"{reply['scope']} unit {reply['unit']} not restarted: {reply['why']}"
    return "\n".join([f"{reply['scope']} unit {reply['unit']} restarted; it serves the release rolled back to"
                      + _on_backend(reply), *reply.get("notes", [])])


def restart_after_switch(board: Board, unless_up: bool = False) -> str | None:
    """After a deploy without ``--service`` switched ``current``: restart the unit an earlier ``deploy --service``
    into this root installed (the board's ``service.json`` names it), so its server loads the new release
    instead of serving the old one from memory. ``unless_up`` (a deploy that switched nothing): a unit that is
    active and answers on its /health is left running, and one that is not is restarted the same way. None where
    there is none; a server that does not come up is a :class:`BoardRefusal` with its journal."""
    reply = board.call("service", {"action": "restart", "argv": [], "timeout_s": HEALTH_TIMEOUT_S, "during": "deploy",
                                   "fix": RESTART_FIX, "unless_up": unless_up}, timeout=HEALTH_TIMEOUT_S + 300)
    if not reply["installed"]:
        return None
    if reply.get("up"):
        return (f"{reply['scope']} unit {reply['unit']} (from an earlier --service deploy) is active and answers on its "
                "/health: left running, as nothing was switched")
    if not reply["restarted"]:
        return f"{reply['scope']} unit {reply['unit']} not restarted: {reply['why']}"
    return "\n".join([f"{reply['scope']} unit {reply['unit']} (from an earlier --service deploy) restarted; it serves "
                      "current" + _on_backend(reply), *reply.get("notes", [])])


def revert_service(board: Board, token: str) -> str | None:
    """After a deploy whose service did not come up, and once ``current`` is switched back: put the unit
    back as it was before the install with ``token`` and restart the server that ran before (a unit this
    deploy wrote where there was none is removed). Returns a line to report, or None where the install
    changed nothing."""
    reply = board.call("service", {"action": "revert", "argv": [], "timeout_s": HEALTH_TIMEOUT_S, "token": token,
                                   "fix": "fix what the journal shows, then restart the unit (systemctl restart "
                                          "edgesdk-serve, with --user for a user unit)"},
                       timeout=HEALTH_TIMEOUT_S + 300)
    if not reply["reverted"]:
        return None
    return {"restarted": f"{reply['scope']} unit {reply['unit']} put back as it was and restarted: it serves "
                         "current again",
            "stopped": f"{reply['scope']} unit {reply['unit']} put back as it was (stopped, as it was before)",
            "removed": f"{reply['scope']} unit {reply['unit']} that this deploy wrote stopped, disabled and "
                       "removed"}[reply["outcome"]]


def restart_after_lost_install(board: Board) -> str | None:
    """After an install whose reply was lost and had nothing to put back (it may have run to the end, the unit
    restarted on the release switched away from), once ``current`` is switched back: restart the unit this
    root installed so it serves current. Returns a line to report, or None where there is no such unit."""
    reply = board.call("service", {"action": "restart", "argv": [], "timeout_s": HEALTH_TIMEOUT_S, "during": "deploy",
                                   "fix": "fix what the journal shows, then restart the unit (systemctl restart "
                                          "edgesdk-serve, with --user for a user unit)"},
                       timeout=HEALTH_TIMEOUT_S + 300)
    if not reply["installed"]:
        return None
    if not reply["restarted"]:
        return f"{reply['scope']} unit {reply['unit']} not restarted: {reply['why']}"
    return f"{reply['scope']} unit {reply['unit']} restarted: it serves current again"
