"""How deploy reaches a board: the system OpenSSH client, or this machine for ``--to DIR``.

The ssh client is the user's own ``ssh`` (``$EDGESDK_SSH`` or ``--ssh-command`` replace it, like
``GIT_SSH_COMMAND``), so ``~/.ssh/config``, the agent, ``known_hosts`` and ``ProxyJump`` work as
they do for ``ssh`` itself. Deploy adds only what it needs: strict host key checking (a new key is
accepted only with ``accept_new_host_key``; a changed key never), batch mode (no prompt can hang a
deploy), keep-alives, and one multiplexed connection per deploy (``ControlMaster``) so its dozen
remote commands pay for one handshake. Options the user passes come first and therefore win (ssh
keeps the first value it reads for an option). A ``ConnectTimeout`` or ``ServerAliveInterval`` that the
user's ssh configuration gives the board wins too: deploy's own values are only defaults (``ssh -G``
says what the configuration sets; a ``-o`` would override it, as command-line options win over
ssh_config(5) files).

Remote commands are argument lists. ssh hands the remote login shell one string, so every
argument is quoted with :func:`shlex.quote`; no path, name or text reaches a shell unquoted.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from edgesdk.errors import EdgeSDKError


class DeployError(EdgeSDKError):
    """A deploy, rollback or status request failed; the board keeps (or got back) its previous release."""

    exit_code = 8


# The user may hold '@' (a directory user such as alice@corp.example): ssh splits user from host at the last
# '@' (ssh.c: strrchr(p, '@')).
_HOST_RE = re.compile(r"^(?:(?P<user>[^@\s/]+(?:@[^@\s/]+)*)@)?"
                      r"(?:\[(?P<v6>[0-9A-Fa-f:.%\w-]+)\]|(?P<name>[^@\s:/\[\]]+))(?::(?P<port>\d{1,5}))?$")


# What OpenSSH >= 9.6 refuses in a user or host name from the command line (CVE-2023-51385).
_SHELL_CHARS = "'`\"$\\;&<>|(){}"


@dataclass(frozen=True)
class HostSpec:
    """``[user@]host[:port]`` as given to ``--host`` (host may be an alias from ~/.ssh/config)."""

    host: str
    user: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> HostSpec:
        match = _HOST_RE.match(text or "")
        if match is None or text.startswith("-") or (match["v6"] or match["name"] or "").startswith("-"):
            bare_v6 = re.fullmatch(r"[0-9A-Fa-f]*:[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*(?:%\S+)?",
                                   (text or "").rpartition("@")[2]) is not None
            raise DeployError(f"--host {text!r} is not of the form user@board[:port]"
                              + (" (an IPv6 address without brackets)" if bare_v6 else ""),
                              ("put the IPv6 address in brackets, e.g. --host pi@[fe80::1%eth0] or "
                               "--host pi@[fe80::1%eth0]:2222" if bare_v6 else
                               "pass e.g. --host nvidia@orin.local, --host pi@192.168.1.20:2222, or an alias "
                               "from ~/.ssh/config"))
        shell = sorted({c for c in (match["user"] or "") + (match["name"] or "") if c in _SHELL_CHARS or c < " "})
        if shell:
            raise DeployError(f"--host {text!r}: {' '.join(map(repr, shell))} cannot be part of a user or board "
                              "name (ssh would hand it to the shell of a ProxyCommand or Match exec; OpenSSH 9.6 "
                              "refuses it)",
                              "pass the board's user name and host name or address, e.g. --host pi@192.168.1.20")
        port = int(match["port"]) if match["port"] else None
        if port is not None and not 0 < port < 65536:
            raise DeployError(f"--host {text!r}: port {port} is outside 1-65535", "pass a valid ssh port")
        return cls(host=match["v6"] or match["name"], user=match["user"], port=port)

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host

    def __str__(self) -> str:
        """As ``--host`` takes it: an IPv6 address in brackets (``pi@[fe80::1]:2222``)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return (f"{self.user}@" if self.user else "") + host + (f":{self.port}" if self.port else "")


def remote_command(argv: list[str]) -> str:
    """The one string ssh sends to the remote shell: every argument quoted."""
    return " ".join(shlex.quote(str(arg)) for arg in argv)


class Transport:
    """Runs argument lists on the board. Subclasses: :class:`SshTransport`, :class:`LocalTransport`."""

    label: str = "board"
    remote = False  # True over ssh: a status -N is then the ssh client's own, 128 + N the board's (signal_note)

    def command(self, argv: list[str]) -> list[str]:  # pragma: no cover - interface
        raise NotImplementedError

    def popen(self, argv: list[str]) -> subprocess.Popen:
        """Start ``argv`` on the board with pipes for stdin, stdout and stderr."""
        return subprocess.Popen(self.command(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)

    def run(self, argv: list[str], input: bytes | None = None, timeout: float | None = None,
            what: str | None = None, hold_stdin: bool = False) -> subprocess.CompletedProcess:
        """Run ``argv`` on the board to completion, raising :class:`DeployError` for connection problems
        and for a command still running after ``timeout`` seconds (``what`` names it in the message).
        ``hold_stdin`` (over ssh, for a command that reads exactly ``len(input)`` bytes): stdin stays open after
        ``input`` until the command ends, so that its end tells the board this deploy stopped."""
        try:
            proc = subprocess.run(self.command(argv), input=input if input is not None else b"",
                                  capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise _timed_out(what or argv[0], self.label, timeout) from exc
        self.check_connection(proc.returncode, proc.stderr.decode("utf-8", "replace"))
        return with_signal_note(proc, remote=self.remote)

    def check_connection(self, returncode: int, stderr: str, during: str = "") -> None:
        """Raise DeployError when a command failed because the board could not be reached."""

    def close(self) -> None:
        """Release what the transport holds (the ssh master connection)."""


class TimedOut(DeployError):
    """A board command ran past its deadline and was stopped (``what`` and ``seconds`` say which and when)."""

    def __init__(self, what: str, label: str, seconds: float, fix: str | None = None):
        self.what, self.seconds = what, seconds
        shown = f"{seconds:.0f}" if seconds >= 10 else f"{seconds:g}"
        super().__init__(f"{what} on {label} did not finish within {shown} s (stopped)",
                         fix or "check the board (load, memory), then run it again")


def _timed_out(what: str, label: str, timeout: float | None) -> DeployError:
    return TimedOut(what, label, timeout)


# The board enforces a command's deadline itself: when ssh gives up, the remote command would otherwise
# run on (a smoke test, an engine build, a helper holding the deploy lock). coreutils' and busybox's
# ``timeout`` send SIGTERM, then SIGKILL 10 s later; a board without ``timeout`` runs the command as is.
# The shell waits for the command instead of exec'ing it: a command (or ``timeout``) killed by a signal
# then ends as exit status 128 + N, which ssh passes on; a remote process that dies of a signal makes
# ssh exit with 255, its code for a failed connection. A command that exits with 255 itself looks the same to
# the host, so the shell then says so on the last line of stderr (COMMAND_EXIT_255), which check_connection reads.
COMMAND_EXIT_255 = "edgesdk: the command on the board exited with status 255 (its own, not ssh's)"
_SAY_EXIT_255 = f'[ "$s" -ne 255 ] || echo "{COMMAND_EXIT_255}" >&2; '
REMOTE_DEADLINE = ('d=$1; shift; if command -v timeout >/dev/null 2>&1; then timeout -k 10 "$d" "$@"; '
                   'else "$@"; fi; s=$?; ' + _SAY_EXIT_255 + 'exit $s')
# REMOTE_DEADLINE for a command that reads nothing on stdin, which also ends when the host's ssh does. sshd
# signals nothing to a command it started without a terminal when the connection ends (Ctrl-C or a kill of
# deploy, a dropped network): it only closes the command's stdin, stdout and stderr, so a command that neither
# reads nor writes (an engine build, a smoke test still loading) would run on to its deadline, and a deploy
# run again would start a second one next to it. Here the host keeps ssh's stdin open for the command's life
# (run_holding_stdin) and the board runs the command in the background with stdin from /dev/null, while a
# watcher reads the session's stdin (kept as fd 3: POSIX sh gives an asynchronous list /dev/null as its
# stdin) until EOF, which comes when ssh ends or when deploy does (ssh then reads EOF and passes it on): it
# then sends SIGTERM to the command (to coreutils timeout's process group, where timeout made one, else to
# the command or busybox timeout), and SIGKILL to what is left of it once the command has ended or 5 s have
# passed. On a normal end the shell stops the watcher (still reading) before it exits; a watcher past EOF
# ignores that SIGTERM and finishes. The watcher writes to /dev/null, so it never holds the session open. The exit status rules are REMOTE_DEADLINE's (``wait``
# returns 128 + N for a command killed by signal N). A command started in the background by a shell without
# job control starts with SIGINT and SIGQUIT ignored (POSIX 2.11); coreutils timeout restores them for its
# command, and nothing sends them to a command run over ssh without a terminal.
REMOTE_DEADLINE_WATCHED = (
    'd=$1; shift; exec 3<&0 </dev/null; '
    'if command -v timeout >/dev/null 2>&1; then timeout -k 10 "$d" "$@" 3<&- & else "$@" 3<&- & fi; c=$!; '
    '(while read -r _; do :; done <&3; trap "" TERM; '
    'kill -s TERM -- "-$c" 2>/dev/null || kill -s TERM "$c"; n=0; '
    'while kill -0 "$c" 2>/dev/null && [ $n -lt 5 ]; do sleep 1; n=$((n+1)); done; '
    'kill -s KILL -- "-$c" 2>/dev/null || kill -s KILL "$c") >/dev/null 2>&1 & '
    'w=$!; exec 3<&-; wait "$c"; s=$?; kill "$w" 2>/dev/null; ' + _SAY_EXIT_255 + 'exit $s')
# What a command started with popen (a stream, no deadline) runs under: the shell waits for it, so that one killed
# by signal N ends as 128 + N rather than as ssh's 255, and says so where the command exits with 255 itself.
REMOTE_STATUS = '"$@"; s=$?; ' + _SAY_EXIT_255 + 'exit $s'
TIMED_OUT_CODES = (124, 137)  # timeout's own exit status, and SIGKILL's after -k
DEADLINE_GRACE_S = 30  # ssh waits this much longer, for the board's answer


def run_holding_stdin(cmd: list[str], timeout: float | None) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, timeout=timeout)`` with the child's stdin a pipe that stays
    open, with nothing written to it, until the child has ended: for ssh, the remote command's stdin ends when
    this process or its ssh does (REMOTE_DEADLINE_WATCHED). As subprocess.run, the child is killed when the
    timeout passes (TimeoutExpired) or anything else (KeyboardInterrupt) ends the wait."""
    # not inherited (PEP 446): only this child gets the read end, and no other child holds the write end open
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(cmd, stdin=read_end, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    try:
        with proc:
            try:
                stdout, stderr = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired as exc:
                proc.kill()
                exc.stdout, exc.stderr = proc.communicate()
                raise
            except BaseException:
                proc.kill()
                raise
    finally:
        os.close(write_end)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def run_feeding_stdin(cmd: list[str], data: bytes, timeout: float | None) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, input=data, capture_output=True, timeout=timeout)``, but the child's stdin stays open
    after ``data``, with nothing more written, until the child has ended: for ssh, the remote command (which
    reads exactly ``len(data)`` bytes, board_install.receive_wheel) sees its stdin end only when this process or
    its ssh does, and stops then (board_install.end_with_host), as REMOTE_DEADLINE_WATCHED does for commands that
    read nothing. subprocess.run closed stdin after the data, so the board could not tell a deploy that went on
    from one stopped by Ctrl-C. As subprocess.run, the child is killed when the timeout passes (TimeoutExpired)
    or anything else (KeyboardInterrupt) ends the wait."""
    import threading

    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out: list[bytes] = []
    err: list[bytes] = []

    def feed() -> None:
        try:
            proc.stdin.write(data)
            proc.stdin.flush()
        except (BrokenPipeError, ConnectionResetError, ValueError, OSError):
            pass  # the command ended (or refused) before it read everything: its exit status says why

    threads = [threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True),
               threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True),
               threading.Thread(target=feed, daemon=True)]
    for thread in threads:
        thread.start()
    try:
        proc.wait(timeout=timeout)
    except BaseException:  # TimeoutExpired, KeyboardInterrupt
        proc.kill()
        proc.wait()
        raise
    finally:
        for thread in threads[:2]:
            thread.join(timeout=10)
        with contextlib.suppress(OSError, ValueError):
            proc.stdin.close()
        for stream in (proc.stdout, proc.stderr):
            stream.close()
    return subprocess.CompletedProcess(cmd, proc.returncode, b"".join(out), b"".join(err))


def signal_note(returncode: int, remote: bool) -> str | None:
    """The line that explains an exit status that means "killed by a signal", or None.

    A local child killed by signal N has returncode -N; a remote one ends as 128 + N (REMOTE_DEADLINE). Over ssh
    (``remote``) the local child is the ssh client: -N says that it, not the board's command, was killed."""
    number = -returncode if returncode < 0 else returncode - 128 if remote and 128 < returncode < 160 else None
    if number is None:
        return None
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    if remote and returncode < 0:
        return (f"(exit status {returncode}: the ssh client on this machine was killed by {name}, so the board's "
                "answer was lost)")
    why = {signal.SIGKILL: "; on a board that is usually the out-of-memory killer: free memory or build a "
                           "smaller bundle",
           signal.SIGSEGV: ": the process crashed", signal.SIGBUS: ": the process crashed",
           signal.SIGABRT: ": the process aborted"}.get(number, "")
    return f"(exit status {returncode}: the command was killed by {name}{why})"


def with_signal_note(proc: subprocess.CompletedProcess, remote: bool) -> subprocess.CompletedProcess:
    """``proc`` with :func:`signal_note`'s line added to its stderr, where its exit status calls for one."""
    note = signal_note(proc.returncode, remote)
    if note is not None:
        proc.stderr = (proc.stderr or b"") + (b"\n" if proc.stderr and not proc.stderr.endswith(b"\n") else b"") \
            + note.encode() + b"\n"
    return proc


class LocalTransport(Transport):
    """``--to DIR``: the "board" is this machine; argument lists run without any shell."""

    def __init__(self, root: str):
        self.label = f"local directory {root}"

    def command(self, argv: list[str]) -> list[str]:
        return [str(a) for a in argv]

    def run(self, argv: list[str], input: bytes | None = None, timeout: float | None = None,
            what: str | None = None, hold_stdin: bool = False) -> subprocess.CompletedProcess:
        """As :meth:`Transport.run` (``hold_stdin`` aside: stdin ends after ``input``); a program that cannot be
        started (``--remote-python`` naming no program) ends as a shell ends it, exit status 127 with the reason
        on stderr, as over ssh."""
        try:
            return super().run(argv, input, timeout, what)
        except OSError as exc:
            return subprocess.CompletedProcess(self.command(argv), 127, b"",
                                               f"{exc.filename or argv[0]}: {exc.strerror or exc}".encode())


# How ssh names the peer of a connection made through a ProxyJump or ProxyCommand (no socket of its own to name).
PROXIED = "UNKNOWN port 65535"

# sun_path of a unix socket: 104 bytes on macOS and the BSDs, 108 on Linux, the final NUL included.
SOCKET_PATH_MAX = 103


@dataclass
class SshOptions:
    """What the user said about ssh on the command line."""

    identity: str | None = None
    ssh_config: str | None = None
    options: tuple[str, ...] = ()
    accept_new_host_key: bool = False
    ssh_command: str | None = None
    connect_timeout: int = 15
    multiplex: bool = True


@dataclass
class SshTransport(Transport):
    """The system OpenSSH client."""

    spec: HostSpec
    opts: SshOptions = field(default_factory=SshOptions)
    _control_dir: str | None = None
    _ssh_config: dict[str, str] | None = None
    remote = True

    def __post_init__(self) -> None:
        self.label = str(self.spec)
        command = self.opts.ssh_command or os.environ.get("EDGESDK_SSH") or "ssh"
        try:
            self.base = shlex.split(command)
        except ValueError as exc:  # an unclosed quote or a trailing backslash
            raise DeployError(f"the ssh client command {command!r} (--ssh-command or $EDGESDK_SSH) cannot be split "
                              f"into arguments as a shell would: {exc}",
                              "close its quotes, e.g. --ssh-command \"ssh -o 'ProxyJump=me@gateway'\"") from exc
        if not self.base or shutil.which(self.base[0]) is None:
            raise DeployError(f"ssh client {self.base[0] if self.base else command!r} not found on this machine",
                              "install the OpenSSH client (Debian/Ubuntu: sudo apt install openssh-client), "
                              "or point --ssh-command / $EDGESDK_SSH at it")
        if self.opts.multiplex:
            # A unix socket path holds at most SOCKET_PATH_MAX bytes, and the master binds its socket first as
            # "ControlPath.<16 random letters>" (OpenSSH mux.c muxserver_listen) with %C 40 hex digits: a longer
            # one fails every connection ('ControlPath too long', 'path ... too long for Unix domain socket').
            # ssh reads "-o ControlPath=PATH" as a config line: a blank splits it ("keyword controlpath extra
            # arguments at end of line": every connection refused) and "%" starts a token it expands (ssh_config(5)
            # TOKENS), so a temporary directory holding either (TMPDIR="/tmp/my dir") gives way to /tmp as well.
            parent = tempfile.gettempdir()
            if (len(os.fsencode(parent)) + len("/edgesdk-ssh-12345678/") + 40 + len(".") + 16 > SOCKET_PATH_MAX
                    or re.search(r"[\s%\"']", parent)):
                parent = "/tmp"
            self._control_dir = tempfile.mkdtemp(prefix="edgesdk-ssh-", dir=parent)

    def user_args(self) -> list[str]:
        """What the user said: ``-F``, their ``-o`` options, the identity."""
        args: list[str] = []
        if self.opts.ssh_config:
            args += ["-F", self.opts.ssh_config]
        for option in self.opts.options:  # the user's options first: ssh keeps the first value it sees
            args += ["-o", option]
        if self.opts.identity:
            args += ["-i", self.opts.identity, "-o", "IdentitiesOnly=yes"]
        return args

    def ssh_config(self) -> dict[str, str]:
        """What ``ssh -G`` prints for this board (ssh(1) -G: the configuration after evaluating Host and Match
        blocks, without connecting), asked with the client, ssh config and options the transport connects with:
        each lower-cased keyword -> its value (the first, where one repeats), read once. Empty where ``ssh -G``
        fails (an ssh command that does not take it)."""
        if self._ssh_config is None:
            self._ssh_config = {}
            argv = [*self.base, *self.user_args(), *(["-p", str(self.spec.port)] if self.spec.port else []),
                    "-G", "--", self.spec.destination]
            try:
                proc = subprocess.run(argv, capture_output=True, timeout=15, stdin=subprocess.DEVNULL)
            except (OSError, subprocess.SubprocessError):
                return self._ssh_config
            if proc.returncode == 0:
                for line in proc.stdout.decode("utf-8", "replace").splitlines():
                    key, _, value = line.strip().partition(" ")
                    self._ssh_config.setdefault(key.lower(), value.strip())
        return self._ssh_config

    def configured(self) -> dict[str, str]:
        """The timeouts the user's ssh configuration (its files, ``--ssh-option``) gives this board, as ``ssh -G``
        prints them (:meth:`ssh_config`): ``connecttimeout`` and ``serveraliveinterval`` where set. Empty where
        ``ssh -G`` fails: deploy's defaults then apply, as before."""
        printed = self.ssh_config()
        configured = {}
        if printed.get("connecttimeout", "") not in ("", "none", "-1"):  # -1: unset
            configured["connecttimeout"] = printed["connecttimeout"]
        if printed.get("serveraliveinterval", "") not in ("", "0"):
            configured["serveraliveinterval"] = printed["serveraliveinterval"]
        return configured

    def ssh_args(self, multiplexed: bool = True) -> list[str]:
        """The options deploy gives ssh after the user's; ``multiplexed=False`` leaves out the shared connection
        (:meth:`proxy_stderr`)."""
        args = self.user_args()
        args += ["-o", "BatchMode=yes",
                 "-o", f"StrictHostKeyChecking={'accept-new' if self.opts.accept_new_host_key else 'yes'}"]
        configured = self.configured()
        if "connecttimeout" not in configured:  # a -o would override the ConnectTimeout of the user's ssh config
            args += ["-o", f"ConnectTimeout={self.opts.connect_timeout}"]
        if "serveraliveinterval" not in configured:  # and their keep-alives (ServerAliveCountMax goes with them)
            args += ["-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4"]
        if self._control_dir and multiplexed:
            args += ["-o", "ControlMaster=auto", "-o", f"ControlPath={self._control_dir}/%C",
                     "-o", "ControlPersist=120"]
        elif self._control_dir:  # nor one that the user's ssh config sets up
            args += ["-o", "ControlPath=none"]
        if self.spec.port:
            args += ["-p", str(self.spec.port)]
        return args

    def command(self, argv: list[str]) -> list[str]:
        return [*self.base, *self.ssh_args(), "--", self.spec.destination, remote_command(argv)]

    def popen(self, argv: list[str]) -> subprocess.Popen:
        """As :meth:`Transport.popen`, under REMOTE_STATUS: a board command killed by a signal (the out-of-memory
        killer) ends as 128 + N, which :func:`signal_note` explains, instead of ssh's 255 for a lost connection."""
        return super().popen(["sh", "-c", REMOTE_STATUS, "sh", *argv])

    def run(self, argv: list[str], input: bytes | None = None, timeout: float | None = None,
            what: str | None = None, hold_stdin: bool = False) -> subprocess.CompletedProcess:
        """As :meth:`Transport.run`, with the deadline enforced on the board too (REMOTE_DEADLINE); a command that
        reads no ``input`` also ends on the board when this ssh ends, Ctrl-C or a kill of deploy
        (REMOTE_DEADLINE_WATCHED), and so does one given ``input`` with ``hold_stdin`` that watches its stdin
        after it (run_feeding_stdin)."""
        if timeout is None:
            return super().run(argv, input, None, what)
        deadline = max(1, round(timeout))
        began = time.monotonic()
        if input is not None and not hold_stdin:  # the command reads stdin to its end: it ends at the deadline only
            bounded = ["sh", "-c", REMOTE_DEADLINE, "sh", str(deadline), *argv]
            proc = super().run(bounded, input, timeout + DEADLINE_GRACE_S, what or argv[0])
        else:
            # A command that reads nothing ends when this ssh ends (REMOTE_DEADLINE_WATCHED); one that reads exactly
            # ``input`` gets it and then a stdin held open, whose end it watches (board_install.end_with_host).
            bounded = ["sh", "-c", REMOTE_DEADLINE if input is not None else REMOTE_DEADLINE_WATCHED, "sh",
                       str(deadline), *argv]
            try:
                proc = (run_feeding_stdin(self.command(bounded), input, timeout + DEADLINE_GRACE_S)
                        if input is not None else run_holding_stdin(self.command(bounded), timeout + DEADLINE_GRACE_S))
            except subprocess.TimeoutExpired as exc:
                raise _timed_out(what or argv[0], self.label, timeout + DEADLINE_GRACE_S) from exc
            self.check_connection(proc.returncode, proc.stderr.decode("utf-8", "replace"))
            proc = with_signal_note(proc, remote=True)
        # 124 or 137 before the deadline is the command's own status (137: SIGKILL, say from the OOM killer)
        if proc.returncode in TIMED_OUT_CODES and time.monotonic() - began >= deadline:
            raise _timed_out(what or argv[0], self.label, timeout)
        return proc

    def check_connection(self, returncode: int, stderr: str, during: str = "") -> None:
        """Exit status 255 is ssh's for a failed connection, unless the board's command said it was its own
        (COMMAND_EXIT_255, from the wrappers REMOTE_DEADLINE, REMOTE_DEADLINE_WATCHED and REMOTE_STATUS)."""
        said = stderr.rstrip().rpartition("\n")[2]
        if returncode == 255 and said != COMMAND_EXIT_255:
            raise ssh_failure(self.spec, self.proxy_stderr(stderr), during, self.opts.ssh_config,
                              self.login_command(), self.identities())

    def proxy_stderr(self, stderr: str) -> str:
        """``stderr`` of a failed connection, or where it went through a ProxyJump / ProxyCommand, that of a second
        attempt, which says what the proxy said too. With ControlPersist, ssh sends the proxy's stderr to /dev/null
        (the master it starts outlives the command), so a jump host it cannot resolve, reach or log in to left only
        "Connection closed by UNKNOWN port 65535" (ssh's name for a proxied connection) and no cause; one attempt
        without the shared connection shows the proxy's own words."""
        if not self._control_dir or PROXIED not in stderr:
            return stderr
        argv = [*self.base, *self.ssh_args(multiplexed=False), "--", self.spec.destination, "true"]
        try:
            proc = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL,
                                  timeout=2 * self.opts.connect_timeout + DEADLINE_GRACE_S)
        except (OSError, subprocess.SubprocessError):
            return stderr
        if proc.returncode != 255:  # it got through this time: nothing more to learn from it
            return stderr
        again = proc.stderr.decode("utf-8", "replace").strip()
        return again if again and again not in stderr else stderr  # the same failure, with the proxy's words

    def identities(self) -> tuple[str, ...]:
        """The private keys deploy gives ssh: ``-i`` and the -i of ``--ssh-command`` / $EDGESDK_SSH."""
        given = [arg for flag, arg in zip(self.base, self.base[1:], strict=False) if flag == "-i"]
        return (*given, *([self.opts.identity] if self.opts.identity else []))

    def login_command(self) -> str:
        """``ssh`` to this board as deploy reaches it (its ssh command, ``-F``, the user's ``-o`` options such as
        ProxyJump or UserKnownHostsFile, ``-i``, the port), for the user to run by hand: a bare ``ssh
        user@board`` goes through ~/.ssh/config and ~/.ssh/known_hosts instead, so it may not reach the board
        (no ProxyJump) or store its key where deploy looks for it."""
        return shlex.join([*self.base, *self.user_args(), *(["-p", str(self.spec.port)] if self.spec.port else []),
                           self.spec.destination])

    def close(self) -> None:
        """Stop the master connection and remove its socket's directory. A master that does not answer within
        15 s (hung, or stopped) is left to its ControlPersist: close runs as a deploy ends, where an exception of
        its own would replace the deploy's outcome."""
        if self._control_dir is None:
            return
        try:
            with os.scandir(self._control_dir) as entries:
                running = any(entries)
        except OSError:  # removed under it (a cleaner of the temporary directory): no socket, no master to reach
            running = False
        if running:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run([*self.base, *self.ssh_args(), "-O", "exit", "--", self.spec.destination],
                               capture_output=True, timeout=15, stdin=subprocess.DEVNULL)
        shutil.rmtree(self._control_dir, ignore_errors=True)
        self._control_dir = None


def config_failure(spec: HostSpec, text: str, config: str | None) -> DeployError | None:
    """ssh refusing its own configuration before it connects (readconf.c: an option of the command line, a
    line of a config file, a config file it cannot open), or None. Running the deploy again repeats it. The file
    is one ssh reads (``--ssh-config``, ~/.ssh/config, /etc/ssh/ssh_config) or one they ``Include`` (Debian's
    /etc/ssh/ssh_config.d/*.conf, say): ssh then ends with "FILE: terminating, N bad configuration options"."""
    files = {name for name in (config, os.path.expanduser("~/.ssh/config"), "/etc/ssh/ssh_config") if name}
    files |= set(re.findall(r"^(.+): terminating, \d+ bad configuration options", text, re.MULTILINE))
    for line in text.splitlines():
        if line.startswith("Can't open user config file "):
            split = config_split_for_a_jump(spec, line, config)
            if split is not None:
                return split
            # ssh prints the path cut to its own buffer (a long one loses its end), so the file is named as given
            named = f" {config}" if config else ""
            return DeployError(f"ssh cannot read its config file{named}, so it did not connect to {spec}: {line}",
                               "pass an existing file to --ssh-config (ssh does not expand ~ in it)")
        where, found, _ = line.partition(" line ")
        where = where.rstrip(":")
        if found and where == "command-line":
            return DeployError(
                f"ssh refused an option of its command line, so it did not connect to {spec}: {line}",
                "correct or drop the --ssh-option it names (OPT=VALUE, as ssh_config(5) spells it), or the "
                "-o of --ssh-command / $EDGESDK_SSH; an option deploy adds itself (BatchMode, "
                "StrictHostKeyChecking, ConnectTimeout, ServerAlive*, Control*) refused means an ssh older "
                "than OpenSSH 7.6: update it")
        if found and where in files:
            return DeployError(f"ssh refused its config file {where}, so it did not connect to {spec}: "
                               f"{line}",
                               f"correct that line of {where} (ssh_config(5) lists the options), or pass "
                               "another file with --ssh-config")
    return None


# What a POSIX shell splits a word at or reads as syntax (XCU 2.2, 2.3): a path holding one of them is not one word.
_SHELL_SPLIT = re.compile(r"[\s'\"`$\\;&|<>()*?\[]")


def config_split_for_a_jump(spec: HostSpec, line: str, config: str | None) -> DeployError | None:
    """ssh's "Can't open user config file PATH" for a ``--ssh-config`` file that is there and readable, or None. A
    ProxyJump hands its ``-F`` to the ssh it starts for the jump host inside a ProxyCommand, without quotes
    (OpenSSH ssh.c: ``" -F ", config``), which ``/bin/sh`` runs: a path with a space (or another character the shell
    reads) reaches that ssh cut or changed, and it cannot open the file, though the file is there."""
    if not config or not _SHELL_SPLIT.search(config) or not os.path.isfile(config) or not os.access(config, os.R_OK):
        return None
    opened = line[len("Can't open user config file "):].rpartition(": ")[0] or line
    if opened == config:
        return None
    return DeployError(
        f"ssh could not reach {spec} through its ProxyJump: ssh passes the path of --ssh-config {config} to the ssh "
        f"it starts for the jump host through a shell without quotes, where its "
        f"{_SHELL_SPLIT.search(config)[0]!r} made it another path, which ssh could not open ({line})",
        "copy or link the config file to a path without spaces or shell characters (e.g. ~/.ssh/edgesdk_config) "
        "and pass that to --ssh-config")


def remove_known_host(spec: HostSpec, text: str) -> str:
    """The command that removes the stale key of ``spec`` from known_hosts, given ssh's stderr ``text``.

    ssh names the key under the name it looked it up by, which is not always what ``--host`` says: the HostName
    (or HostKeyAlias) of an ssh config alias, and a bare name for port 22 (misc.c put_host_port: ``[host]:port``
    only for a port other than 22). Debian's OpenSSH prints the exact command itself ("remove with:" then
    ``ssh-keygen -f "FILE" -R "NAME"``, its names in double or single quotes), naming the known_hosts file too:
    its name and file are used where present. Else the name is that of the "Host key for NAME has changed" line, or
    the one put_host_port gives ``spec``, and the file the one of ssh's "Offending ED25519 key in FILE:LINE" line
    (sshconnect.c check_host_key, every OpenSSH): the key may sit in a UserKnownHostsFile other than the
    ~/.ssh/known_hosts that ``ssh-keygen -R`` edits without ``-f``."""
    printed = re.search(r"""^\s*ssh-keygen -f (["'])(.+)\1 -R (["'])(.+)\3\s*$""", text, re.MULTILINE)
    if printed:
        return f'ssh-keygen -R "{printed[4]}" -f "{printed[2]}"'
    named = re.search(r"^Host key for (\S+) has changed", text, re.MULTILINE)
    known = named[1] if named else f"[{spec.host}]:{spec.port}" if spec.port and spec.port != 22 else spec.host
    offending = re.search(r"^Offending (?:\S+ )?key in (.+):\d+\r?$", text, re.MULTILINE)
    return f'ssh-keygen -R "{known}"' + (f' -f "{offending[1]}"' if offending else "")


# ssh's line for a private key it skipped (sshconnect2.c load_identity_file); it logs it with a "\r\n" ending
LOAD_KEY = r'^Load key "(.+)": (.+?)\r?$'


def key_failure(spec: HostSpec, text: str, user: str, identities: tuple[str, ...] = ()) -> DeployError | None:
    """A refused login whose cause is a private key that ssh could not use, or None. ssh skips such a key with a
    warning and tries the login without it (sshconnect2.c load_identity_file, ssh.c: "Identity file %s not
    accessible"; authfile.c sshkey_perm_ok: a key that others may read is "bad permissions"), so the board's refusal
    says nothing about the key, and the fix is on this machine: its file mode, its path or its format.

    ssh warns about the mode and the format of its default keys too (an old ~/.ssh/id_rsa the board never held):
    those are blamed only for a key deploy was given, one of ``identities`` (-i); "not accessible" is printed for
    a -i only."""
    given = {os.path.abspath(os.path.expanduser(path)) for path in identities}
    loose = _given_key(r"^Permissions (\d+) for '(.+)' are too open\.", text, given, 2)
    if loose:
        return DeployError(
            f"{spec} refused the login of user {user}: ssh ignored the private key {loose[2]} because its "
            f"permissions {loose[1]} let other users read it",
            f"make the key readable by you alone (chmod 600 {shlex.quote(loose[2])}), then deploy again")
    missing = re.search(r"^Warning: Identity file (.+) not accessible: (.+?)\.?$", text, re.MULTILINE)
    if missing:
        return DeployError(
            f"{spec} refused the login of user {user}: ssh cannot read the private key {missing[1]} "
            f"({missing[2]})",
            "pass -i the path of an existing private key on this machine (~/.ssh/id_ed25519, say), or fix the "
            "IdentityFile of your ssh config")
    unreadable = _given_key(LOAD_KEY, text, given, 1)
    if unreadable:
        return DeployError(
            f"{spec} refused the login of user {user}: ssh cannot load the private key {unreadable[1]} "
            f"({unreadable[2]})",
            "pass -i the private key itself (not its .pub), in a format ssh reads (ssh-keygen writes one)")
    return None


def _given_key(pattern: str, text: str, given: set[str], group: int) -> re.Match | None:
    """The first line of ``text`` matching ``pattern`` whose key (``group``) is one of the ``given`` paths."""
    return next((match for match in re.finditer(pattern, text, re.MULTILINE)
                 if os.path.abspath(os.path.expanduser(match[group])) in given), None)


def skipped_keys_note(text: str) -> str:
    """What ssh said of the private keys it skipped (``Load key "PATH": REASON``; its default keys among them),
    for a refused login not blamed on them: one of them may be the key the board holds."""
    skipped = [f"{match[1]} ({match[2]})" for match in re.finditer(LOAD_KEY, text, re.MULTILINE)]
    if not skipped:
        return ""
    return (f"; ssh also skipped the private key{'s' if len(skipped) > 1 else ''} {', '.join(skipped)}: if the "
            "board holds one of them, make it usable (chmod 600 where its permissions are bad) or pass -i another")


def ssh_failure(spec: HostSpec, stderr: str, during: str = "", config: str | None = None,
                login: str | None = None, identities: tuple[str, ...] = ()) -> DeployError:
    """Turn ssh's exit 255 and its stderr into a message naming the problem and the fix (``config``: the file
    given to ``--ssh-config``; ``login``: the ssh command line that reaches the board as deploy does,
    :meth:`SshTransport.login_command`, for the first contact done by hand; ``identities``: the private keys
    deploy gave it, :meth:`SshTransport.identities`)."""
    text = stderr.strip()
    login = login or shlex.join(["ssh", *(["-p", str(spec.port)] if spec.port else []), spec.destination])
    refused = config_failure(spec, text, config)
    if refused is not None:
        return refused
    last = "\n    ".join(line for line in text.splitlines()[-6:] if line.strip()) or "(ssh printed nothing)"
    when = f" while {during}" if during else ""
    at_jump = jump_host_refusal(spec, text, when, last)
    if at_jump is not None:
        return at_jump
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in text or ("Host key for" in text and "has changed" in text):
        return DeployError(
            f"refused: the host key of {spec} has changed since it was stored in known_hosts (a re-flashed board, "
            "or someone in the middle)",
            f"if you re-flashed the board, check its new key fingerprint on its console, remove the old one with "
            f"'{remove_known_host(spec, text)}', then deploy again with --accept-new-host-key")
    if "Host key verification failed" in text or "host key is known" in text:
        return DeployError(
            f"refused: {spec} has no host key in known_hosts, and deploy checks host keys strictly",
            f"connect once with '{login}' and check the fingerprint, or pass --accept-new-host-key to store the "
            "key on first use")
    if "Permission denied" in text or "Too many authentication failures" in text:
        # Without user@ in --host, ssh logs in as the User of its config, else as the local user; its own
        # message names whom (sshconnect2.c: "%s@%s: Permission denied (%s).", server_user and host).
        said = re.search(r"^(.+)@[^@\s]+: Permission denied", text, re.MULTILINE)
        user = spec.user or (said[1] if said else "(ssh's default: the User of your ssh config, else your local "
                                                   "user name)")
        unusable = key_failure(spec, text, user, identities)
        if unusable is not None:
            return unusable
        # ssh-copy-id without -i installs the default keys (or the agent's), not the one deploy logs in with
        copy_id = shlex.join(["ssh-copy-id", *(["-i", identities[-1]] if identities else []),
                              *(["-p", str(spec.port)] if spec.port else []), spec.destination])
        return DeployError(
            f"{spec} refused the login of user {user}: {last}",
            "check the user name in --host user@board and the key: pass -i ~/.ssh/KEY, load it with 'ssh-add', "
            f"or install it on the board with '{copy_id}'{skipped_keys_note(text)}")
    if "Could not resolve hostname" in text or "Name or service not known" in text:
        return unresolved(spec, text, last, when)
    for pattern, why in (("Connection refused", "nothing accepts ssh connections on that port"),
                         ("timed out", "the board did not answer"), ("No route to host", "no route to the board"),
                         ("Network is unreachable", "the network is unreachable")):
        if pattern in text:
            jump = jump_host_failure(spec, text, when, last)
            if jump is not None:
                return jump
            return DeployError(
                f"cannot reach {spec}{when}: {why} ({last})",
                "check that the board is powered and on the network, and that sshd runs on it ('sudo systemctl "
                "status ssh' on the board) and listens on "
                + (f"port {spec.port}" if spec.port else
                   "the port ssh connects to (22, or the Port your ssh config gives the board; "
                   "--host user@board:PORT picks another)"))
    return DeployError(
        f"the ssh connection to {spec} failed{when}: {last}",
        "check the network, then run the same deploy again: it resumes, and the board keeps its current release")


def jump_host_refusal(spec: HostSpec, text: str, when: str, last: str) -> DeployError | None:
    """A login or a host key that the jump host (ProxyJump / ProxyCommand) refused, or None. ssh to the jump host
    prints its own "USER@HOST: Permission denied" or "Host key verification failed." line, then ends, and the
    outer ssh, whose connection that was, says "Connection closed by UNKNOWN port 65535" before it has spoken to
    the board (the board's own refusal has no such line). A ProxyJump gives the jump host's ssh the ssh config
    file only: deploy's -i, --ssh-option and --accept-new-host-key reach the board, not the jump host."""
    if f"Connection closed by {PROXIED}" not in text:
        return None
    said = re.search(r"^(.+)@([^@\s]+): Permission denied", text, re.MULTILINE)
    if said and said[2].lower() != spec.host.lower():
        user, jump = said[1], said[2]
        return DeployError(
            f"cannot reach {spec}{when}: its connection goes through the jump host {jump} (ProxyJump or "
            f"ProxyCommand), and {jump} refused the login of user {user}; the board was never reached ({last})",
            f"check that 'ssh {user}@{jump}' logs in: give {jump} its user and IdentityFile in a Host block of your "
            f"ssh config (through a ProxyJump, -i and --ssh-option reach the board only) or install the key there "
            f"with 'ssh-copy-id {user}@{jump}', or correct the ProxyJump that your ssh config or --ssh-option gives "
            f"{spec.host} ('ssh -G {spec.destination}' shows it)")
    if "Host key verification failed" not in text:
        return None
    named = re.search(r"host key is known for (\S+) and|^Host key for (\S+) has changed", text, re.MULTILINE)
    # ssh names a host on a port other than 22 "[host]:port" (misc.c put_host_port)
    bracketed = re.fullmatch(r"\[(.+)\]:(\d+)", (named[1] or named[2]) if named else "")
    jump, port = (bracketed[1], bracketed[2]) if bracketed else ((named[1] or named[2]) if named else None, None)
    if jump is not None and jump.lower() == spec.host.lower():
        return None
    host = f"the jump host {jump}" if jump else "the jump host"
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in text or "has changed" in text:
        return DeployError(
            f"cannot reach {spec}{when}: its connection goes through {host} (ProxyJump or ProxyCommand), whose host "
            f"key has changed since it was stored in known_hosts ({last})",
            f"check the new fingerprint of {host} with its administrator, remove the old key with "
            f"'{remove_known_host(spec, text)}', then deploy again")
    by_hand = shlex.join(["ssh", *(["-p", port] if port else []), jump]) if jump else None
    return DeployError(
        f"cannot reach {spec}{when}: its connection goes through {host} (ProxyJump or ProxyCommand), and ssh could "
        f"not verify the host key of {host} against known_hosts ({last})",
        (f"connect once with '{by_hand}' and check the fingerprint" if by_hand else
         f"connect once by hand to the jump host that your ssh config or --ssh-option gives {spec.host} ('ssh -G "
         f"{spec.destination}' shows its ProxyJump) and check the fingerprint")
        + ", so that ssh stores its key, then deploy again (--accept-new-host-key applies to the board only)")


def jump_host_failure(spec: HostSpec, text: str, when: str, last: str) -> DeployError | None:
    """A connection through a ProxyJump / ProxyCommand that failed at the proxy's own TCP connection, or None.
    Through a proxy ssh opens no connection itself, so its "connect to host H port P" line is the proxy's, to the
    jump host; the board's sshd refusing the jump host is "open failed: connect failed" instead."""
    if PROXIED not in text:
        return None
    failed = re.search(r"connect to host (\S+) port (\d+): (.+?)\r?$", text, re.MULTILINE)
    if failed is None:
        return None
    jump, port, why = failed[1], failed[2], failed[3]
    return DeployError(
        f"cannot reach {spec}{when}: its connection goes through the jump host {jump} (ProxyJump or ProxyCommand), "
        f"and ssh could not connect to {jump} port {port}: {why} ({last})",
        f"check that {jump} is up and that sshd listens on its port {port}, or correct the ProxyJump that your ssh "
        f"config or --ssh-option gives {spec.host} ('ssh -G {spec.destination}' shows it)")


def unresolved(spec: HostSpec, text: str, last: str, when: str = "") -> DeployError:
    """ssh could not resolve a host name. ssh names the one it looked up (ssh.c: "Could not resolve hostname
    %s"), which is the board's own name, or another: the HostName an ssh config alias gives the board, or a
    ProxyJump host on the way to it."""
    named = re.search(r"Could not resolve hostname (\S+?):", text)
    name = named[1] if named else spec.host
    if name.lower() == spec.host.lower():
        return DeployError(f"cannot resolve the board's name {spec.host!r}: {last}",
                           "check the spelling, use the board's IP address, or define the name in ~/.ssh/config")
    return DeployError(f"cannot reach {spec}{when}: ssh cannot resolve the host name {name!r} on its way there (the "
                       f"HostName or a ProxyJump host that your ssh config or --ssh-option gives {spec.host}): "
                       f"{last}",
                       f"check the spelling of {name} where your ssh configuration names it ('ssh -G "
                       f"{spec.destination}' shows the HostName and ProxyJump ssh uses), or write an IP address "
                       "there")


def local_python() -> str:
    """The interpreter that runs this edgesdk (used by ``--to DIR``)."""
    return sys.executable
