"""``edgesdk deploy``, review 50 (deploy2): a bounded board command ends when the host's ssh ends.

sshd signals nothing to a command it started without a terminal when the connection ends: after Ctrl-C or a kill
of ``edgesdk deploy``, the smoke test or a TensorRT engine build ran on to its deadline (900 s, 2 h), and a deploy
run again started a second build next to it. SshTransport.run keeps ssh's stdin open for a bounded command that
reads no input, and the board stops the command once that stdin ends (REMOTE_DEADLINE_WATCHED).

ssh runs against a real sshd on 127.0.0.1 (tests/_utils/sshd.py, the fixture of test_deploy48); the wrapper
itself also runs under each POSIX shell installed here (dash, busybox sh, bash).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from edgesdk.deploy.transport import (
    REMOTE_DEADLINE_WATCHED,
    HostSpec,
    SshOptions,
    SshTransport,
    TimedOut,
)
from tests._utils.signals import default_signals

REPO = Path(__file__).resolve().parents[2]


def _options(server, multiplex: bool = True) -> SshOptions:
    return SshOptions(identity=str(server.user_key), ssh_config="/dev/null", multiplex=multiplex,
                      options=(f"UserKnownHostsFile={server.known_hosts}", "GlobalKnownHostsFile=/dev/null"))


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped, does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_for_pid(path: Path, within: float = 30.0) -> int:
    end = time.monotonic() + within
    while time.monotonic() < end:
        text = path.read_text().strip() if path.exists() else ""
        if text.endswith("!"):  # written in full
            return int(text[:-1])
        time.sleep(0.05)
    raise AssertionError(f"the board command did not start within {within} s ({path} not written)")


def _gone_within(pid: int, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


def _long_command(pid_file: Path, marker: Path) -> list[str]:
    """A board command that neither reads nor writes for 30 s (an engine build), then leaves ``marker``."""
    return ["sh", "-c", f'echo "$$!" > {pid_file}; sleep 30; touch {marker}']


def _kill_if_alive(pid: int) -> None:
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


HOST = textwrap.dedent("""
    import json, sys
    from edgesdk.deploy.transport import HostSpec, SshOptions, SshTransport
    spec, opts, argv = json.loads(sys.argv[1])
    transport = SshTransport(HostSpec.parse(spec), SshOptions(**opts))
    print(transport._control_dir, flush=True)
    try:
        transport.run(argv, timeout=60, what="the engine build")
    finally:
        transport.close()
""")


@pytest.mark.parametrize("stop", ["ctrl-c", "kill -9"])
def test_a_bounded_board_command_ends_when_deploy_is_stopped(ssh_server, tmp_path, stop):
    """Ctrl-C (SIGINT to the host's process group, ssh included) or SIGKILL of the deploy process alone: the board
    command is gone within seconds, not at its deadline. Before, it ran on for its full 30 s."""
    pid_file, marker = tmp_path / "pid", tmp_path / "M"
    opts = _options(ssh_server)
    payload = [ssh_server.destination, {"identity": opts.identity, "ssh_config": opts.ssh_config,
                                        "options": list(opts.options)}, _long_command(pid_file, marker)]
    host = subprocess.Popen([sys.executable, "-c", HOST, json.dumps(payload)], cwd=REPO, start_new_session=True,
                            preexec_fn=default_signals, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pid = None
    try:
        pid = _wait_for_pid(pid_file)
        assert _alive(pid)
        if stop == "ctrl-c":
            os.killpg(host.pid, signal.SIGINT)
        else:
            os.kill(host.pid, signal.SIGKILL)
        host.wait(30)
        assert _gone_within(pid, 10), f"the board command still runs 10 s after {stop} of deploy"
        assert not marker.exists()
    finally:
        if host.poll() is None:
            os.killpg(host.pid, signal.SIGKILL)
        out, _err = host.communicate()
        if pid is not None:
            _kill_if_alive(pid)
        _end_master(out.decode().strip())


def _end_master(control_dir: str) -> None:
    """Stop the ssh master that a killed deploy left behind (ControlPersist), and remove its directory."""
    if not control_dir.startswith("/"):
        return
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
        except OSError:
            continue
        if cmdline.startswith(f"ssh: {control_dir}/".encode()):
            os.kill(int(entry.name), signal.SIGTERM)
    shutil.rmtree(control_dir, ignore_errors=True)


@pytest.mark.parametrize("multiplex", [True, False], ids=["multiplexed", "one connection"])
def test_a_bounded_board_command_ends_when_its_ssh_is_killed(ssh_server, tmp_path, multiplex):
    """The ssh client killed (SIGKILL) while deploy lives on: the command on the board ends too."""
    pid_file, marker = tmp_path / "pid", tmp_path / "M"
    transport = SshTransport(HostSpec.parse(ssh_server.destination), _options(ssh_server, multiplex))
    outcome: dict = {}

    def work() -> None:
        try:
            outcome["proc"] = transport.run(_long_command(pid_file, marker), timeout=60, what="the engine build")
        except BaseException as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=work)
    worker.start()
    pid = None
    try:
        pid = _wait_for_pid(pid_file)
        ours = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _child_ssh(int(p.name))]
        assert ours, "no ssh client of this test found"
        for ssh in ours:
            os.kill(ssh, signal.SIGKILL)
        worker.join(30)
        assert not worker.is_alive()
        # as before: the ssh client's own death (SIGKILL, exit -9) is reported as such
        assert outcome["proc"].returncode == -signal.SIGKILL, outcome
        assert _gone_within(pid, 10), "the board command still runs 10 s after its ssh was killed"
        assert not marker.exists()
    finally:
        worker.join(60)
        transport.close()
        if pid is not None:
            _kill_if_alive(pid)


def _child_ssh(pid: int) -> bool:
    """An ssh client that this test process started."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    return comm == "ssh" and int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid()


def test_a_bounded_board_command_still_reports_as_before(ssh_server, tmp_path):
    """Exit status, stdout and stderr come back; the deadline is TimedOut (124); a command killed by a signal ends
    as 128 + N with its note; a command that ends at once returns at once (the open stdin holds nothing)."""
    transport = SshTransport(HostSpec.parse(ssh_server.destination), _options(ssh_server))
    try:
        proc = transport.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=60)
        assert (proc.returncode, proc.stdout, proc.stderr) == (3, b"out\n", b"err\n")
        proc = transport.run(["cat"], timeout=60)  # stdin is /dev/null: cat ends at once
        assert (proc.returncode, proc.stdout) == (0, b"")
        began = time.monotonic()
        assert transport.run(["true"], timeout=60).returncode == 0
        assert time.monotonic() - began < 10
        with pytest.raises(TimedOut) as late:
            transport.run(["sleep", "30"], timeout=2, what="the smoke test")
        assert late.value.what == "the smoke test"
        assert late.value.seconds == 2
        proc = transport.run(["sh", "-c", "kill -SEGV $$"], timeout=60)
        assert proc.returncode == 128 + signal.SIGSEGV
        assert b"killed by SIGSEGV" in proc.stderr
        # a command that reads its input keeps it (REMOTE_DEADLINE)
        proc = transport.run(["cat"], input=b"payload", timeout=60)
        assert (proc.returncode, proc.stdout) == (0, b"payload")
    finally:
        transport.close()


SHELLS = [shell for shell in (["dash"], ["busybox", "sh"], ["bash"]) if shutil.which(shell[0])]


@pytest.mark.parametrize("shell", SHELLS, ids=[" ".join(s) for s in SHELLS])
@pytest.mark.parametrize("with_timeout", [True, False], ids=["timeout", "no timeout"])
def test_the_watched_deadline_under_each_posix_shell(shell, with_timeout, tmp_path):
    """The wrapper as dash (Debian, Raspberry Pi OS), busybox ash and bash run it, with and without a ``timeout``
    program: statuses as REMOTE_DEADLINE gives them, and the command stopped once its stdin ends (SIGTERM, then
    SIGKILL for one that ignores SIGTERM)."""
    env = dict(os.environ)
    if not with_timeout:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        for tool in ("sh", "sleep", "touch", "kill", "cat"):
            (bin_dir / tool).symlink_to(shutil.which(tool))
        env["PATH"] = str(bin_dir)
    shell = [shutil.which(shell[0]), *shell[1:]]

    def start(*argv: str) -> subprocess.Popen:
        return subprocess.Popen([*shell, "-c", REMOTE_DEADLINE_WATCHED, "sh", *argv], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)

    def finish(proc: subprocess.Popen, within: float = 30) -> tuple[int, bytes]:
        out = proc.stdout.read()
        proc.stderr.read()
        proc.wait(within)
        proc.stdin.close()
        return proc.returncode, out

    assert finish(start("30", "sh", "-c", "echo out; exit 3")) == (3, b"out\n")
    assert finish(start("30", "cat")) == (0, b"")  # the command's stdin is /dev/null
    assert finish(start("30", "sh", "-c", "kill -SEGV $$"))[0] == 128 + signal.SIGSEGV
    if with_timeout:
        began = time.monotonic()
        assert finish(start("1", "sleep", "30"))[0] == 124
        assert time.monotonic() - began < 10
    # a command that stops on SIGTERM, and one that ignores it (its short sleeps end on their own)
    for script, status in (("exec sleep 30", 128 + signal.SIGTERM),
                           ("trap '' TERM; while :; do sleep 0.2; done", 128 + signal.SIGKILL)):
        pid_file = tmp_path / "pid"
        pid_file.unlink(missing_ok=True)
        proc = start("60", "sh", "-c", f'echo "$$!" > {pid_file}; {script}')
        pid = _wait_for_pid(pid_file)
        try:
            began = time.monotonic()
            proc.stdin.close()  # ssh ended
            assert proc.wait(20) == status
            assert time.monotonic() - began < 15
            assert _gone_within(pid, 5)
        finally:
            _kill_if_alive(pid)
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()
