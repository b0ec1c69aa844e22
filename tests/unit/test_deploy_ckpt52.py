"""Deploy leftovers and build checkpoint durability, review 52: a rollback's verify refuses a release whose manifest
names another bundle (before its smoke test, not at the switch); a name that is not plain is refused with a fix
that fits where it came from; the build's state file reaches the disk before and after its rename; a unit of
another user does not undo a deploy; a board with 512 MB gets a 512 MB board's budget; a redeploy of the current
release keeps the runtime ``previous`` ran with; a switch to a manifest with no bundle id is refused by name.

Every board operation runs the real helper through a LocalTransport; nothing is mocked (the state file's fsyncs
are recorded on their way to the real os.fsync)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from edgesdk.build.checkpoint import STATE, WorkDir
from edgesdk.deploy.board_service import render_unit
from edgesdk.deploy.orchestrate import _budget_mb, restart_unit_after_switch
from edgesdk.deploy.probe import BoardFacts
from edgesdk.deploy.remote import Board, BoardRefusal
from edgesdk.deploy.report import Reporter
from edgesdk.deploy.transport import LocalTransport
from edgesdk.profile import get_profile
from tests.unit.test_deploy_helper import commit_by_hand, deploy_by_hand, make_bundle


@pytest.fixture
def board(tmp_path) -> Board:
    root = str(tmp_path / "board")
    return Board(LocalTransport(root), sys.executable, root)


def test_verify_refuses_a_release_copied_by_hand_under_another_name(board, tmp_path):
    """A rollback verifies the release, smoke-tests it, then switches; the switch's check after moving current
    refused a release whose manifest names another bundle (a copy made by hand, releases/backup), so the smoke
    test ran for nothing. The verify says it now, and where that bundle is."""
    a = make_bundle(tmp_path / "a", {"w": os.urandom(100)}, "a")
    b = make_bundle(tmp_path / "b", {"w": os.urandom(100)}, "b")
    deploy_by_hand(board, a)
    deploy_by_hand(board, b)
    releases = Path(board.root) / "releases"
    shutil.copytree(releases / a.bundle_id, releases / "backup")
    shutil.copytree(releases / b.bundle_id, releases / "current-copy")
    shutil.copytree(releases / a.bundle_id, releases / "moved")
    shutil.rmtree(releases / a.bundle_id)

    problems = board.call("verify", {"bundle_id": "backup"})["problems"]
    assert len(problems) == 1
    assert f"manifest.json names bundle {a.bundle_id}, not backup" in problems[0]
    assert "switch would refuse it" in problems[0]
    assert f"rename the directory to releases/{a.bundle_id}" in problems[0]  # releases/<a> is gone
    assert f"releases/{b.bundle_id}, which holds that bundle, is current already" in \
        board.call("verify", {"bundle_id": "current-copy"})["problems"][0]
    assert board.call("verify", {"bundle_id": b.bundle_id})["problems"] == []


def test_a_release_directory_with_no_plain_name_is_not_told_to_rebuild_the_bundle(board, tmp_path):
    """``--rollback --release 'my copy'`` (a directory made by hand, which --status lists): the board said "bundle
    id 'my copy' is not a plain name", fix "rebuild the bundle with 'edgesdk build'", which changes nothing on the
    board. It names the release directory, what a plain name is, and a fix for a rollback."""
    a = make_bundle(tmp_path / "a", {"w": os.urandom(100)}, "a")
    deploy_by_hand(board, a)
    shutil.copytree(Path(board.root) / "releases" / a.bundle_id, Path(board.root) / "releases" / "my copy")

    with pytest.raises(BoardRefusal) as refused:
        board.call("verify", {"bundle_id": "my copy"})
    assert "release directory 'my copy' is not a plain name (letters, digits" in refused.value.problem
    assert "edgesdk build" not in refused.value.fix
    assert "roll back to a release 'edgesdk deploy --status' lists" in refused.value.fix


def test_a_runtime_key_that_is_not_plain_is_named_as_one(board, tmp_path):
    a = make_bundle(tmp_path / "a", {"w": os.urandom(100)}, "a")
    commit_by_hand(board, a)
    with pytest.raises(BoardRefusal) as refused:
        board.call("switch", {"bundle_id": a.bundle_id, "runtime_key": "../k1"})
    assert "edgesdk runtime key '../k1' is not a plain name" in refused.value.problem
    assert "bundle id" not in refused.value.problem
    assert "edgesdk build" not in refused.value.fix
    assert not os.path.lexists(Path(board.root) / "current")  # nothing switched


def fsyncs_and_replaces(monkeypatch) -> list:
    """Every fsync (by the path of its descriptor) and every os.replace, in order; both still run."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(handle):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{handle}")))
        return real_fsync(handle)

    def replace(source, destination, **kw):
        events.append(("replace", str(source), str(destination)))
        return real_replace(source, destination, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


def test_the_state_file_reaches_the_disk_before_and_after_its_rename(tmp_path, monkeypatch):
    """The state file was written and renamed with no fsync: a power cut after a step was marked done could leave
    an empty state.json under the final name (the rename written before the data), and --resume refused it ("the
    steps it finished are not known"), the build starting over. Its data is flushed before the rename and the
    directory after it, as a bundle's are (edgesdk/bundle.py)."""
    work = WorkDir(tmp_path / "out.build", {"model": "m"}, resume=False)
    events = fsyncs_and_replaces(monkeypatch)
    work.mark_done("stage-1", {"seconds": 1.0})

    tmp, state = str(work.path / (STATE + ".tmp")), str(work.path / STATE)
    published = events.index(("replace", tmp, state))
    assert ("fsync", tmp) in events[:published]
    assert ("fsync", str(work.path)) in events[published:]
    work.release()
    assert WorkDir(work.path, {"model": "m"}, resume=True).done("stage-1") == {"seconds": 1.0}


def test_a_unit_of_another_user_does_not_undo_the_deploy(board, tmp_path):
    """A deploy as one user into a root whose unit another user installed (a group-shared root, the system unit
    root's): the restart after the switch was refused, and the deploy switched current back as if the new release's
    server had not come up, then tried to restart the unit again (refused again), and said "restarting the service
    onto it failed too" about a unit that still served that very release. Every deploy of this user was undone the
    same way. Now current stays on the smoke-tested release and the deploy says why the unit was not restarted and
    the command that restarts it."""
    a = make_bundle(tmp_path / "a", {"w": os.urandom(100)}, "a")
    b = make_bundle(tmp_path / "b", {"w": os.urandom(100)}, "b")
    deploy_by_hand(board, a)
    root = Path(board.root)
    unit = tmp_path / "units" / "edgesdk-serve.service"
    unit.parent.mkdir()
    unit.write_text(render_unit([sys.executable, "serve", str(root / "current"), "--port", "8080"], "system"))
    (root / "service.json").write_text(json.dumps({"scope": "system", "unit": str(unit), "uid": os.geteuid() + 1,
                                                   "health_url": "http://127.0.0.1:8080/health"}))
    deploy_by_hand(board, b)
    lines = []

    restart_unit_after_switch(board, Reporter(8, lines.append), a.bundle_id, b.bundle_id, None, None, {})
    assert os.readlink(root / "current") == os.path.join("releases", b.bundle_id)
    assert os.readlink(root / "previous") == os.path.join("releases", a.bundle_id)
    said = " ".join(lines)
    assert f"{unit} not restarted: it was installed by " in said
    assert "this deploy runs as" in said
    assert "sudo systemctl restart edgesdk-serve" in said
    assert "failed too" not in said


def test_a_512mb_board_gets_the_budget_of_a_512mb_board():
    """A board no profile matches (a Raspberry Pi Zero 2 W, 512 MB) takes the bundle's profile cut to its RAM: its
    MemTotal, 0.42 GiB, was rounded up to a 1 GB board (the size clamped at 1 GB), giving a budget twice its
    share and near all of its RAM."""
    raw = {"root": "/home/pi/edgesdk", "arch": "aarch64", "device_tree_model": "Raspberry Pi Zero 2 W Rev 1.0\x00",
           "memory": {"MemTotal": 437_000 * 1024, "MemAvailable": 300_000 * 1024},
           "disk": {"free": 1 << 34, "total": 1 << 35}, "python": {"version": [3, 11, 2], "bits": 64},
           "tensorrt": None, "runtime": {}, "state": {}}
    facts = BoardFacts.from_probe(raw)
    assert facts.board.suggested_target is None
    budget, basis = _budget_mb({"target": get_profile("rpi4").summary()}, facts)
    assert budget == get_profile("rpi4").memory_budget_mb // 8  # 0.5 GB of the profile's 4 GB
    assert "a 0.5 GB board" in basis


def install_runtime(board, key: str) -> None:
    folder = Path(board.root) / "runtime" / key
    folder.mkdir(parents=True)
    (folder / "edgesdk-runtime.json").write_text(json.dumps({"key": key, "version": "0"}))


def test_a_redeploy_of_the_current_release_keeps_the_runtime_previous_ran_with(board, tmp_path):
    """Deploy a with runtime k1, b with k2, then b again (its runtime already current): the switch dropped every
    runtime but k2 and the one it replaced (itself), so k1, which runtimes.json pairs with previous (a), was
    removed, and a rollback ran a with k2, a pair that never ran together."""
    a = make_bundle(tmp_path / "a", {"w": os.urandom(100)}, "a")
    b = make_bundle(tmp_path / "b", {"w": os.urandom(100)}, "b")
    for bundle, key in ((a, "k1"), (b, "k2"), (b, "k2")):
        commit_by_hand(board, bundle)
        if not (Path(board.root) / "runtime" / key).exists():
            install_runtime(board, key)
        board.call("switch", {"bundle_id": bundle.bundle_id, "runtime_key": key})

    facts = board.call("probe")
    assert facts["state"]["previous"] == a.bundle_id
    assert facts["release_runtimes"][a.bundle_id] == "k1"
    assert facts["runtime"]["installed"] == ["k1", "k2"]

    c = make_bundle(tmp_path / "c", {"w": os.urandom(100)}, "c")  # a new release: previous becomes b (k2)
    commit_by_hand(board, c)
    install_runtime(board, "k3")
    board.call("switch", {"bundle_id": c.bundle_id, "runtime_key": "k3"})
    assert board.call("probe")["runtime"]["installed"] == ["k2", "k3"]  # k1 paired with no release kept


def test_a_switch_to_a_manifest_with_no_bundle_id_is_refused_by_name(tmp_path):
    """The switch's check read the manifest's bundle_id with [...]: a manifest without one (made by hand) was
    "the deploy helper failed on the board: KeyError('bundle_id')", "report this"."""
    root = tmp_path / "board"
    for bundle_id, manifest in (("now", {"bundle_id": "now", "files": {}}), ("backup", {"files": {}})):
        (root / "releases" / bundle_id).mkdir(parents=True)
        (root / "releases" / bundle_id / "manifest.json").write_text(json.dumps(manifest))
    os.symlink("releases/now", root / "current")
    board = Board(LocalTransport(str(root)), sys.executable, str(root))

    with pytest.raises(BoardRefusal) as refused:
        board.call("switch", {"bundle_id": "backup", "action": "rollback"})
    assert "current points to backup holding a manifest with no bundle id" in refused.value.problem
    assert "KeyError" not in refused.value.problem
    assert os.readlink(root / "current") == "releases/now"
