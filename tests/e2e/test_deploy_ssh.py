"""``edgesdk deploy`` against a real OpenSSH server on 127.0.0.1, deploying into a temporary "board".

The board is this machine: sshd runs unprivileged on a free port with keys in a temporary
directory, and the deploy root is a temporary directory. The runtime venv inherits this
interpreter's packages (``--runtime-venv-system-site-packages``) so no test downloads anything.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgesdk.bundle import verify_bundle
from tests._utils.deploy import bundle_variant, current_id, edgesdk, faulty_ssh_command, tree_state
from tests._utils.sshd import free_port, keygen, serve

pytestmark = pytest.mark.slow


@pytest.fixture
def own_ssh_server(tmp_path_factory):
    """A server for one test, which changes its host key."""
    yield from serve(tmp_path_factory, "sshd-own")


def deploy_args(server, root, *extra, key=None) -> list:
    return ["deploy", *extra, *server.client_args(key), "--host", server.destination, "--remote-root", root,
            "--remote-python", sys.executable, "--runtime-venv-system-site-packages"]


def assert_runs(root) -> None:
    """``current`` verifies and generates text, with this edgesdk and with the runtime deployed on the board."""
    verify_bundle(root / "current")
    ran = edgesdk("run", root / "current", "--prompt", "hi", "-n", 4, "--raw")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip()
    board_runtime = root / "runtime" / "current" / "bin" / "edgesdk"
    if board_runtime.exists():
        on_board = subprocess.run([board_runtime, "run", root / "current", "--prompt", "hi", "-n", "4", "--raw"],
                                  capture_output=True, text=True, timeout=120)
        assert on_board.returncode == 0, on_board.stderr
        assert on_board.stdout.strip()


def test_deploy_then_run_current_and_a_second_deploy_sends_nothing(ssh_server, tiny_bundle, tmp_path):
    root = tmp_path / "board"
    began = time.monotonic()
    first = edgesdk(*deploy_args(ssh_server, root, tiny_bundle.path, "--json"))
    first_wall = time.monotonic() - began
    assert first.returncode == 0, first.stderr
    for step in ("[1/8] verify bundle", "[2/8] probe", "[3/8] check target", "[4/8] edgesdk runtime",
                 "[5/8] transfer", "[6/8] TensorRT engine", "[7/8] smoke test", "[8/8] switch current"):
        assert step in first.stderr
    assert "skipped: not a Jetson" in first.stderr
    assert "installing 0.1.0-" in first.stderr
    result = json.loads(first.stdout)
    total = sum(f.stat().st_size for f in tiny_bundle.path.iterdir())
    assert result["bytes_sent"] == total
    assert result["runtime_bytes_sent"] > 0
    assert current_id(root) == tiny_bundle.bundle_id
    assert_runs(root)

    began = time.monotonic()
    second = edgesdk(*deploy_args(ssh_server, root, tiny_bundle.path))
    second_wall = time.monotonic() - began
    assert second.returncode == 0, second.stderr
    assert "nothing to send" in second.stderr
    assert "up to date" in second.stderr
    assert " 0 B sent in 0 files" in second.stdout
    # The summary says how to run the live release on the board, with the runtime the deploy installed.
    command = second.stdout.split("run it on the board: ", 1)[1].strip()
    assert command == f"{root / 'runtime' / 'current' / 'bin' / 'edgesdk'} run {root / 'current'}"
    on_board = subprocess.run([*shlex.split(command), "--prompt", "hi", "-n", "3", "--raw"], capture_output=True,
                              text=True, timeout=120)
    assert on_board.returncode == 0, on_board.stderr
    assert on_board.stdout.strip()
    print(f"\nMEASURED first deploy: {result['bytes_sent']} B bundle + {result['runtime_bytes_sent']} B wheel, "
          f"{first_wall:.2f} s wall; second deploy: 0 B, {second_wall:.2f} s wall")
    status = edgesdk(*deploy_args(ssh_server, root, "--status"))
    assert status.returncode == 0, status.stderr
    assert f"current    {tiny_bundle.bundle_id}" in status.stdout


def test_target_mismatch_is_refused_and_the_board_is_untouched(ssh_server, tiny_bundle, tmp_path):
    rpi = bundle_variant(tiny_bundle.path, tmp_path / "rpi", "built for rpi5", target="rpi5")
    root = tmp_path / "board"
    refused = edgesdk(*deploy_args(ssh_server, root, rpi.path))
    assert refused.returncode == 8
    assert "built for target 'rpi5'" in refused.stderr
    assert "is 'host'" in refused.stderr
    assert "fix:" in refused.stderr
    assert "--ignore-target" in refused.stderr
    assert not root.exists()
    forced = edgesdk(*deploy_args(ssh_server, root, rpi.path, "--ignore-target"))
    assert forced.returncode == 0, forced.stderr
    assert "target check skipped (--ignore-target)" in forced.stderr
    assert current_id(root) == rpi.bundle_id


def test_a_lost_switch_reply_with_the_board_gone_says_which_releases_current_may_be(
        ssh_server, tiny_bundle, tmp_path):
    """The board switched but its reply was lost, and the switch back could not reach it: the error
    must not claim the board kept its release (it did not), and names both candidates."""
    root = tmp_path / "board"
    assert edgesdk(*deploy_args(ssh_server, root, tiny_bundle.path)).returncode == 0
    newer = bundle_variant(tiny_bundle.path, tmp_path / "newer", "newer")
    lose = faulty_ssh_command(f"lose:switch:{tmp_path / 'board-gone'}", ssh_server.process.pid)
    failed = edgesdk(*deploy_args(ssh_server, root, newer.path, "--ssh-command", lose))
    assert failed.returncode == 8, failed.stderr
    assert current_id(root) == newer.bundle_id  # the first switch did happen
    assert f"current release may be releases/{newer.bundle_id} (smoke-tested) or " \
           f"releases/{tiny_bundle.bundle_id}" in failed.stderr, failed.stderr
    assert "edgesdk deploy --status" in failed.stderr
    assert "keeps its current release" not in failed.stderr
    assert_runs(root)


def test_a_first_deploy_whose_switch_reply_is_lost_says_current_may_be_set(ssh_server, tiny_bundle, tmp_path):
    """No release before: the lost reply must not read as a plain ssh failure (the board did switch)."""
    root = tmp_path / "board"
    lose = faulty_ssh_command(f"lose:switch:{tmp_path / 'board-gone'}", ssh_server.process.pid)
    failed = edgesdk(*deploy_args(ssh_server, root, tiny_bundle.path, "--ssh-command", lose))
    assert failed.returncode == 8, failed.stderr
    assert current_id(root) == tiny_bundle.bundle_id  # the switch did happen
    assert f"current may already point to releases/{tiny_bundle.bundle_id} (smoke-tested)" in failed.stderr, \
        failed.stderr
    assert "edgesdk deploy --status" in failed.stderr


def test_a_byte_corrupted_in_transit_is_caught_and_the_previous_release_stays(ssh_server, tiny_bundle, tmp_path):
    root = tmp_path / "board"
    assert edgesdk(*deploy_args(ssh_server, root, tiny_bundle.path)).returncode == 0
    # Pretend the board's active runtime is an older one, to see that a failed deploy keeps it active.
    runtime = root / "runtime"
    key = os.readlink(runtime / "current")
    (runtime / "older" / "bin").mkdir(parents=True)
    (runtime / "older" / "bin" / "edgesdk").write_text(f'#!/bin/sh\nexec {runtime / key / "bin" / "edgesdk"} "$@"\n')
    (runtime / "older" / "bin" / "edgesdk").chmod(0o755)
    (runtime / "older" / "edgesdk-runtime.json").write_text(json.dumps({"key": "older", "version": "0.0.9"}))
    os.unlink(runtime / "current")
    os.symlink("older", runtime / "current")
    padded = bundle_variant(tiny_bundle.path, tmp_path / "padded", "padded", padding=1_000_000)
    before = tree_state(root / "releases")
    broken = edgesdk(*deploy_args(ssh_server, root, padded.path, "--ssh-command",
                                  faulty_ssh_command("flip:padding.bin", ssh_server.process.pid)))
    assert broken.returncode == 8, broken.stderr
    assert "arrived damaged" in broken.stderr
    assert "padding.bin" in broken.stderr
    assert "fix:" in broken.stderr
    assert current_id(root) == tiny_bundle.bundle_id
    assert tree_state(root / "releases") == before
    assert os.readlink(runtime / "current") == "older"
    assert_runs(root)
    # The other files were received intact and stay in staging: the next deploy sends padding.bin only.
    again = edgesdk(*deploy_args(ssh_server, root, padded.path, "--json"))
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["bytes_sent"] == 1_000_000
    assert current_id(root) == padded.bundle_id
    assert f"runtime/current -> {key} (was older)" in again.stderr
    assert os.readlink(runtime / "current") == key


def test_changed_or_unknown_host_keys_are_refused(own_ssh_server, tiny_bundle, tmp_path):
    server, root = own_ssh_server, tmp_path / "board"
    assert edgesdk(*deploy_args(server, root, "--status")).returncode == 0
    server.new_host_key()
    for extra in ((), ("--accept-new-host-key",)):
        refused = edgesdk(*deploy_args(server, root, tiny_bundle.path, *extra))
        assert refused.returncode == 8
        assert "host key" in refused.stderr
        assert "has changed" in refused.stderr
        assert "ssh-keygen -R" in refused.stderr
    assert not root.exists()
    server.known_hosts.write_text("")
    unknown = edgesdk(*deploy_args(server, root, "--status"))
    assert unknown.returncode == 8
    assert "no host key in known_hosts" in unknown.stderr
    assert "--accept-new-host-key" in unknown.stderr
    accepted = edgesdk(*deploy_args(server, root, "--status", "--accept-new-host-key"))
    assert accepted.returncode == 0, accepted.stderr
    assert f"[127.0.0.1]:{server.port}" in server.known_hosts.read_text()


def test_wrong_user_wrong_key_and_unreachable_port(ssh_server, tiny_bundle, tmp_path):
    root = tmp_path / "board"
    wrong_user = deploy_args(ssh_server, root, tiny_bundle.path)
    wrong_user[wrong_user.index("--host") + 1] = f"nosuchuser@127.0.0.1:{ssh_server.port}"
    stranger = keygen(tmp_path / "stranger", "not authorised")
    closed = deploy_args(ssh_server, root, tiny_bundle.path)
    closed[closed.index("--host") + 1] = f"{ssh_server.user}@127.0.0.1:{free_port()}"
    cases = [(wrong_user, "refused the login of user nosuchuser"),
             (deploy_args(ssh_server, root, tiny_bundle.path, key=stranger), "refused the login"),
             (closed, "cannot reach")]
    for args, expected in cases:
        proc = edgesdk(*args)
        assert proc.returncode == 8, proc.stderr
        assert expected in proc.stderr
        assert "fix:" in proc.stderr
        assert "Traceback" not in proc.stderr
    assert not root.exists()


def test_a_bundle_that_fails_verify_never_leaves_this_machine(tiny_bundle, tmp_path):
    broken = shutil.copytree(tiny_bundle.path, tmp_path / "broken")
    data = bytearray((broken / "model.onnx.data").read_bytes())
    data[100] ^= 1
    (broken / "model.onnx.data").write_bytes(bytes(data))
    proc = edgesdk("deploy", broken, "--host", f"nobody@127.0.0.1:{free_port()}")
    assert proc.returncode == 5
    assert "failed verification" in proc.stderr
    assert "model.onnx.data" in proc.stderr
    assert "fix:" in proc.stderr
    assert "probe" not in proc.stderr  # refused before any connection


def test_no_space_on_the_board_is_refused_before_writing(ssh_server, tiny_bundle, tmp_path):
    root = tmp_path / "small"
    root.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(root)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.decode().strip()})")
    try:
        big = bundle_variant(tiny_bundle.path, tmp_path / "big", "big", padding=2_000_000)
        proc = edgesdk(*deploy_args(ssh_server, root, big.path))
        assert proc.returncode == 8
        assert "not enough disk space" in proc.stderr
        assert "MB free" in proc.stderr
        assert "fix:" in proc.stderr
        assert tree_state(root) == {}
    finally:
        subprocess.run(["umount", str(root)], check=True)


def test_rollback_and_status(ssh_server, tiny_bundle, tmp_path):
    root = tmp_path / "board"
    second = bundle_variant(tiny_bundle.path, tmp_path / "second", "second release")
    assert edgesdk(*deploy_args(ssh_server, root, tiny_bundle.path)).returncode == 0
    assert edgesdk(*deploy_args(ssh_server, root, second.path)).returncode == 0
    status = edgesdk(*deploy_args(ssh_server, root, "--status", "--json"))
    info = json.loads(status.stdout)
    assert (info["current"], info["previous"]) == (second.bundle_id, tiny_bundle.bundle_id)
    assert {r["id"] for r in info["releases"]} == {second.bundle_id, tiny_bundle.bundle_id}

    back = edgesdk(*deploy_args(ssh_server, root, "--rollback"))
    assert back.returncode == 0, back.stderr
    assert f"from {second.bundle_id} to {tiny_bundle.bundle_id}" in back.stdout
    assert current_id(root) == tiny_bundle.bundle_id
    assert_runs(root)
    forth = edgesdk(*deploy_args(ssh_server, root, "--rollback"))
    assert forth.returncode == 0
    assert current_id(root) == second.bundle_id
    unknown = edgesdk(*deploy_args(ssh_server, root, "--rollback", "--release", "0123456789abcdef"))
    assert unknown.returncode == 8
    assert "--release '0123456789abcdef' is not a release" in unknown.stderr
    assert current_id(root) == second.bundle_id


@pytest.mark.network
def test_full_runtime_install_from_the_package_index(ssh_server, tiny_bundle, tmp_path):
    """The runtime venv without inherited packages: pip fetches numpy, onnxruntime ... on the "board"."""
    base_python = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    if not base_python.exists():
        pytest.skip(f"no base interpreter at {base_python}")
    root = tmp_path / "board"
    args = deploy_args(ssh_server, root, tiny_bundle.path)
    args[args.index("--remote-python") + 1] = base_python
    args.remove("--runtime-venv-system-site-packages")
    proc = edgesdk(*args, timeout=900)
    assert proc.returncode == 0, proc.stderr
    venv = root / "runtime" / "current"
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    assert list((venv / "lib").glob("python*/site-packages/onnxruntime"))
    assert_runs(root)


def test_a_command_past_its_deadline_is_stopped_on_the_board_too(ssh_server, tmp_path):
    """ssh giving up leaves nothing running on the board: the board enforces the deadline itself."""
    from edgesdk.deploy.transport import DeployError, HostSpec, SshOptions, SshTransport

    transport = SshTransport(HostSpec.parse(ssh_server.destination), SshOptions(
        ssh_config="/dev/null", identity=str(ssh_server.user_key),
        options=(f"UserKnownHostsFile={ssh_server.known_hosts}", "GlobalKnownHostsFile=/dev/null")))
    marker = tmp_path / "still-running"
    try:
        started = time.monotonic()
        with pytest.raises(DeployError, match="the smoke test on .* did not finish within 2 s"):
            transport.run(["sh", "-c", f"sleep 6 && touch {marker}"], timeout=2, what="the smoke test")
        assert time.monotonic() - started < 20  # the board's answer, not ssh's grace period
        assert transport.run(["echo", "fine"], timeout=30).stdout.strip() == b"fine"
    finally:
        transport.close()
    time.sleep(6)
    assert not marker.exists()  # the remote command was killed, not left to finish


def test_a_command_killed_on_the_board_is_named_not_taken_for_a_lost_connection(ssh_server):
    """A smoke test or engine build killed by a signal (the OOM killer, a crash) is the command's failure;
    ssh alone would exit 255 for it, its code for a failed connection."""
    from edgesdk.deploy.transport import HostSpec, SshOptions, SshTransport

    transport = SshTransport(HostSpec.parse(ssh_server.destination), SshOptions(
        ssh_config="/dev/null", identity=str(ssh_server.user_key),
        options=(f"UserKnownHostsFile={ssh_server.known_hosts}", "GlobalKnownHostsFile=/dev/null")))
    try:
        killed = transport.run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                               timeout=60, what="the smoke test")
        assert killed.returncode == 137
        assert b"killed by SIGKILL" in killed.stderr
        assert b"out-of-memory" in killed.stderr
        crashed = transport.run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"],
                                timeout=60, what="the TensorRT engine build")
        assert crashed.returncode == 139
        assert b"killed by SIGSEGV: the process crashed" in crashed.stderr
        # The command's own exit status 124 long before its deadline is not a timeout.
        own = transport.run(["sh", "-c", "exit 124"], timeout=60, what="the smoke test")
        assert own.returncode == 124
    finally:
        transport.close()
