"""The board-side helper, run locally exactly as over ssh: prune's order under a clock that jumped, and the
runtimes a switch removes while another deploy is in flight."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from edgesdk.deploy.remote import Board
from edgesdk.deploy.transport import LocalTransport
from tests.unit.test_deploy_helper import commit_by_hand, deploy_several, make_bundle


@pytest.fixture
def board(tmp_path) -> Board:
    root = str(tmp_path / "board")
    return Board(LocalTransport(root), sys.executable, root)


def test_a_release_whose_mtime_lies_in_the_future_is_pruned_in_its_turn(board, tmp_path):
    """A board without a real-time clock that boots before NTP syncs runs on a clock set back: a release committed
    before then has an mtime in the future. Prune ordered by mtime, so it counted as the newest release, and as
    one committed by a deploy still in flight (negative age), and '--keep N' never removed it."""
    ids = deploy_several(board, tmp_path, 4)  # current ids[3], previous ids[2]
    releases = Path(board.root) / "releases"
    future = time.time() + 365 * 24 * 3600
    os.utime(releases / ids[0], (future, future))

    assert board.call("prune", {"keep": 3})["removed"] == [ids[0]]  # the oldest in use, whatever its mtime
    assert sorted(os.listdir(releases)) == sorted(ids[1:])
    assert board.call("prune", {"keep": 1})["removed"] == [ids[1]]


def test_prune_orders_by_the_switches_not_by_their_clock(board, tmp_path):
    """history.jsonl written under a clock that jumped back between two switches: the switch written later is
    the later use, whatever time it bears."""
    ids = deploy_several(board, tmp_path, 4)
    history = Path(board.root) / "history.jsonl"
    lines = [json.loads(line) for line in history.read_text().splitlines()]
    behind = lines[0]["time"] - 3600 * 24 * 30
    lines[2]["time"] = behind  # the switch to ids[2], with the clock a month behind
    history.write_text("".join(json.dumps(line) + "\n" for line in lines))
    for release in ids:
        os.utime(Path(board.root) / "releases" / release, (behind - 60, behind - 60))
    board.call("switch", {"bundle_id": ids[1], "action": "rollback"})  # current ids[1], previous ids[3]
    assert board.call("prune", {"keep": 3})["removed"] == [ids[0]]


def install_runtime(runtime: Path, key: str) -> None:
    """The venv's stamp as op_install writes it last (the venv itself does not matter to a switch)."""
    from edgesdk.deploy.board_install import write_stamp

    (runtime / key).mkdir(parents=True)
    write_stamp(str(runtime / key), {"key": key, "version": "0", "installed": time.time(), "inherited": []})


def test_a_switch_leaves_the_runtime_a_deploy_in_flight_installed(board, tmp_path):
    """Deploy A installs runtime kA and commits its release; deploy B, with runtime kB, switches meanwhile. B's
    switch removed every runtime but kB and the one it replaced, kA too, and A then failed at its smoke test
    or switch. kA stays until A has switched to it; after that it is an old runtime like any other."""
    runtime = Path(board.root) / "runtime"
    first = make_bundle(tmp_path / "first", {"w": os.urandom(100)}, "first")
    commit_by_hand(board, first)
    install_runtime(runtime, "k0")
    board.call("switch", {"bundle_id": first.bundle_id, "runtime_key": "k0"})

    a = make_bundle(tmp_path / "a", {"w": os.urandom(100)}, "a")
    b = make_bundle(tmp_path / "b", {"w": os.urandom(100)}, "b")
    install_runtime(runtime, "kA")  # deploy A: runtime installed, release committed, smoke test running
    commit_by_hand(board, a)
    install_runtime(runtime, "kB")  # deploy B runs to its end meanwhile
    commit_by_hand(board, b)
    board.call("switch", {"bundle_id": b.bundle_id, "runtime_key": "kB"})
    assert sorted(os.listdir(runtime)) == ["current", "k0", "kA", "kB"]

    switched = board.call("switch", {"bundle_id": a.bundle_id, "runtime_key": "kA"})  # deploy A finishes
    assert switched["runtime_from"] == "kB"
    assert os.readlink(runtime / "current") == "kA"
    assert sorted(os.listdir(runtime)) == ["current", "kA", "kB"]  # k0: older, and switched to before

    install_runtime(runtime, "kC")
    board.call("switch", {"bundle_id": b.bundle_id, "runtime_key": "kC"})
    assert sorted(os.listdir(runtime)) == ["current", "kA", "kC"]  # kB was current once: not in flight


def test_a_runtime_installed_long_ago_and_never_switched_to_is_removed(board, tmp_path):
    """An install whose deploy failed for good: once IN_FLIGHT_MAX_AGE_S has passed, or its install time lies
    that far in the future (the clock was set back since), the next switch removes it."""
    from edgesdk.deploy.board_install import write_stamp

    runtime = Path(board.root) / "runtime"
    bundle = make_bundle(tmp_path / "first", {"w": os.urandom(100)}, "first")
    commit_by_hand(board, bundle)
    for key, shift in (("past", -7 * 3600), ("future", 365 * 24 * 3600)):
        (runtime / key).mkdir(parents=True)
        write_stamp(str(runtime / key), {"key": key, "version": "0", "installed": time.time() + shift})
    install_runtime(runtime, "k1")
    board.call("switch", {"bundle_id": bundle.bundle_id, "runtime_key": "k1"})
    assert sorted(os.listdir(runtime)) == ["current", "k1"]
