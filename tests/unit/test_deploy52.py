"""``edgesdk deploy``, review 52: a refused disk check names the releases to remove (a lower --keep frees nothing
before a deploy succeeds); an ssh client killed on this machine is named once, as itself; a fleet --service to two
roots of one board is refused; a unit of another user names the deploy that could not restart it; a switch undone
by its check leaves no history line."""

from __future__ import annotations

import json
import os
import shlex

import pytest

from edgesdk.deploy.board_common import paths, release_list
from edgesdk.deploy.probe import BoardFacts, check_disk
from edgesdk.deploy.transport import DeployError, HostSpec, LocalTransport, SshOptions, SshTransport


def release(root, bundle_id: str, size: int) -> None:
    """releases/<id> as a commit leaves it: a manifest listing one file of ``size`` bytes."""
    folder = root / "releases" / bundle_id
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(b"\0" * size)
    (folder / "manifest.json").write_text(json.dumps({"bundle_id": bundle_id, "target": {"name": "host"},
                                                      "files": {"model.onnx": {"size": size, "sha256": "-"}}}))


def test_a_refused_disk_check_names_the_releases_to_remove_not_a_lower_keep(tmp_path):
    """The disk check runs before the transfer, and deploy prunes old releases (--keep) only after a deploy that
    succeeded: its fix "old releases go with a lower --keep" sent the user to run the same deploy with --keep 1,
    refused again by the same check, with no word of what took the space. The fix names the releases that are
    neither current nor previous (oldest first, with their sizes) and the command that removes them; current
    and previous are never named."""
    root = tmp_path / "board"
    for bundle_id, size in (("oldest", 3_000_000), ("older", 2_000_000), ("before", 1_000), ("now", 1_000)):
        release(root, bundle_id, size)
        os.utime(root / "releases" / bundle_id, (len(os.listdir(root / "releases")),) * 2)  # committed in turn
    os.symlink("releases/now", root / "current")
    os.symlink("releases/before", root / "previous")
    p, resolved = paths(str(root))
    facts = BoardFacts.from_probe({"root": resolved, "disk": {"free": 1_000_000}, "python": {"version": [3, 10, 12]},
                                   "memory": {}, "runtime": {}, "state": release_list(p)})

    with pytest.raises(DeployError, match="not enough disk space") as refused:
        check_disk(5_000_000, 0, facts, "pi@board")
    fix = refused.value.fix
    assert "old releases go with a lower --keep" not in fix
    assert "oldest first: oldest (3.0 MB), older (2.0 MB) (" in fix
    assert shlex.join(["rm", "-rf", f"{resolved}/releases/oldest", f"{resolved}/engines/oldest",
                       f"{resolved}/releases/older"]) in fix
    assert "releases/now" not in fix
    assert "releases/before" not in fix
    assert "--remote-root" in fix


def current_and_previous(root, before=None):
    """A deploy root holding releases ``before`` and ``now`` only (previous and current), 1 MB free: its probe's
    facts, read after ``before(root)`` has left whatever else the test needs there."""
    for bundle_id in ("before", "now"):
        release(root, bundle_id, 1_000)
    os.symlink("releases/now", root / "current")
    os.symlink("releases/before", root / "previous")
    if before is not None:
        before(root)
    p, resolved = paths(str(root))
    return BoardFacts.from_probe({"root": resolved, "disk": {"free": 1_000_000}, "python": {"version": [3, 10, 12]},
                                  "memory": {}, "runtime": {}, "state": release_list(p)})


def test_a_board_with_only_current_and_previous_is_told_so(tmp_path):
    facts = current_and_previous(tmp_path / "board")
    with pytest.raises(DeployError) as refused:
        check_disk(5_000_000, 0, facts, "pi@board")
    assert "no release besides current and previous" in refused.value.fix
    assert "rm -rf" not in refused.value.fix


@pytest.mark.parametrize("feed", [None, b"wheel"], ids=["reads nothing", "reads its input"])
def test_an_ssh_client_killed_on_this_machine_is_named_once_and_not_blamed_on_the_board(feed):
    """ssh itself killed by a signal on this machine (its exit status -N): the note was added twice (once as a
    local child's, once more as a remote command's) and both said the board's command was killed, "on a board
    usually the out-of-memory killer: free memory or build a smaller bundle", though the board's command may
    well still run. The ssh client here is a real program that kills itself with SIGKILL, as the OOM killer of
    this machine would."""
    transport = SshTransport(HostSpec.parse("pi@board"),
                             SshOptions(ssh_command="sh -c 'kill -KILL $$' sh", multiplex=False))
    proc = transport.run(["cat"], input=feed, timeout=30, what="the smoke test")
    said = proc.stderr.decode()
    assert proc.returncode == -9
    assert said.count("(exit status -9") == 1, said
    assert "the ssh client on this machine was killed by SIGKILL" in said
    assert "out-of-memory" not in said


def test_a_local_command_killed_by_a_signal_is_still_the_boards_own(tmp_path):
    """--to DIR: this machine is the board, and a command killed by SIGKILL is the board's, noted once."""
    proc = LocalTransport(str(tmp_path)).run(["sh", "-c", "kill -KILL $$"], timeout=30)
    said = proc.stderr.decode()
    assert said.count("(exit status -9") == 1
    assert "the command was killed by SIGKILL; on a board that is usually the out-of-memory killer" in said


def test_a_fleet_service_deploy_to_two_roots_of_one_board_is_refused_before_any_board_starts(tmp_path):
    """A board may be given twice with two deploy roots (remote_root= of its own), but it has one unit,
    edgesdk-serve, on one --service-port: with --service both deploys ran at once, each wrote the unit over the
    other's, and both were reported serving while it served one root. It is refused now before any board starts,
    naming both lines; two ssh ports of one host (boards behind a gateway's port forwards) stay two boards."""
    from tests._utils.deploy import edgesdk

    inventory = tmp_path / "boards.txt"
    inventory.write_text("pi@orin.invalid remote_root=/data/one\n"
                         "root@ORIN.invalid remote_root=/data/two\n"
                         "pi@gateway.invalid:2201\npi@gateway.invalid:2202\n")
    missing = tmp_path / "no-bundle"

    proc = edgesdk("deploy", missing, "--hosts", inventory, "--service", "--no-install")
    assert proc.returncode == 8, proc.stderr
    assert "--service installs one unit per board" in proc.stderr
    assert f"the board orin.invalid is given twice (pi@orin.invalid at {inventory}:1, " \
           f"root@ORIN.invalid at {inventory}:2)" in proc.stderr
    assert "deploy [" not in proc.stderr  # no board started

    inventory.write_text("pi@gateway.invalid:2201\npi@gateway.invalid:2202\n")
    proc = edgesdk("deploy", missing, "--hosts", inventory, "--service", "--no-install")
    assert "one unit per board" not in proc.stderr
    assert proc.returncode == 5, proc.stderr  # the bundle is verified once, before any board (a bundle error)
    assert proc.stderr.count(f"bundle {missing} does not exist") == 1


def test_a_unit_of_another_user_names_the_deploy_or_the_rollback_that_could_not_restart_it(tmp_path):
    """A unit that another user installed for this deploy root (a group-shared root whose system unit root
    installed) is not this user's to restart. The board said "this rollback runs as ..., running the rollback
    again would switch current once more" also when a deploy asked for the restart after its switch, which
    then switched current back: the user was told about a rollback nobody ran. The refusal names what asked, and a
    deploy is told why the unit was not restarted (it keeps its switch) instead of being refused."""
    import sys

    from edgesdk.deploy import service
    from edgesdk.deploy.board_service import render_unit
    from edgesdk.deploy.remote import Board

    root = tmp_path / "board"
    root.mkdir()
    unit = tmp_path / "units" / "edgesdk-serve.service"
    unit.parent.mkdir()
    unit.write_text(render_unit([sys.executable, "serve", str(root / "current"), "--port", "8080"], "system"))
    (root / "service.json").write_text(json.dumps({"scope": "system", "unit": str(unit), "uid": os.geteuid() + 1,
                                                   "health_url": "http://127.0.0.1:8080/health"}))
    board = Board(LocalTransport(str(root)), sys.executable, str(root))

    deploying = service.restart_after_switch(board)  # said, not refused: the deploy keeps its switch
    assert f"{unit} not restarted: it was installed by " in deploying
    assert "and this deploy runs as" in deploying
    assert "rollback" not in deploying

    with pytest.raises(DeployError) as rolling_back:
        service.restart_service(board)
    assert "and this rollback runs as" in rolling_back.value.problem
    assert "running the rollback again would switch current once more" in rolling_back.value.fix


def test_a_switch_undone_by_its_check_leaves_no_history_line(tmp_path):
    """A switch checks, once current moved, that current holds the bundle it names; where not (a release copied by
    hand under another name, such as releases/backup, rolled back to with --release backup), every link goes back
    and the switch is refused. Its history line was written before that check and stayed: --status said the last
    switch went to backup while current never left the release it was on, and the prune took backup for the
    release used last. Nothing is written now for a switch that is undone."""
    import sys

    from edgesdk.deploy.remote import Board, BoardRefusal

    root = tmp_path / "board"
    release(root, "now", 10)
    release(root, "backup", 10)
    manifest = root / "releases" / "backup" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"backup"', '"now"'))  # a copy of releases/now
    os.symlink("releases/now", root / "current")
    board = Board(LocalTransport(str(root)), sys.executable, str(root))

    with pytest.raises(BoardRefusal, match="after the switch, current points to backup holding bundle now"):
        board.call("switch", {"bundle_id": "backup", "action": "rollback"})
    assert os.readlink(root / "current") == "releases/now"
    state = board.call("probe", {})["state"]
    assert state["current"] == "now"
    assert "last_switch" not in state  # before: {"action": "rollback", "from": "now", "to": "backup", ...}
    assert not (root / "history.jsonl").exists() or "backup" not in (root / "history.jsonl").read_text()
