"""``edgesdk deploy``, review 50: the promise that a failed deploy leaves the board serving what it served.

ssh runs against a real sshd on 127.0.0.1 (tests/_utils/sshd.py, the fixture of test_deploy48);
``tests/_utils/fake_systemd.py`` stands in for systemctl only, and what its units start is the real server.
"""

from __future__ import annotations

import os
import subprocess

from tests._utils import fake_systemd
from tests._utils.deploy import edgesdk
from tests.unit.test_deploy48 import ServiceBoard, urllib_open


def test_a_service_redeploy_onto_another_runtime_that_does_not_come_up_puts_the_runtime_back(
        ssh_server, tiny_bundle, tmp_path):
    """``deploy --service`` of the release already current with another edgesdk (a new runtime key) switches
    runtime/current alone. Where the unit's server did not come up on it, the undo switched current back only
    where current had moved, so runtime/current stayed on the new edgesdk: the unit, put back as it was, was
    restarted on that same runtime and did not come up either, and the board served nothing, though a plain
    deploy in the same case puts the runtime back (d937d28). The error also said "there is no earlier release to
    go back to" about a release that was current before the deploy. runtime/current goes back now, and the
    unit serves with the edgesdk it ran before."""
    board = ServiceBoard(tmp_path, ssh_server, tiny_bundle)
    root, log, port, state, env, runtime = board.root, board.log, board.port, board.state, board.env, board.runtime
    deploy = [*board.deploy, "--service", "--service-port", port]
    try:
        runtime(None)
        first = edgesdk(*deploy)
        assert first.returncode == 0, first.stderr
        runtime("older")  # as if the first deploy had run an older edgesdk
        os.unlink(root / "runtime" / "current")
        os.symlink("older", root / "runtime" / "current")
        restarted = subprocess.run([str(tmp_path / "bin" / "systemctl"), "restart", "edgesdk-serve"],
                                   env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
        assert restarted.returncode == 0, restarted.stdout  # the unit now runs the older edgesdk
        key = runtime(None)
        (root / "runtime" / key / "broken").touch()

        again = edgesdk(*deploy)
        assert again.returncode == 8, again.stderr
        assert f"current already is releases/{tiny_bundle.bundle_id}" in again.stderr
        assert f"{key} is broken" in again.stderr  # the journal of the server that did not come up
        assert os.readlink(root / "runtime" / "current") == "older"  # before the fix: the broken runtime
        assert "runtime/current switched back to older" in again.stderr
        assert "no earlier release to go back to" not in again.stderr
        assert f"releases/{tiny_bundle.bundle_id} stays current, as it was before this deploy" in again.stderr
        served = [line.split()[0] for line in log.read_text().splitlines() if line.endswith(" serve")]
        assert served[-2:] == [key, "older"]
        assert os.readlink(root / "current") == f"releases/{tiny_bundle.bundle_id}"
        with urllib_open(f"http://127.0.0.1:{port}/health") as reply:
            assert reply.status == 200
    finally:
        fake_systemd.stop_all(state)


def test_the_ctrl_c_message_of_a_runtime_only_undo_names_the_runtime_not_a_switch_of_current():
    """The undo of a --service redeploy of the current release switches runtime/current back alone (above). A
    Ctrl-C there said current was being switched "back to releases/ID", the release it had never left."""
    from edgesdk.deploy.orchestrate import interrupted

    for stage in ("service switch back", "service switched back"):
        said = interrupted({"where": "pi@board", "bundle_id": "abc", "current": "abc", "stage": stage})
        assert "back to releases/abc" not in said.problem
        assert "runtime/current may point to that runtime or back to the one before" in said.problem
        assert "--status" in said.fix
    other = interrupted({"where": "pi@board", "bundle_id": "abc", "current": "old", "stage": "service switch back"})
    assert "while switching current on pi@board back to releases/old" in other.problem  # a real switch back: as before


def test_a_rollback_out_of_a_removed_current_release_does_not_leave_previous_equal_to_current(tiny_bundle, tmp_path):
    """current pointed to a release whose directory was removed (by hand, a disk cleanup); --status says to roll
    back. The switch left previous where it was, on the release rolled back to, so previous equalled current:
    --status listed the same release twice and a later --rollback said it was "already current". previous is
    dropped now (nothing to go back to), and a rollback says so."""
    import shutil

    import pytest

    from edgesdk.deploy.orchestrate import deploy
    from edgesdk.deploy.releases import rollback, status
    from edgesdk.deploy.report import Reporter
    from edgesdk.deploy.session import DeployOptions
    from edgesdk.deploy.transport import DeployError
    from tests._utils.deploy import bundle_variant, current_id

    root = tmp_path / "board"
    options = DeployOptions(to=root)

    def quiet():
        return Reporter(total=8, write=lambda line: None)

    one, two, three = (deploy(bundle_variant(tiny_bundle.path, tmp_path / note, note).path, options, quiet()).bundle_id
                       for note in ("one", "two", "three"))
    shutil.rmtree(root / "releases" / three)
    assert rollback(options, report=quiet())["to"] == two
    assert current_id(root) == two
    info = status(options)
    assert info["current"] == two
    assert info["previous"] is None  # before the fix: two, the same as current
    with pytest.raises(DeployError, match="has no previous release to roll back to"):
        rollback(options, report=quiet())
    assert rollback(options, one, quiet())["to"] == one  # a named release still works
    assert status(options)["previous"] == two
