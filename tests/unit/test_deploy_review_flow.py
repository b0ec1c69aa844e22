"""Deploy flow: concurrent deploys on one board, the switch's all-or-nothing, ssh client and host strings."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from edgesdk.bundle import verify_bundle
from edgesdk.deploy.remote import Board
from edgesdk.deploy.transfer import bundle_files
from edgesdk.deploy.transport import LocalTransport
from tests._utils.small_disk import small_disk as mounted_small_disk
from tests.unit.test_deploy_helper import make_bundle, stream_for


@pytest.fixture
def board(tmp_path) -> Board:
    root = str(tmp_path / "board")
    return Board(LocalTransport(root), sys.executable, root)


def test_two_deploys_of_one_bundle_both_commit(board, tmp_path):
    """Both transfers land in staging/<id> (the lock orders them), then both commit: the first commit takes
    the staging directory, and the second must find the sound release, not report a failed verification."""
    bundle = make_bundle(tmp_path / "b", {"w": os.urandom(1000)})
    sha = bundle_files(bundle)["manifest.json"]["sha256"]
    for _deploy in range(2):
        reply = board.call("receive", {"bundle_id": bundle.bundle_id, "links": {}}, stdin=stream_for(bundle))
        assert reply["eof"] is False
    first = board.call("commit", {"bundle_id": bundle.bundle_id, "manifest_sha256": sha})
    assert first["problems"] == []
    assert not first.get("kept")
    second = board.call("commit", {"bundle_id": bundle.bundle_id, "manifest_sha256": sha})
    assert second["problems"] == []
    assert second["kept"] is True
    release = Path(board.root) / "releases" / bundle.bundle_id
    assert verify_bundle(release).bundle_id == bundle.bundle_id
    assert not (Path(board.root) / "staging" / bundle.bundle_id).exists()
    board.call("switch", {"bundle_id": bundle.bundle_id})
    # A second deploy whose transfer came after the first one's commit sent a part only (its probe had
    # seen the rest in staging): the release is sound, so that commit keeps it too.
    names = sorted(bundle_files(bundle))[:1]
    board.call("receive", {"bundle_id": bundle.bundle_id, "links": {}}, stdin=stream_for(bundle, names))
    late = board.call("commit", {"bundle_id": bundle.bundle_id, "manifest_sha256": sha})
    assert late == {"problems": [], "kept": True, "ok": True}
    assert verify_bundle(Path(board.root) / "current").bundle_id == bundle.bundle_id


@pytest.mark.parametrize("command", ["ssh -o 'ProxyJump=me@gateway", 'ssh -o "User=pi', "ssh \\"])
def test_an_ssh_command_that_cannot_be_split_is_named(tmp_path, command):
    """An unclosed quote in --ssh-command / $EDGESDK_SSH was shlex's ValueError traceback."""
    from click.testing import CliRunner

    from edgesdk.cli import main

    result = CliRunner().invoke(main, ["deploy", "--status", "--host", "pi@board", "--ssh-command", command])
    assert result.exit_code == 8, result.output
    assert isinstance(result.exception, SystemExit)
    assert f"the ssh client command {command!r} (--ssh-command or $EDGESDK_SSH) cannot be split" in result.output
    assert "fix: close its quotes" in result.output


@pytest.mark.parametrize("text", ["pi@[::1]:2222", "[fe80::1%eth0]", "root@[fe80::1%br-lan]:22", "pi@board:22"])
def test_a_host_reads_back_as_it_was_given(text):
    """The label in every message is the --host text: 'pi@::1:2222' named another address (::1:2222)."""
    from edgesdk.deploy.transport import HostSpec

    spec = HostSpec.parse(text)
    assert str(spec) == text
    assert HostSpec.parse(str(spec)) == spec
    assert "[" not in spec.destination  # what ssh gets


@pytest.mark.parametrize("text", ["pi@fe80::1", "::1", "pi@fe80::1%eth0"])
def test_an_ipv6_address_without_brackets_is_told_to_use_them(text):
    from edgesdk.deploy.transport import DeployError, HostSpec

    with pytest.raises(DeployError, match=r"an IPv6 address without brackets") as refused:
        HostSpec.parse(text)
    assert "put the IPv6 address in brackets, e.g. --host pi@[fe80::1%eth0]" in refused.value.fix


def test_an_unreachable_ipv6_board_is_named_as_given(tmp_path):
    """Real ssh to a closed port on ::1: the message names the board with its brackets and port."""
    import shutil
    import socket

    from click.testing import CliRunner

    from edgesdk.cli import main

    if shutil.which("ssh") is None:
        pytest.skip("OpenSSH client not installed")
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
            port = sock.getsockname()[1]
    except OSError:
        pytest.skip("no IPv6 loopback here")
    result = CliRunner().invoke(main, ["deploy", "--status", "--host", f"pi@[::1]:{port}", "--ssh-config",
                                       "/dev/null", "--ssh-option", f"UserKnownHostsFile={tmp_path / 'kh'}"])
    assert result.exit_code == 8, result.output
    assert f"cannot reach pi@[::1]:{port}" in result.output


@pytest.fixture
def small_disk(tmp_path):
    """A 512 KiB tmpfs (root only), unmounted afterwards."""
    with mounted_small_disk(tmp_path / "small", "512k") as mount:
        yield mount


def fill(disk: Path) -> Path:
    """Write a file until the disk is full; returns it."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError:
            pass
    return filler


def test_a_switch_that_fails_half_way_leaves_current_as_it_was(small_disk, tmp_path):
    """The first switch on a board whose disk filled up after the commit: current was set, then its history
    line could not be written and the switch was reported failed with current left pointing at the release.
    The board's answer (a refusal) tells the host nothing happened, so nothing may have."""
    from edgesdk.deploy.transport import DeployError
    from tests.unit.test_deploy_helper import commit_by_hand

    root = small_disk / "edgesdk"
    board = Board(LocalTransport(str(root)), sys.executable, str(root))
    bundle = make_bundle(tmp_path / "b", {"w": os.urandom(1000)})
    commit_by_hand(board, bundle)
    filler = fill(small_disk)
    with pytest.raises(DeployError, match="No space left on device"):
        board.call("switch", {"bundle_id": bundle.bundle_id, "action": "deploy"})
    assert not os.path.lexists(root / "current")
    assert not os.path.lexists(root / "previous")
    filler.unlink()
    assert board.call("switch", {"bundle_id": bundle.bundle_id})["from"] is None
    assert os.readlink(root / "current") == f"releases/{bundle.bundle_id}"


def test_a_failed_switch_puts_back_previous_and_the_runtime_too(small_disk, tmp_path):
    """A later deploy whose history line needs a new page of a full disk: current, previous and runtime/current
    all go back to what they were (the runtime moves first, the history line is written last)."""
    import json

    from edgesdk.deploy.transport import DeployError
    from tests.unit.test_deploy_helper import commit_by_hand

    root = small_disk / "edgesdk"
    board = Board(LocalTransport(str(root)), sys.executable, str(root))
    old, new = (make_bundle(tmp_path / name, {"w": os.urandom(1000)}, name) for name in ("old", "new"))

    def install(key):
        (root / "runtime" / key).mkdir(parents=True)
        (root / "runtime" / key / "edgesdk-runtime.json").write_text(json.dumps({"key": key, "version": "0"}))

    install("k1")
    commit_by_hand(board, old)
    board.call("switch", {"bundle_id": old.bundle_id, "runtime_key": "k1"})
    install("k2")
    history = root / "history.jsonl"
    line = history.read_text()
    filler = json.dumps({"time": 0, "action": "deploy", "from": None, "to": "x", "pad": ""})
    pad = 4096 - len(line) - len(filler) - 1  # history.jsonl ends on a page boundary
    history.write_text(line + filler[:-2] + "x" * pad + '"}\n')
    assert history.stat().st_size == 4096
    commit_by_hand(board, new)
    disk_filler = fill(small_disk)
    with pytest.raises(DeployError, match="No space left on device"):
        board.call("switch", {"bundle_id": new.bundle_id, "runtime_key": "k2"})
    assert os.readlink(root / "current") == f"releases/{old.bundle_id}"
    assert not os.path.lexists(root / "previous")
    assert os.readlink(root / "runtime" / "current") == "k1"
    disk_filler.unlink()
    assert board.call("switch", {"bundle_id": new.bundle_id, "runtime_key": "k2"})["from"] == old.bundle_id
    assert os.readlink(root / "previous") == f"releases/{old.bundle_id}"


def test_a_smoke_test_past_its_deadline_names_the_option_that_gives_it_longer(tiny_bundle, tmp_path):
    """The fix said 'raise the timeout' and no option raised it; the board keeps its release meanwhile."""
    from edgesdk.deploy.orchestrate import deploy
    from edgesdk.deploy.report import Reporter
    from edgesdk.deploy.session import DeployOptions
    from edgesdk.deploy.transport import DeployError
    from tests._utils.deploy import bundle_variant, current_id, edgesdk

    root = tmp_path / "dir"
    first = edgesdk("deploy", tiny_bundle.path, "--to", root, "--smoke-timeout", 600)
    assert first.returncode == 0, first.stderr
    second = bundle_variant(tiny_bundle.path, tmp_path / "second", "second")
    with pytest.raises(DeployError) as late:
        deploy(second.path, DeployOptions(to=root, smoke_timeout=0.05), Reporter(8, write=lambda line: None))
    assert f"the smoke test on local directory {root} did not finish within 0.05 s (stopped)" in late.value.problem
    assert "the board keeps its current release" in late.value.fix
    assert "--smoke-timeout SECONDS" in late.value.fix
    assert current_id(root) == tiny_bundle.bundle_id
    short = edgesdk("deploy", second.path, "--to", root, "--smoke-timeout", 0.5)
    assert short.returncode == 2
    assert "--smoke-timeout" in short.stderr


@pytest.mark.parametrize(("text", "bad"), [("pi@b`reboot`x", "'`'"), ("a;touch@board", "';'"),
                                           ("pi@board|x", "'|'"), ("pi@$(id)", "'$' '(' ')'")])
def test_shell_characters_in_a_host_are_refused_by_name(tmp_path, text, bad):
    """ssh substitutes the user and host into a ProxyCommand or Match exec that its shell runs; an ssh older than
    9.6 ran them, a newer one refuses with 'invalid characters' that deploy called a network failure."""
    from click.testing import CliRunner

    from edgesdk.cli import main

    result = CliRunner().invoke(main, ["deploy", "--status", "--host", text, "--ssh-config", "/dev/null",
                                       "--ssh-option", f"ProxyCommand=sh -c 'cd {tmp_path} && echo %h %r'"])
    assert result.exit_code == 8, result.output
    assert f"--host {text!r}: {bad} cannot be part of a user or board name" in result.output
    assert "check the network" not in result.output
    assert not (tmp_path / "pwned").exists()
