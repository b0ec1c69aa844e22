"""Deploy transfer and orchestration, review 57: a link in staging is no file the board holds (the probe counted a
.partial behind one as a prefix to resume after, which the receive then removed, and a link at a file's name as
the file); a Ctrl-C in the switch of a redeploy of the current release names what that switch can move.

Every board operation runs the real helper through a LocalTransport; nothing is mocked."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from edgesdk.deploy.orchestrate import interrupted
from edgesdk.deploy.remote import Board
from edgesdk.deploy.report import Reporter
from edgesdk.deploy.transfer import bundle_files, make_plan, send
from edgesdk.deploy.transport import LocalTransport
from tests.unit.test_deploy_helper import make_bundle


@pytest.fixture
def board(tmp_path) -> Board:
    root = str(tmp_path / "board")
    return Board(LocalTransport(root), sys.executable, root)


def probe_plan(board, bundle, files) -> dict:
    return board.call("probe", {"bundle_id": bundle.bundle_id, "files": files,
                                "manifest_sha256": files["manifest.json"]["sha256"]})["plan"]


def test_links_in_staging_are_not_taken_for_what_the_board_holds(board, tmp_path):
    """A link at a file's .partial leading to that file's first bytes: the probe planned to resume after them, the
    receive removed the link (it never writes through one) and refused the resume as past the end of the .partial,
    so the deploy failed. A link at a file's name leading to that file: the probe said staging held it, nothing was
    sent, and the release committed the link, pointing out of the deploy root. Both are sent now."""
    weights = os.urandom(3000)
    bundle = make_bundle(tmp_path / "a", {"w": weights, "t": b"tokens"}, "a")
    files = bundle_files(bundle)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "half").write_bytes(weights[:1000])
    (outside / "t").write_bytes(b"tokens")
    staging = Path(board.root) / "staging" / bundle.bundle_id
    staging.mkdir(parents=True)
    os.symlink(outside / "half", staging / "w.partial")
    os.symlink(outside / "t", staging / "t")

    plan = make_plan(files, probe_plan(board, bundle, files))
    assert dict(plan.send) == {"manifest.json": 0, "manifest.sha256": 0, "t": 0, "w": 0}
    assert plan.in_staging == []
    send(board, bundle, files, plan, Reporter(total=1))
    committed = board.call("commit", {"bundle_id": bundle.bundle_id, "manifest_sha256": files["manifest.json"]["sha256"]})
    assert committed["problems"] == []
    release = Path(board.root) / "releases" / bundle.bundle_id
    for name in ("w", "t"):
        assert not (release / name).is_symlink()
        assert (release / name).read_bytes() == (bundle.path / name).read_bytes()
    assert (outside / "half").read_bytes() == weights[:1000]


def test_a_link_in_a_release_is_not_hard_linked_from(board, tmp_path):
    """A release holding a link at a file's name (not deploy's doing): linking from it hard-linked the file the link
    leads to, outside the deploy root, into the new release. The file is sent instead."""
    shared = os.urandom(500)
    bundle = make_bundle(tmp_path / "b", {"w": shared}, "b")
    files = bundle_files(bundle)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "w").write_bytes(shared)
    foreign = Path(board.root) / "releases" / "handmade"
    foreign.mkdir(parents=True)
    os.symlink(outside / "w", foreign / "w")

    assert probe_plan(board, bundle, files)["w"] == {"state": "send", "offset": 0}


def test_a_ctrl_c_in_the_switch_of_a_redeploy_with_another_runtime_names_runtime_current():
    """A redeploy of the release that is current with another edgesdk switches runtime/current alone. A Ctrl-C in
    that switch said current might point to releases/abc "or still to releases/abc"; the lost reply of the same
    switch (no Ctrl-C) already named runtime/current and its two runtimes."""
    said = interrupted({"where": "pi@board", "bundle_id": "abc", "current": "abc", "stage": "switch",
                        "runtime_key": "py310-new", "runtime_before": "py310-old"})
    assert "or still to releases/abc" not in said.problem
    assert "releases/abc stays current" in said.problem
    assert "runtime/current may already point to py310-new (smoke-tested with it) or still to py310-old" in said.problem
    assert "--status" in said.fix
    assert "restart" in said.fix

    same = interrupted({"where": "pi@board", "bundle_id": "abc", "current": "abc", "stage": "switch",
                        "runtime_key": None, "runtime_before": "py310-old"})
    assert "or still to releases/abc" not in same.problem
    assert "current and runtime/current stay as they were" in same.problem

    other = interrupted({"where": "pi@board", "bundle_id": "abc", "current": "old", "stage": "switch",
                         "runtime_key": "py310-new", "runtime_before": "py310-old"})
    assert "point to releases/abc (smoke-tested) or still to releases/old" in other.problem  # a real switch: as before


def test_a_ctrl_c_before_or_after_the_switch_of_a_redeploy_does_not_say_current_moved():
    """The same redeploy of the current release, cut before its switch, said releases/abc "was not switched to",
    and cut after it, that the board was switched to releases/abc "(was releases/abc)": it was current all along."""
    before = interrupted({"where": "pi@board", "bundle_id": "abc", "current": "abc"})
    assert "releases/abc was not switched to" not in before.problem
    assert "keeps releases/abc as current" in before.problem
    after = interrupted({"where": "pi@board", "bundle_id": "abc", "current": "abc", "stage": "switched"})
    assert "(was releases/abc)" not in after.problem
    assert "releases/abc stays current, as it was before this deploy" in after.problem
    other = interrupted({"where": "pi@board", "bundle_id": "abc", "current": "old", "stage": "switched"})
    assert "after switching pi@board to releases/abc (was releases/old)" in other.problem
    first = interrupted({"where": "pi@board", "bundle_id": "abc", "current": None})
    assert "still has no current release; releases/abc was not switched to" in first.problem
