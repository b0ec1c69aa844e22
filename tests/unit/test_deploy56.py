"""Review 56 of the board side of deploy (board_ops): a commit into releases/ on another file system, and a switch
whose runtime/current is not deploy's link."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from edgesdk.deploy.remote import Board
from edgesdk.deploy.transfer import bundle_files
from edgesdk.deploy.transport import DeployError, LocalTransport
from tests.unit.test_deploy_helper import commit_by_hand, make_bundle, stream_for


@pytest.fixture
def board(tmp_path) -> Board:
    root = str(tmp_path / "board")
    return Board(LocalTransport(root), sys.executable, root)


@pytest.fixture
def other_file_system(tmp_path):
    """A directory on another file system than ``tmp_path`` (/dev/shm, a tmpfs), removed after the test."""
    if not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a file system of its own")
    folder = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="edgesdk-test-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_commit_into_releases_on_another_file_system_says_so_and_keeps_the_transfer(board, tmp_path,
                                                                                       other_file_system):
    """releases/ linked to another disk: rename(2) moves nothing across file systems (EXDEV). The commit failed with
    "<staging>: Invalid cross-device link" and the fix "check the permissions and free space", after the whole
    transfer, on every deploy; it now names both folders and says to keep the root on one file system."""
    root = Path(board.root)
    root.mkdir()
    os.symlink(other_file_system, root / "releases")
    bundle = make_bundle(tmp_path / "a", {"w": b"1"})
    board.call("receive", {"bundle_id": bundle.bundle_id, "links": {}}, stdin=stream_for(bundle))
    with pytest.raises(DeployError) as refused:
        board.call("commit", {"bundle_id": bundle.bundle_id,
                              "manifest_sha256": bundle_files(bundle)["manifest.json"]["sha256"]})
    assert "different file systems" in refused.value.problem
    assert str(root / "releases") in refused.value.problem
    assert "one file system" in refused.value.fix
    assert "permissions" not in refused.value.fix
    assert os.listdir(other_file_system) == []
    assert (root / "staging" / bundle.bundle_id / "w").read_bytes() == b"1"  # resumable where the root is moved


def test_a_switch_onto_a_runtime_current_directory_names_it_and_moves_nothing(board, tmp_path):
    """runtime/current a directory (a venv made there by hand): the rename of the new link onto it failed, and the
    error named the switch's temporary link (runtime/.current.tmp-<pid>, removed by then) with a fix about
    permissions and free space. Like a ``current`` directory, it is now refused by its name before any link moves."""
    root = Path(board.root)
    first, second = make_bundle(tmp_path / "a", {"w": b"1"}), make_bundle(tmp_path / "b", {"w": b"2"})
    commit_by_hand(board, first)
    board.call("switch", {"bundle_id": first.bundle_id})
    commit_by_hand(board, second)
    venv = root / "runtime" / "k1"
    venv.mkdir(parents=True)
    (venv / "edgesdk-runtime.json").write_text(json.dumps({"key": "k1", "version": "0"}))
    (root / "runtime" / "current").mkdir()
    with pytest.raises(DeployError) as refused:
        board.call("switch", {"bundle_id": second.bundle_id, "runtime_key": "k1"})
    assert refused.value.problem.startswith(f"{root / 'runtime' / 'current'} on the board is a directory, not the "
                                            "link to a runtime")
    assert ".tmp-" not in refused.value.problem
    assert "move that directory away" in refused.value.fix
    assert os.readlink(root / "current") == f"releases/{first.bundle_id}"
    assert (root / "runtime" / "current").is_dir()
    assert sorted(os.listdir(root / "runtime")) == ["current", "k1"]
