"""Receiving a bundle into staging/<id> on the board, review 53: what a receive finds there at a file's name (a
directory, a file where a directory goes, a link) no longer fails the transfer or gets written through; the
board's verify finds an unlisted link to a directory as edgesdk.bundle.verify_bundle does; a bundle file gone
from this machine while it was sent is named as changed.

Every board operation runs the real helper through a LocalTransport; nothing is mocked."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from edgesdk.bundle import BundleError, verify_bundle
from edgesdk.deploy.remote import Board
from edgesdk.deploy.report import Reporter
from edgesdk.deploy.transfer import bundle_files, make_plan, send
from edgesdk.deploy.transport import DeployError, LocalTransport
from tests.unit.test_deploy_helper import deploy_by_hand, frame, make_bundle, stream_for


@pytest.fixture
def board(tmp_path) -> Board:
    root = str(tmp_path / "board")
    return Board(LocalTransport(root), sys.executable, root)


def commit(board, bundle) -> list[str]:
    sha = bundle_files(bundle)["manifest.json"]["sha256"]
    return board.call("commit", {"bundle_id": bundle.bundle_id, "manifest_sha256": sha})["problems"]


def test_a_receive_clears_a_directory_at_a_files_name_and_a_file_where_a_directory_goes(board, tmp_path):
    """A directory in staging/<id> at a listed file's name (or its .partial), and a file where a listed file's
    directory goes: the rename of the received file over the directory failed ("Is a directory", with the fix
    "check the permissions and free space"), and so did every later deploy of the bundle. Staging belongs to the
    deploy: the receive removes them, and the transfer commits."""
    bundle = make_bundle(tmp_path / "a", {"w": os.urandom(100), "sub/x": os.urandom(50)}, "a")
    staging = Path(board.root) / "staging" / bundle.bundle_id
    (staging / "w" / "deep").mkdir(parents=True)
    (staging / "w" / "deep" / "stray").write_bytes(b"x")
    (staging / "manifest.json.partial").mkdir()
    (staging / "sub").write_bytes(b"a file where the directory goes")

    reply = board.call("receive", {"bundle_id": bundle.bundle_id, "links": {}}, stdin=stream_for(bundle))
    assert [r["ok"] for r in reply["results"]] == [True] * 4
    assert commit(board, bundle) == []
    release = Path(board.root) / "releases" / bundle.bundle_id
    assert (release / "w").read_bytes() == (bundle.path / "w").read_bytes()
    assert (release / "sub" / "x").read_bytes() == (bundle.path / "sub" / "x").read_bytes()
    verify_bundle(release)


def test_a_directory_at_a_linked_files_name_is_cleared_too(board, tmp_path):
    """A file reused from a release is hard-linked into staging: os.unlink of a directory there failed."""
    shared = os.urandom(200)
    one = make_bundle(tmp_path / "b1", {"w": shared, "t": b"1"}, "one")
    deploy_by_hand(board, one)
    two = make_bundle(tmp_path / "b2", {"w": shared, "t": b"2"}, "two")
    staging = Path(board.root) / "staging" / two.bundle_id
    (staging / "w").mkdir(parents=True)
    (staging / "w" / "stray").write_bytes(b"x")

    board.call("receive", {"bundle_id": two.bundle_id, "links": {"w": one.bundle_id}},
               stdin=stream_for(two, ["manifest.json", "manifest.sha256", "t"]))
    assert commit(board, two) == []
    root = Path(board.root)
    assert os.stat(root / "releases" / two.bundle_id / "w").st_ino == os.stat(root / "releases" / one.bundle_id / "w").st_ino


def test_a_receive_never_writes_through_a_link_in_staging(board, tmp_path):
    """A link in staging at a linked file's name that points nowhere: os.path.exists said nothing was there, the hard
    link failed (EEXIST) and its copy fallback wrote the release's file to where the link pointed, outside the deploy
    root. A link at a received file's .partial: the bytes went to where it pointed, and the rename then put the link
    itself into the release, where the commit's checks followed it and passed."""
    shared = os.urandom(200)
    one = make_bundle(tmp_path / "b1", {"w": shared, "t": b"1"}, "one")
    deploy_by_hand(board, one)
    two = make_bundle(tmp_path / "b2", {"w": shared, "t": os.urandom(300)}, "two")
    staging = Path(board.root) / "staging" / two.bundle_id
    staging.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside / "linked", staging / "w")
    os.symlink(outside / "received", staging / "t.partial")

    board.call("receive", {"bundle_id": two.bundle_id, "links": {"w": one.bundle_id}},
               stdin=stream_for(two, ["manifest.json", "manifest.sha256", "t"]))
    assert sorted(os.listdir(outside)) == []
    assert commit(board, two) == []
    release = Path(board.root) / "releases" / two.bundle_id
    assert not (release / "w").is_symlink()
    assert not (release / "t").is_symlink()
    assert (release / "t").read_bytes() == (two.path / "t").read_bytes()


def test_the_board_finds_an_unlisted_link_to_a_directory_in_a_release_as_verify_bundle_does(board, tmp_path):
    """verify_dir mirrors verify_bundle, which refuses an unlisted link to a directory; os.walk lists such a link
    among the directories, so the board did not see it: the probe called the release sound and deploy sent nothing,
    while edgesdk on the board refused to run it. The probe finds it now and the deploy replaces the release."""
    bundle = make_bundle(tmp_path / "a", {"w": os.urandom(100)}, "a")
    deploy_by_hand(board, bundle)
    release = Path(board.root) / "releases" / bundle.bundle_id
    (tmp_path / "data").mkdir()
    os.symlink(tmp_path / "data", release / "models")
    with pytest.raises(BundleError, match="models: not listed in the manifest"):
        verify_bundle(release)

    files = bundle_files(bundle)
    facts = board.call("probe", {"bundle_id": bundle.bundle_id, "files": files,
                                 "manifest_sha256": files["manifest.json"]["sha256"]})
    assert facts["release"] == {"problems": ["models: not listed in the manifest (a link to a directory)"]}
    assert facts["plan"]["w"] == {"state": "link", "from": bundle.bundle_id}
    board.call("receive", {"bundle_id": bundle.bundle_id, "links": {n: bundle.bundle_id for n in files}},
               stdin=b'{"end": true}\n')
    assert commit(board, bundle) == []
    verify_bundle(release)
    assert (tmp_path / "data").is_dir()


def test_a_bundle_file_removed_on_this_machine_while_it_was_sent_is_named_as_changed(board, tmp_path):
    """A file that arrived damaged is checked against this machine's copy, to tell a bundle changed here from a
    fault of the board or the link; where that copy was gone by then (a build into the same --out renames the old
    bundle away), the check's own FileNotFoundError ended deploy with a traceback. It is named as changed now."""
    bundle = make_bundle(tmp_path / "x", {"a": os.urandom(1000), "b": os.urandom(1000)}, "x")
    files = bundle_files(bundle)
    # b resumes after 300 bytes the board holds; they are not b's, so the host says so before it sends b whole
    board.call("receive", {"bundle_id": bundle.bundle_id}, stdin=frame("b", os.urandom(300), size=1000,
                                                                       sha=files["b"]["sha256"]))
    (bundle.path / "a").write_bytes(os.urandom(1000))  # rewritten after the manifest: arrives damaged
    facts = board.call("probe", {"bundle_id": bundle.bundle_id, "files": files,
                                 "manifest_sha256": files["manifest.json"]["sha256"]})
    plan = make_plan(files, facts["plan"])
    assert [name for name, _ in plan.send][:2] == ["a", "b"]
    assert "b" in plan.prefixes

    def write(line: str) -> None:  # a is gone once sent: removed as b's line is written, before b is sent
        if "sending it whole" in line:
            (bundle.path / "a").unlink()

    with pytest.raises(DeployError) as failed:
        send(board, bundle, files, plan, Reporter(1, write))
    assert failed.value.problem == (f"a in the bundle {bundle.path} changed on this machine while deploy sent it: "
                                    "it cannot be read now (No such file or directory)")
    assert "leave the bundle alone while it deploys" in failed.value.fix
