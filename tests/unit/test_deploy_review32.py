"""``edgesdk deploy``: compressed bundle archives, the smoke test's command in its refusal, a stalled runtime upload."""

from __future__ import annotations

import os

import pytest

from tests._utils.deploy import current_id, edgesdk


@pytest.mark.parametrize("name", ["b.tar.gz", "b.tar.xz", "B.TGZ"])
def test_deploy_accepts_a_compressed_archive_from_pack(tiny_bundle, tmp_path, name):
    """'edgesdk pack' writes .tar.gz / .tgz, .tar.bz2 and .tar.xz as the name asks; deploy took only a plain .tar
    and refused the others as 'a file, not a bundle directory' with the fix to unpack them first."""
    archive = tmp_path / name
    packed = edgesdk("pack", tiny_bundle.path, archive)
    assert packed.returncode == 0, packed.stderr
    proc = edgesdk("deploy", archive, "--to", tmp_path / "dir")
    assert proc.returncode == 0, proc.stderr
    assert current_id(tmp_path / "dir") == tiny_bundle.bundle_id


def test_a_failed_smoke_test_names_the_command_as_it_ran(tmp_path):
    """The refusal showed 'edgesdk run RELEASE --prompt ... -n 4' without the --ignore-target and --raw the smoke
    test ran with and with the release path unquoted: pasted on the board, it split a path with a space, or was
    refused for the target instead of failing as the smoke test did. The command shown is the one that ran."""
    import shlex
    import subprocess

    from edgesdk.deploy.orchestrate import deploy
    from edgesdk.deploy.report import Reporter
    from edgesdk.deploy.session import DeployOptions
    from edgesdk.deploy.transport import DeployError
    from tests.unit.test_deploy_helper import make_bundle

    bundle = make_bundle(tmp_path / "b", {"model.onnx": os.urandom(100)})  # no graph ONNX Runtime can load
    root = tmp_path / "edge sdk's root"
    with pytest.raises(DeployError) as failed:
        deploy(bundle.path, DeployOptions(to=root, ignore_target=True), Reporter(8, write=lambda line: None))
    first, _, tail = failed.value.problem.partition("\n")
    head, _, command = first.partition("): ")
    # its manifest has no graph facts, so the run refuses the bundle (exit 5) before ONNX Runtime would load it
    assert head == f"the smoke test failed on local directory {root} (exit 5"
    argv = shlex.split(command)
    assert argv[argv.index("run"):] == ["run", str(root / "releases" / bundle.bundle_id), "--ignore-target",
                                        "--prompt", "hi", "-n", "4", "--raw", "--stats"]
    again = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert again.returncode == 5
    assert again.stderr.strip().splitlines()[0] in tail
    assert current_id(root) is None  # the board keeps what it ran (nothing, here)


def test_a_stalled_runtime_upload_gives_up_the_deploy_lock(tmp_path):
    """The runtime install read the wheel from the host under the deploy lock with no deadline of its own: a
    connection that died without closing mid-wheel held the lock until the command's deadline an hour later, and
    every deploy meanwhile was refused. The board gives up after the idle deadline, as the bundle's upload does."""
    import json
    import sys
    import threading

    from edgesdk.deploy.remote import Board
    from edgesdk.deploy.transport import LocalTransport

    root = tmp_path / "board"
    board = Board(LocalTransport(str(root)), sys.executable, str(root))
    proc = board.start("install", {"key": "0.1.0-abc", "wheel_name": "edgesdk-0.1.0-py3-none-any.whl",
                                   "wheel_sha256": "0" * 64, "idle_timeout": 1})
    try:
        proc.stdin.write(b"PK\x03\x04" + b"\0" * 4000)  # the wheel's first bytes, then nothing; the pipe stays open
        proc.stdin.flush()
        out: list[bytes] = []
        reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
        reader.start()
        reader.join(timeout=30)
        assert not reader.is_alive(), "the board still waited on a stalled wheel after 30 s, holding the lock"
    finally:
        proc.stdin.close()
        proc.kill()
        proc.wait(timeout=30)
    reply = json.loads(out[0].decode().strip().splitlines()[-1])
    assert reply["error"] == ("no data from the host for 1 s while receiving the edgesdk wheel (the connection "
                              "stalled)")
    assert reply["fix"] == "run the deploy again (the wheel is sent again); the board keeps its current release"
    assert board.call("prune", {"keep": 3}, timeout=10)["removed"] == []  # the lock is free
    assert os.listdir(root / "runtime" / "wheels") == []  # no half wheel left
    assert not (root / "runtime" / "0.1.0-abc").exists()


def test_a_bundle_built_inside_the_checkout_leaves_the_runtime_key_alone(tmp_path):
    """'edgesdk build --out smol' run in the checkout writes smol/ and its work directory smol.build/ there; both
    counted as wheel source, so each new build was a new runtime key and the next deploy installed a new runtime on
    the board (and hashed and copied the bundle and its checkpoints to build the wheel). Only the code counts."""
    from edgesdk.deploy import install

    root = tmp_path / "checkout"
    (root / "edgesdk").mkdir(parents=True)
    (root / "pyproject.toml").write_text('name = "edgesdk"\n')
    (root / "edgesdk" / "a.py").write_text("x = 1\n")
    (root / "targets").mkdir()
    (root / "targets" / "__init__.py").write_text("")
    (root / "targets" / "rpi5.yaml").write_text("name: rpi5\n")
    for folder in ("smol", "smol.build/qat", "env/lib"):
        (root / folder).mkdir(parents=True)
    (root / "env" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / "env" / "lib" / "site.py").write_text("")
    names = [p.relative_to(root).as_posix() for p in install.source_files(root)]
    assert names == ["edgesdk/a.py", "pyproject.toml", "targets/__init__.py", "targets/rpi5.yaml"]
    before = install.source_digest(root)
    (root / "smol" / "model.onnx").write_bytes(os.urandom(64))  # a new build of the bundle
    (root / "smol.build" / "qat" / "model.safetensors").write_bytes(os.urandom(64))
    (root / "env" / "lib" / "site.py").write_text("changed")
    assert install.source_digest(root) == before
    (root / "targets" / "rpi5.yaml").write_text("name: rpi5\nchanged: true\n")
    assert install.source_digest(root) != before


def board_to_roll_back(server, tiny_bundle, tmp_path) -> tuple:
    """A deploy root with tiny_bundle current, a variant of it previous and this edgesdk as its runtime, and the
    --rollback arguments that reach it through ``server``; returns (root, the previous bundle, the arguments)."""
    import json
    import stat
    import sys

    from edgesdk.deploy.remote import Board
    from edgesdk.deploy.transport import LocalTransport
    from tests._utils.deploy import bundle_variant
    from tests.unit.test_deploy_helper import commit_by_hand

    root = tmp_path / "board"
    local = Board(LocalTransport(str(root)), sys.executable, str(root))
    older = bundle_variant(tiny_bundle.path, tmp_path / "older", "older")
    for bundle in (older, tiny_bundle):  # current: tiny_bundle, previous: older
        commit_by_hand(local, bundle)
        local.call("switch", {"bundle_id": bundle.bundle_id})
    runtime = root / "runtime" / "k"  # the board's edgesdk runtime: this edgesdk
    (runtime / "bin").mkdir(parents=True)
    (runtime / "bin" / "edgesdk").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m edgesdk.cli "$@"\n')
    (runtime / "bin" / "edgesdk").chmod(stat.S_IRWXU)
    (runtime / "edgesdk-runtime.json").write_text(json.dumps({"key": "k", "version": "0.1.0"}))
    (root / "runtime" / "current").symlink_to("k")
    args = ["deploy", "--rollback", *server.client_args(), "--host", server.destination, "--remote-root", root,
            "--remote-python", sys.executable]
    return root, older, args


def test_a_rollback_whose_switch_reply_is_lost_does_not_say_to_run_it_again(ssh_server, tiny_bundle, tmp_path):
    """Real sshd; the switch happens on the board and its reply is lost. The refusal was ssh's 'run the same deploy
    again: it resumes, and the board keeps its current release': it had not kept it, and the same --rollback again
    switched back to the release the rollback left (previous now). The refusal says current may be either and
    names the rollback that finishes the job whichever it is."""
    from tests._utils.deploy import faulty_ssh_command

    root, older, args = board_to_roll_back(ssh_server, tiny_bundle, tmp_path)
    lose = faulty_ssh_command(f"lose:switch:{tmp_path / 'board-gone'}", ssh_server.process.pid)
    failed = edgesdk(*args, "--ssh-command", lose)
    assert failed.returncode == 8, failed.stderr
    assert current_id(root) == older.bundle_id  # the switch did happen
    assert (f"current may already point to releases/{older.bundle_id} (smoke-tested) or still to "
            f"releases/{tiny_bundle.bundle_id}") in failed.stderr, failed.stderr
    assert f"run 'edgesdk deploy --rollback --release {older.bundle_id}' (not a plain --rollback" in failed.stderr
    assert "keeps its current release" not in failed.stderr
    again = edgesdk(*args, "--release", older.bundle_id)  # what it says, the board back
    assert again.returncode == 8
    assert f"release {older.bundle_id} is already current" in again.stderr
    assert current_id(root) == older.bundle_id


def test_a_rollback_whose_service_restart_reply_is_lost_says_not_to_run_it_again(ssh_server, tiny_bundle, tmp_path):
    """The switch is done and answered; the reply to the service restart after it is lost. The refusal passed on
    ssh's fix, 'run the same deploy again: it resumes, and the board keeps its current release', and the same
    --rollback switched current back to the release the rollback had left."""
    from tests._utils.deploy import faulty_ssh_command

    root, older, args = board_to_roll_back(ssh_server, tiny_bundle, tmp_path)
    lose = faulty_ssh_command(f"lose:service:{tmp_path / 'board-gone'}", ssh_server.process.pid)
    failed = edgesdk(*args, "--ssh-command", lose)
    assert failed.returncode == 8, failed.stderr
    assert current_id(root) == older.bundle_id
    assert "current was rolled back, but the board's reply to restarting the service" in failed.stderr
    assert "do not run the rollback again: current is switched, and the same --rollback would switch it back" \
        in failed.stderr, failed.stderr
    assert "run the same deploy again" not in failed.stderr


def test_ssh_refusing_its_own_configuration_is_not_called_a_network_failure(tmp_path):
    """Real ssh: a bad --ssh-option, a bad line of the --ssh-config file, or no such file. ssh stops before it
    connects, and deploy said 'the ssh connection failed' with 'check the network, then run the same deploy
    again', which repeats it. The refusal names what ssh refused and where to correct it."""
    import shutil

    from click.testing import CliRunner

    from edgesdk.cli import main
    from edgesdk.deploy.transport import HostSpec, ssh_failure
    from tests._utils.sshd import free_port

    if shutil.which("ssh") is None:
        pytest.skip("OpenSSH client not installed")
    bad = tmp_path / "ssh config"
    bad.write_text("Host *\n  Bogus yes\n")
    host = f"pi@127.0.0.1:{free_port()}"  # never reached: ssh stops at its configuration
    cases = [
        (["--ssh-config", "/dev/null", "--ssh-option", "Bogus=yes"],
         "ssh refused an option of its command line, so it did not connect to", "correct or drop the --ssh-option"),
        (["--ssh-config", str(bad)], f"ssh refused its config file {bad}, so it did not connect to",
         f"correct that line of {bad}"),
        (["--ssh-config", str(tmp_path / "missing")], "ssh cannot read its config file",
         "pass an existing file to --ssh-config"),
    ]
    for args, problem, fix in cases:
        result = CliRunner().invoke(main, ["deploy", "--status", "--host", host, *args])
        assert result.exit_code == 8, result.output
        assert problem in result.output, result.output
        assert "bogus" in result.output.lower() or "missing" in result.output
        assert f"fix: {fix}" in result.output
        assert "check the network" not in result.output
    # the board's own shell complaining about a line of its .bashrc is not ssh's configuration
    remote = "/home/pi/.bashrc: line 5: foo: command not found\nConnection to board closed by remote host."
    assert "check the network" in ssh_failure(HostSpec.parse("pi@board"), remote, config=str(bad)).fix
