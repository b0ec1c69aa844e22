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
