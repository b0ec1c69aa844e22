"""Review 58 of the board side of deploy (board_ops): a switch's history line after one cut short, and the check
after a switch onto a release whose manifest is damaged."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from edgesdk.deploy.remote import Board
from edgesdk.deploy.transport import DeployError, LocalTransport
from tests.unit.test_deploy_helper import commit_by_hand, make_bundle


@pytest.fixture
def board(tmp_path) -> Board:
    root = str(tmp_path / "board")
    return Board(LocalTransport(root), sys.executable, root)


def _committed(board: Board, tmp_path: Path, count: int) -> list[str]:
    ids = []
    for i in range(count):
        bundle = make_bundle(tmp_path / f"b{i}", {"w": os.urandom(64)}, str(i))
        commit_by_hand(board, bundle)
        ids.append(bundle.bundle_id)
    return ids


def test_a_switch_after_a_history_line_cut_short_is_still_recorded(board, tmp_path):
    """A switch whose history line a full disk cut short is undone, but the part written stays, with no newline. The
    next switch's line was appended to it, so neither parsed: that switch was missing from history (the last switch
    --status shows, and the order prune keeps releases in)."""
    first, second = _committed(board, tmp_path, 2)
    board.call("switch", {"bundle_id": first})
    history = Path(board.root) / "history.jsonl"
    with open(history, "a") as handle:
        handle.write('{"time": 1.0, "action": "dep')  # what the disk took of a line before it was full
    board.call("switch", {"bundle_id": second})
    assert board.call("probe")["state"]["last_switch"]["to"] == second
    lines = history.read_text().splitlines()
    assert json.loads(lines[-1])["to"] == second


def test_a_switch_onto_a_release_whose_manifest_is_no_json_is_refused_naming_it(board, tmp_path):
    """The switch back after a failed deploy verifies nothing first. Onto a release whose manifest.json a damaged
    block made no JSON, the check after the switch failed the helper with a JSONDecodeError and 'report this'; it is
    refused naming the damaged manifest, and current stays as it was."""
    first, second = _committed(board, tmp_path, 2)
    for bundle_id in (first, second):
        board.call("switch", {"bundle_id": bundle_id})
    root = Path(board.root)
    (root / "releases" / first / "manifest.json").write_bytes(b"\x00" * 40)
    with pytest.raises(DeployError, match="manifest.json that is not JSON") as refused:
        board.call("switch", {"bundle_id": first, "action": "rollback after a failed deploy", "if_current": second,
                              "previous": None})
    assert "report this with the output" not in refused.value.problem
    assert os.readlink(root / "current") == f"releases/{second}"
