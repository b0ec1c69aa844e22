"""Review 59 of the board side of deploy (board_transfer, board_ops): a receive the disk had no room for keeps what
arrived whole for the next deploy, and says the free space in MB; a file or a link where staging/<id> or
releases/<id> goes; and what prune reports removed.

Every board operation runs the real helper through a LocalTransport; the full disk is a small tmpfs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgesdk.deploy.remote import Board
from edgesdk.deploy.report import Reporter
from edgesdk.deploy.transfer import bundle_files, make_plan, send
from edgesdk.deploy.transport import DeployError, LocalTransport
from tests._utils.small_disk import small_disk as mounted_small_disk
from tests.unit.test_deploy_helper import make_bundle, stream_for

TWO_DAYS_AGO = time.time() - 2 * 86400


@pytest.fixture
def board(tmp_path) -> Board:
    root = str(tmp_path / "board")
    return Board(LocalTransport(root), sys.executable, root)


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs (mounting one needs root); unmounted after the test."""
    with mounted_small_disk(tmp_path / "small") as root:
        yield root


def commit(board, bundle) -> dict:
    sha = bundle_files(bundle)["manifest.json"]["sha256"]
    return board.call("commit", {"bundle_id": bundle.bundle_id, "manifest_sha256": sha})


def test_a_receive_the_disk_has_no_room_for_keeps_the_files_that_arrived_whole_and_the_next_deploy_resumes(
        small_disk, tmp_path):
    """The refusal said "29556736 bytes free now" and removed the whole staging directory, so the deploy after
    freeing space sent again what had arrived. The files that arrived whole stay (the next probe finds them by their
    sha256); the one the disk had no room for goes, its room with it."""
    board = Board(LocalTransport(str(small_disk)), sys.executable, str(small_disk))
    small = os.urandom(200_000)
    bundle = make_bundle(tmp_path / "b", {"a.bin": small, "b.bin": os.urandom(1_000_000)})
    staging = small_disk / "staging" / bundle.bundle_id

    with pytest.raises(DeployError) as info:
        board.call("receive", {"bundle_id": bundle.bundle_id}, stdin=stream_for(bundle))
    assert info.value.problem.startswith(f"the board ran out of disk space writing into {staging} (")
    assert info.value.problem.endswith(" MB free on its disk now)")
    assert "bytes free" not in info.value.problem
    assert info.value.fix == ("free space on the board (or choose --remote-root on a larger disk) and deploy again: "
                              "it resumes from the 1 file(s) (0.2 MB) that arrived whole, kept in "
                              f"{staging}; the current release is untouched")
    assert sorted(os.listdir(staging)) == ["a.bin"]
    assert (staging / "a.bin").read_bytes() == small

    subprocess.run(["mount", "-o", "remount,size=8m", str(small_disk)], check=True)  # space freed
    files = bundle_files(bundle)
    facts = board.call("probe", {"bundle_id": bundle.bundle_id, "files": files,
                                 "manifest_sha256": files["manifest.json"]["sha256"]})
    plan = make_plan(files, facts["plan"])
    assert "a.bin" in plan.in_staging
    assert "a.bin" not in dict(plan.send)
    send(board, bundle, files, plan, Reporter(1, write=lambda line: None))
    assert commit(board, bundle)["problems"] == []
    assert (small_disk / "releases" / bundle.bundle_id / "b.bin").read_bytes() == (bundle.path / "b.bin").read_bytes()


def test_a_receive_whose_first_file_finds_no_room_leaves_no_staging_directory(small_disk, tmp_path):
    board = Board(LocalTransport(str(small_disk)), sys.executable, str(small_disk))
    bundle = make_bundle(tmp_path / "b", {"big.bin": os.urandom(1_000_000)})
    with pytest.raises(DeployError) as info:
        board.call("receive", {"bundle_id": bundle.bundle_id}, stdin=stream_for(bundle))
    assert info.value.problem.endswith(" MB free on its disk now)")
    assert "nothing had arrived whole" in info.value.fix
    assert os.listdir(small_disk / "staging") == []


def _put(path: Path, kind: str, outside: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "file":
        path.write_bytes(b"not a directory")
    elif kind == "dangling link":
        path.symlink_to(outside / "unmounted")
    else:  # a link to a directory elsewhere: what it holds is not the deploy's
        (outside / "dir").mkdir(parents=True)
        (outside / "dir" / "keep").write_bytes(b"theirs")
        path.symlink_to(outside / "dir")


@pytest.mark.parametrize("kind", ["file", "dangling link", "link to a directory"])
def test_a_file_or_a_link_at_the_staging_directory_is_replaced_by_one(board, tmp_path, kind):
    """os.makedirs(staging/<id>) failed with "File exists" (a file, a link to nothing), every deploy of the bundle
    alike, with a fix about permissions and free space; a link to a directory elsewhere was written through."""
    bundle = make_bundle(tmp_path / "b", {"w": b"weights"})
    staging = Path(board.root) / "staging" / bundle.bundle_id
    outside = tmp_path / "outside"
    outside.mkdir()
    _put(staging, kind, outside)

    board.call("receive", {"bundle_id": bundle.bundle_id, "links": {}}, stdin=stream_for(bundle))
    assert staging.is_dir()
    assert not staging.is_symlink()
    assert (staging / "w").read_bytes() == b"weights"
    assert commit(board, bundle)["problems"] == []
    if kind == "link to a directory":
        assert sorted(os.listdir(outside / "dir")) == ["keep"]


@pytest.mark.parametrize(("kind", "words"), [("file", "a file of 15 bytes"),
                                             ("dangling link", "a link to {outside}/unmounted, which does not exist")])
def test_a_file_or_a_link_to_nothing_at_the_release_directory_is_refused_naming_it(board, tmp_path, kind, words):
    """os.replace(staging/<id>, releases/<id>) failed with "Not a directory" after the whole transfer, every deploy
    of the bundle alike, with a fix about permissions and free space."""
    bundle = make_bundle(tmp_path / "b", {"w": b"weights"})
    board.call("receive", {"bundle_id": bundle.bundle_id, "links": {}}, stdin=stream_for(bundle))
    release = Path(board.root) / "releases" / bundle.bundle_id
    outside = tmp_path / "outside"
    outside.mkdir()
    _put(release, kind, outside)

    with pytest.raises(DeployError) as info:
        commit(board, bundle)
    staging = Path(board.root) / "staging" / bundle.bundle_id
    assert info.value.problem == (f"{release} on the board is {words.format(outside=outside)}, not a release "
                                  "directory, so the commit cannot rename the bundle's transfer there; nothing was "
                                  f"moved, and it stays in {staging}")
    assert info.value.fix.startswith(f"remove it on the board (rm {release}), then deploy again")
    assert (staging / "w").read_bytes() == b"weights"
    release.unlink()
    assert commit(board, bundle)["problems"] == []
    assert (release / "w").read_bytes() == b"weights"


def test_prune_reports_only_what_it_removed_and_removes_files_and_links_themselves(board, tmp_path):
    """rmtree(ignore_errors=True) removed neither a file in staging/ nor a release that is a link, and prune reported
    both removed."""
    root = Path(board.root)
    outside = tmp_path / "outside"
    (outside / "release").mkdir(parents=True)
    (outside / "release" / "keep").write_bytes(b"theirs")
    (outside / "staged").mkdir()
    staging, releases = root / "staging", root / "releases"
    staging.mkdir(parents=True)
    releases.mkdir()
    (staging / "aaaa1111").write_bytes(b"a file")
    (staging / "cccc3333").symlink_to(outside / "staged")
    (staging / "dddd4444").mkdir()
    for name in ("aaaa1111", "cccc3333", "dddd4444"):
        os.utime(staging / name, (TWO_DAYS_AGO, TWO_DAYS_AGO), follow_symlinks=False)
    (releases / "1111aaaa").mkdir()  # newer: kept
    os.utime(releases / "1111aaaa", (TWO_DAYS_AGO, TWO_DAYS_AGO))
    os.utime(outside / "release", (TWO_DAYS_AGO - 3600, TWO_DAYS_AGO - 3600))
    (releases / "2222bbbb").symlink_to(outside / "release")

    reply = board.call("prune", {"keep": 1})
    assert sorted(reply["removed"]) == ["2222bbbb", "staging/aaaa1111", "staging/cccc3333", "staging/dddd4444"]
    assert reply["kept"] == ["1111aaaa"]
    assert os.listdir(staging) == []
    assert os.listdir(releases) == ["1111aaaa"]
    assert sorted(os.listdir(outside)) == ["release", "staged"]  # a link goes, not what it points to
    assert os.listdir(outside / "release") == ["keep"]


def test_prune_removes_a_link_to_nothing_in_staging(board, tmp_path):
    """Its mtime was read through the link, so the whole prune failed ("No such file or directory")."""
    staging = Path(board.root) / "staging"
    staging.mkdir(parents=True)
    (staging / "bbbb2222").symlink_to(tmp_path / "unmounted")
    os.utime(staging / "bbbb2222", (TWO_DAYS_AGO, TWO_DAYS_AGO), follow_symlinks=False)
    (staging / "eeee5555").symlink_to(tmp_path / "unmounted")  # new: a day's grace, as a directory has
    assert board.call("prune", {"keep": 1})["removed"] == ["staging/bbbb2222"]
    assert os.listdir(staging) == ["eeee5555"]
