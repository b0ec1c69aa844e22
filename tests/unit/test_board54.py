"""Review 54 of the board side of deploy (board_ops, board_service, board_transfer, board_common): what a switch
that is undone leaves, and the checks made before the board changes anything."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
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


def _install_runtime(board: Board, key: str) -> None:
    venv = Path(board.root) / "runtime" / key
    venv.mkdir(parents=True)
    (venv / "edgesdk-runtime.json").write_text(json.dumps({"key": key, "version": "0"}))


def test_a_switch_that_is_undone_keeps_the_runtime_previous_rolls_back_to(board, tmp_path):
    """op_switch promises all or nothing: a refused switch puts current, previous and runtime/current back. It
    removed the runtimes it no longer needed before its check, so a switch refused by that check (a release
    whose manifest names another bundle) left previous pointing at a release whose runtime (runtimes.json) was
    gone, and a rollback to it was refused with "runtime ... is not installed"."""
    root = Path(board.root)
    first, second = make_bundle(tmp_path / "a", {"w": b"1"}), make_bundle(tmp_path / "b", {"w": b"2"})
    for bundle, key in ((first, "ra"), (second, "rb")):
        commit_by_hand(board, bundle)
        _install_runtime(board, key)
        board.call("switch", {"bundle_id": bundle.bundle_id, "runtime_key": key})
    shutil.copytree(root / "releases" / first.bundle_id, root / "releases" / "copy")  # names another bundle
    _install_runtime(board, "rc")
    with pytest.raises(DeployError, match="after the switch"):
        board.call("switch", {"bundle_id": "copy", "runtime_key": "rc"})
    assert os.readlink(root / "current") == f"releases/{second.bundle_id}"
    assert os.readlink(root / "previous") == f"releases/{first.bundle_id}"
    assert os.readlink(root / "runtime" / "current") == "rb"
    assert json.loads((root / "runtimes.json").read_text())[first.bundle_id] == "ra"
    assert (root / "runtime" / "ra" / "edgesdk-runtime.json").is_file()
    # the rollback to previous, with the runtime it last ran with, still works
    reply = board.call("switch", {"bundle_id": first.bundle_id, "runtime_key": "ra", "action": "rollback"})
    assert reply["to"] == first.bundle_id
    assert reply["runtime_from"] == "rb"
    # a switch that is done drops what no rollback needs: rc (its stamp has no install time: no deploy waits for it)
    assert sorted(os.listdir(root / "runtime")) == ["current", "ra", "rb"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_service_check_refuses_a_port_held_by_a_program_when_the_active_unit_serves_another(
        tmp_path, systemd, monkeypatch):
    """The check before a --service deploy refuses a port something else listens on. Where this deploy root had no
    service.json (the unit was installed by a deploy into another root), any active unit counted as the one
    listening, so the check passed and the deploy failed only after its switch, when the unit moved to that
    port could not bind it. The unit file says where its server listens: a unit on the port asked is still ours."""
    env, state = systemd
    for name in ("PATH", "FAKE_SYSTEMD_STATE", "EDGESDK_UNIT_DIR"):
        monkeypatch.setenv(name, env[name])
    units = Path(env["EDGESDK_UNIT_DIR"])
    units.mkdir()
    unit_port = _free_port()
    (units / "edgesdk-serve.service").write_text(
        f'[Service]\nExecStart="{sys.executable}" "-c" "import time; time.sleep(120)" "--host" "0.0.0.0" '
        f'"--port" "{unit_port}"\n')
    assert subprocess.run(["systemctl", "restart", "edgesdk-serve"]).returncode == 0
    board = Board(LocalTransport(str(tmp_path / "board")), sys.executable, str(tmp_path / "board"))
    params = {"action": "check", "argv": [], "timeout_s": 0, "fix": ""}
    with socket.socket() as foreign:
        foreign.bind(("127.0.0.1", 0))
        foreign.listen()
        busy = foreign.getsockname()[1]
        with pytest.raises(DeployError, match=f"already answers on http://127.0.0.1:{busy}/health") as info:
            board.call("service", {**params, "health_url": f"http://127.0.0.1:{busy}/health"})
        assert "--service-port" in info.value.fix
    with socket.socket() as held_by_the_unit:  # stands in for the unit's server on its own port
        held_by_the_unit.bind(("127.0.0.1", unit_port))
        held_by_the_unit.listen()
        reply = board.call("service", {**params, "health_url": f"http://127.0.0.1:{unit_port}/health"})
    assert reply["installed"] is True


def test_a_receive_that_sends_nothing_new_keeps_its_staging_directory_from_a_concurrent_prune(board, tmp_path):
    """prune removes staging directories unused for a day, and promises to leave the one a deploy running next
    to it uses. A deploy whose files all arrived in an earlier, cut deploy (staging/<id> complete, not committed)
    receives nothing new, so the directory kept its old mtime: a concurrent deploy's prune between this one's
    receive and commit removed it, and the commit found "manifest.json or manifest.sha256 unreadable"."""
    bundle = make_bundle(tmp_path / "b", {"w": b"1"})
    board.call("receive", {"bundle_id": bundle.bundle_id, "links": {}}, stdin=stream_for(bundle))
    staging = Path(board.root) / "staging" / bundle.bundle_id
    two_days_ago = time.time() - 2 * 86400
    os.utime(staging, (two_days_ago, two_days_ago))
    board.call("receive", {"bundle_id": bundle.bundle_id, "links": {}}, stdin=b'{"end": true}\n')
    assert board.call("prune", {"keep": 3})["removed"] == []
    sha = bundle_files(bundle)["manifest.json"]["sha256"]
    assert board.call("commit", {"bundle_id": bundle.bundle_id, "manifest_sha256": sha})["problems"] == []
    # a staging directory nobody used for a day still goes
    other = Path(board.root) / "staging" / "0123456789abcdef"
    other.mkdir()
    os.utime(other, (two_days_ago, two_days_ago))
    assert board.call("prune", {"keep": 3})["removed"] == ["staging/0123456789abcdef"]


def test_a_deploy_root_behind_a_link_to_nothing_is_refused_naming_the_link(tmp_path):
    """~/edgesdk a link into an SSD that is not mounted: the probe took the root for missing, reported the free
    space of the disk holding the link, and the receive then failed with "File exists" and a fix about permissions
    and free space. Both now name the link and what it points to."""
    (tmp_path / "ssd").mkdir()
    os.symlink(tmp_path / "ssd" / "edgesdk", tmp_path / "edgesdk")
    root = str(tmp_path / "edgesdk")
    board = Board(LocalTransport(root), sys.executable, root)
    bundle = make_bundle(tmp_path / "b", {"w": b"1"})
    for op, params, stdin in (("probe", {}, None),
                              ("receive", {"bundle_id": bundle.bundle_id, "links": {}}, stream_for(bundle))):
        with pytest.raises(DeployError) as info:
            board.call(op, params, stdin=stdin)
        assert info.value.problem == (f"the deploy root {root} on the board lies behind the link {root} -> "
                                      f"{tmp_path / 'ssd' / 'edgesdk'}, which points to nothing (a disk that is not "
                                      "mounted?)")
        assert "mount the disk" in info.value.fix
        assert "--remote-root" in info.value.fix
    assert not (tmp_path / "ssd" / "edgesdk").exists()  # nothing made on the disk under the mount point
    (tmp_path / "ssd" / "edgesdk").mkdir()  # mounted: the link leads to a directory, and deploy goes on
    assert board.call("probe")["root_exists"] is True


def test_a_killed_switch_is_written_to_the_history_when_the_clock_was_set_back(board, tmp_path):
    """The next helper finishes a switch a kill cut after current moved, and writes its history line where the kill
    came before it. It took the line for written when the release had any line with a later time than the
    journal's, which on a board whose clock was set back since (no real-time clock) is an older switch: the
    rollback went unrecorded, and --status named the switch before it as the last one."""
    root = Path(board.root)
    first, second = make_bundle(tmp_path / "a", {"w": b"1"}), make_bundle(tmp_path / "b", {"w": b"2"})
    for bundle in (first, second):
        commit_by_hand(board, bundle)
        board.call("switch", {"bundle_id": bundle.bundle_id})
    board.call("switch", {"bundle_id": first.bundle_id, "action": "rollback"})
    # a rollback to the second, a day behind the clock of its earlier deploy, killed right after current moved
    before = {"current": os.readlink(root / "current"), "previous": os.readlink(root / "previous"),
              "runtime/current": None}
    (root / ".switch.json").write_text(json.dumps({
        "time": time.time() - 86400, "to": second.bundle_id, "from": first.bundle_id, "before": before,
        "action": "rollback", "previous_after": first.bundle_id}))
    os.symlink(f"releases/{second.bundle_id}", root / ".current.tmp")
    os.replace(root / ".current.tmp", root / "current")
    board.call("prune", {"keep": 5})  # settles the switch
    state = board.call("probe")["state"]
    assert (state["current"], state["previous"]) == (second.bundle_id, first.bundle_id)
    assert state["last_switch"]["to"] == second.bundle_id
    assert state["last_switch"]["action"] == "rollback"
    board.call("prune", {"keep": 5})  # nothing left to settle: no second line
    lines = (root / "history.jsonl").read_text().splitlines()
    assert [json.loads(line)["to"] for line in lines] == [first.bundle_id, second.bundle_id, first.bundle_id,
                                                          second.bundle_id]
