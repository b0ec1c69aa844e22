"""A real, unprivileged OpenSSH server on 127.0.0.1 for deploy tests.

Everything lives in a temporary directory: host key, user key, authorized_keys, known_hosts, the
sshd_config and its pid file. The server listens on a free high port on 127.0.0.1 only and is
started with ``-D -e`` (foreground, log to stderr) in the background. The client side of the
tests talks to it through the product's own ssh code path, with options that keep the user's
~/.ssh out of the picture (``-F /dev/null``, a private known_hosts, ``IdentitiesOnly``).

Nothing here contacts any address but 127.0.0.1.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd")


def find_sshd() -> str | None:
    """Path of the sshd binary, or None when openssh-server is not installed."""
    found = shutil.which("sshd")
    if found:
        return found
    return next((c for c in SSHD_CANDIDATES if os.access(c, os.X_OK)), None)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def keygen(path: Path, comment: str) -> Path:
    """A new ed25519 key pair without passphrase at ``path`` (and ``path.pub``)."""
    for stale in (path, path.with_name(path.name + ".pub")):
        stale.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True)
    path.chmod(0o600)
    return path


@dataclass
class SshServer:
    """One sshd on 127.0.0.1:port whose state lives in ``root``."""

    root: Path
    port: int = field(default_factory=free_port)
    user: str = field(default_factory=getpass.getuser)
    process: subprocess.Popen | None = None

    @property
    def host_key(self) -> Path:
        return self.root / "ssh_host_ed25519_key"

    @property
    def user_key(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def log(self) -> Path:
        return self.root / "sshd.log"

    @property
    def destination(self) -> str:
        """``user@127.0.0.1:port`` as ``edgesdk deploy --host`` takes it."""
        return f"{self.user}@127.0.0.1:{self.port}"

    def client_args(self, key: Path | None = None) -> list[str]:
        """``edgesdk deploy`` options that point the ssh client at this server's files only."""
        return ["--ssh-config", "/dev/null", "-i", str(key or self.user_key),
                "--ssh-option", f"UserKnownHostsFile={self.known_hosts}",
                "--ssh-option", "GlobalKnownHostsFile=/dev/null"]

    def prepare(self) -> None:
        """Generate keys, authorized_keys, known_hosts and sshd_config."""
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            # sshd run as root checks its privilege separation directory (systemd-tmpfiles makes it).
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        keygen(self.host_key, "edgesdk-test-host")
        keygen(self.user_key, "edgesdk-test-user")
        shutil.copyfile(self.user_key.with_name(self.user_key.name + ".pub"), self.root / "authorized_keys")
        self.write_known_hosts()
        self.write_config()

    def write_known_hosts(self) -> None:
        public = self.host_key.with_name(self.host_key.name + ".pub").read_text().split()
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {public[0]} {public[1]}\n")

    def write_config(self) -> None:
        lines = [
            f"Port {self.port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {self.host_key}",
            f"PidFile {self.root / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}",
            f"AllowUsers {self.user}",
            "StrictModes no",
            "UsePAM no",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "MaxStartups 100:30:200",
            "LogLevel VERBOSE",
        ]
        config = self.root / "sshd_config"
        # OpenSSH >= 9.8 penalises sources whose sessions die or fail to log in; the tests do both
        # on purpose, so switch that off where the server knows the keyword.
        config.write_text("\n".join([*lines, "PerSourcePenalties no"]) + "\n")
        if subprocess.run([find_sshd() or "sshd", "-t", "-f", str(config)], capture_output=True).returncode != 0:
            config.write_text("\n".join(lines) + "\n")

    def start(self, timeout: float = 10.0) -> SshServer:
        """Start sshd in the background and wait until the port answers."""
        sshd = find_sshd()
        if sshd is None:
            raise RuntimeError("sshd not found; install openssh-server")
        check = subprocess.run([sshd, "-t", "-f", str(self.root / "sshd_config")], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"sshd rejects the test config: {check.stderr.strip()}")
        log = open(self.log, "ab")  # noqa: SIM115 - handed to the child, closed in stop()
        self.process = subprocess.Popen([sshd, "-D", "-e", "-f", str(self.root / "sshd_config")],
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"sshd exited with {self.process.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd did not listen on 127.0.0.1:{self.port} within {timeout}s")

    def stop(self) -> None:
        """Stop the listener (sessions it started end with it: SIGTERM to the listener's group)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        self.process = None

    def new_host_key(self) -> None:
        """Restart with a fresh host key on the same port (known_hosts keeps the old one)."""
        self.stop()
        keygen(self.host_key, "edgesdk-test-host-changed")
        self.start()

    def session_pids(self) -> list[int]:
        """Pids of the sshd processes serving connections (see :func:`sshd_session_pids`)."""
        return sshd_session_pids(self.process.pid) if self.process is not None else []

    def kill_sessions(self) -> int:
        """SIGKILL every sshd process serving a connection, as a board dropping off the network would."""
        return kill_sshd_sessions(self.process.pid) if self.process is not None else 0


def sshd_session_pids(listener: int) -> list[int]:
    """Descendants of the sshd listener whose command name starts with sshd (sshd, sshd-session)."""
    parents: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split around the parentheses
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        parents[int(entry.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), comm)
    found, frontier = [], {listener}
    while frontier:
        children = {pid for pid, (ppid, _comm) in parents.items() if ppid in frontier}
        found += [pid for pid in children if parents[pid][1].startswith("sshd")]
        frontier = children
    return found


def kill_sshd_sessions(listener: int) -> int:
    """SIGKILL the processes :func:`sshd_session_pids` finds; returns how many were killed."""
    killed = 0
    for pid in sshd_session_pids(listener):
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            pass
    return killed


def start_server(root: Path, port: int | None = None) -> SshServer:
    """Prepare and start a server whose files live under ``root``, and check that a login works; on ``port``, or
    a free one (another one where that was taken before sshd could bind it)."""
    server = SshServer(root=root, port=port or free_port())
    server.prepare()
    for attempt in range(3):
        try:
            server.start()
            break
        except RuntimeError as error:
            # The port was free when picked; a connection made since (another pytest-xdist worker's ssh or HTTP
            # client) may have taken it as its local port. Pick another one.
            if "Address already in use" not in str(error) or attempt == 2:
                raise
            server.port = free_port()
            server.write_known_hosts()
            server.write_config()
    login = subprocess.run(["ssh", "-F", "/dev/null", "-i", str(server.user_key), "-o", "IdentitiesOnly=yes",
                            "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={server.known_hosts}",
                            "-o", "StrictHostKeyChecking=yes", "-p", str(server.port), "--",
                            f"{server.user}@127.0.0.1", "true"], capture_output=True, text=True, timeout=30)
    if login.returncode != 0:
        server.stop()
        raise RuntimeError(f"cannot log in to the test sshd as {server.user} ({login.stderr.strip()}); sshd says:\n"
                           f"{server.log.read_text()[-1500:]}\n(a locked account, '!' in /etc/shadow, "
                           "cannot log in with UsePAM no)")
    return server


def _require_openssh() -> None:
    missing = [tool for tool, found in (("sshd", find_sshd()), ("ssh", shutil.which("ssh")),
                                        ("ssh-keygen", shutil.which("ssh-keygen"))) if not found]
    if missing:
        pytest.skip(f"OpenSSH {', '.join(missing)} not installed (.ci/run installs openssh-server and openssh-client)")


def serve(tmp_path_factory, name: str = "sshd"):
    """Generator for a pytest fixture: a started server, stopped afterwards; skips without OpenSSH.

    ``tests/conftest.py``'s ``ssh_server`` wraps it for every module; a test that needs a server of its own (one
    whose host key it changes) wraps it again under another name."""
    _require_openssh()
    server = start_server(tmp_path_factory.mktemp(name))
    try:
        yield server
    finally:
        server.stop()
