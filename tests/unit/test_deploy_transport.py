"""ssh transport: host parsing, argument quoting, the ssh command line, and ssh errors in plain words."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from edgesdk.deploy.remote import boot_code
from edgesdk.deploy.transport import (
    DeployError,
    HostSpec,
    LocalTransport,
    SshOptions,
    SshTransport,
    remote_command,
    ssh_failure,
)

NASTY = ["a b", "it's", '"; touch pwned #', "$(touch pwned)", "`touch pwned`", "back\\slash", "new\nline", "*",
         "~", "", "-n", "--", "semi;colon", "pipe|touch pwned", "&& touch pwned", "ünï©ødé", "{a,b}", "$HOME"]


@pytest.mark.parametrize(("text", "host", "user", "port"), [
    ("nvidia@orin.local", "orin.local", "nvidia", None),
    ("pi@192.168.1.20:2222", "192.168.1.20", "pi", 2222),
    ("myboard", "myboard", None, None),
    ("root@[fe80::1%eth0]:22", "fe80::1%eth0", "root", 22),
    ("jetson-01", "jetson-01", None, None),
])
def test_host_spec_parses(text, host, user, port):
    spec = HostSpec.parse(text)
    assert (spec.host, spec.user, spec.port) == (host, user, port)


@pytest.mark.parametrize("text", ["-oProxyCommand=touch pwned", "", "a b@host", "user@host:99999", "user@host:x",
                                  "user@@host", "host/path", "user@-oProxyCommand=x"])
def test_host_spec_refuses(text):
    with pytest.raises(DeployError) as info:
        HostSpec.parse(text)
    assert info.value.fix


def test_remote_command_quotes_every_argument_for_a_posix_shell(tmp_path):
    """What ssh hands the board's shell comes back as the same arguments, and runs nothing."""
    text = remote_command(["printf", "%s\\0", *NASTY])
    out = subprocess.run(["sh", "-c", text], capture_output=True, cwd=tmp_path, check=True).stdout
    assert out.decode().split("\0")[:-1] == NASTY
    assert not (tmp_path / "pwned").exists()


def test_boot_code_survives_the_shell_and_runs_the_helper(tmp_path):
    code = boot_code()
    assert "\\" not in code
    assert "\n" not in code
    argv = ["python3" if shutil.which("python3") else "python", "-c", code, "probe",
            '{"root": "' + str(tmp_path / "none") + '"}']
    out = subprocess.run(["sh", "-c", remote_command(argv)], capture_output=True, text=True, check=True).stdout
    assert '"ok": true' in out
    assert not (tmp_path / "none").exists()


def test_the_board_script_is_python_38_and_its_parts_import_on_the_host():
    import ast
    import base64
    import importlib
    import re
    import zlib

    packed = re.search(r"b64decode\('([^']+)'\)", boot_code())[1]
    source = zlib.decompress(base64.b64decode(packed)).decode()
    ast.parse(source, feature_version=(3, 8))  # boards on JetPack 5 run Python 3.8
    for part in ("board_common", "board_transfer", "board_install", "board_service"):
        importlib.import_module(f"edgesdk.deploy.{part}")
    ops = importlib.import_module("edgesdk.deploy.board_ops")
    assert set(ops.OPS) == {"probe", "receive", "commit", "verify", "switch", "prune", "install", "service"}


@pytest.fixture
def ssh_bin():
    if shutil.which("ssh") is None:
        pytest.skip("OpenSSH client not installed")
    return "ssh"


def test_ssh_command_line(ssh_bin, tmp_path):
    transport = SshTransport(HostSpec.parse("pi@board:2222"),
                             SshOptions(identity="/keys/id", ssh_config="/dev/null", options=("ConnectTimeout=3",)))
    try:
        argv = transport.command(["ls", "/a dir"])
        assert argv[0] == "ssh"
        assert argv[-3:] == ["--", "pi@board", "ls '/a dir'"]
        joined = " ".join(argv)
        assert "-F /dev/null" in joined
        assert "-i /keys/id -o IdentitiesOnly=yes" in joined
        assert "-o BatchMode=yes" in joined
        assert "-o StrictHostKeyChecking=yes" in joined
        assert "-p 2222" in joined
        # the user's option comes first, and deploy's own default is left out where the user gives one
        assert "ConnectTimeout=3" in joined
        assert "ConnectTimeout=15" not in joined
        assert "-o ServerAliveInterval=15 -o ServerAliveCountMax=4" in joined  # none given: deploy's
        control = transport._control_dir
        assert control is not None
        assert f"ControlPath={control}/%C" in joined
    finally:
        transport.close()
    assert not Path(control).exists()
    lenient = SshTransport(HostSpec.parse("board"), SshOptions(accept_new_host_key=True, multiplex=False))
    assert "StrictHostKeyChecking=accept-new" in " ".join(lenient.command(["true"]))
    assert "ControlMaster" not in " ".join(lenient.command(["true"]))


def test_missing_ssh_client_is_named():
    with pytest.raises(DeployError) as info:
        SshTransport(HostSpec.parse("board"), SshOptions(ssh_command="/nonexistent/ssh"))
    assert "not found" in info.value.problem
    assert "openssh-client" in info.value.fix


CHANGED = """@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @
@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
Host key for [127.0.0.1]:2222 has changed and you have requested strict checking.
Host key verification failed."""


@pytest.mark.parametrize(("stderr", "problem", "fix"), [
    (CHANGED, "has changed", "ssh-keygen -R \"[127.0.0.1]:2222\""),  # the name ssh says it stored
    ("No ED25519 host key is known for [board]:2222 and you have requested strict checking.\n"
     "Host key verification failed.", "no host key in known_hosts", "--accept-new-host-key"),
    ("pi@board: Permission denied (publickey).", "refused the login of user pi", "ssh-copy-id -p 2222 pi@board"),
    ("ssh: Could not resolve hostname board: Name or service not known", "cannot resolve", "IP address"),
    ("ssh: connect to host board port 2222: Connection timed out", "did not answer", "powered"),
    ("ssh: connect to host board port 2222: Connection refused", "nothing accepts ssh", "sshd runs"),
    ("client_loop: send disconnect: Broken pipe", "failed while sending x", "run the same deploy again"),
])
def test_ssh_failures_name_the_problem_and_the_fix(stderr, problem, fix):
    error = ssh_failure(HostSpec.parse("pi@board:2222"), stderr, "sending x")
    assert problem in error.problem
    assert fix in error.fix


def test_a_local_command_killed_by_a_signal_says_so(tmp_path):
    proc = LocalTransport(str(tmp_path)).run(["sh", "-c", "kill -SEGV $$"], timeout=60)
    assert proc.returncode == -11
    assert b"killed by SIGSEGV: the process crashed" in proc.stderr
    assert b"killed by" not in LocalTransport(str(tmp_path)).run(["sh", "-c", "exit 137"], timeout=60).stderr


def _pyenv_python(version: str) -> str | None:
    found = sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version[0]}"))
    return str(found[0]) if found else shutil.which(f"python{version}")


@pytest.mark.parametrize("version", ["2.7", "3.6", "3.7"])
def test_a_board_python_too_old_for_the_helper_is_named_with_the_fix(tmp_path, version):
    """An old interpreter gets the helper's JSON refusal, not a SyntaxError the host calls a disk problem."""
    from edgesdk.deploy.remote import Board

    python = _pyenv_python(version)
    if python is None:
        pytest.skip(f"no python{version} here")
    board = Board(LocalTransport(str(tmp_path)), python, str(tmp_path / "root"))
    with pytest.raises(DeployError, match=rf"the board Python {version}\.\d+ \(.*\) is too old to run the deploy "
                                          r"helper, which needs Python >= 3\.8; edgesdk itself needs >= 3\.10"
                       ) as refused:
        board.call("probe", {})
    assert "--remote-python" in refused.value.fix
    assert not (tmp_path / "root").exists()
