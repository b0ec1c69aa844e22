"""Deploy, review 59: the host side of a deploy (orchestrate.py) against a real board root (``--to DIR``, the board
helper run through a LocalTransport; tests/_utils/fake_systemd.py's systemctl for the unit).

A release removed from the board by hand while ``current`` pointed to it: the deploy that switched away from it
reported it as the previous release (which a rollback then could not find), and a unit that did not come up on the
new release made deploy ask the board to switch back to it; refused, the error said that current "may be" either
release and to wait until the board answered, which it had."""

from __future__ import annotations

import json
import shutil
import sys

from edgesdk.deploy.orchestrate import switch_back
from edgesdk.deploy.remote import Board
from edgesdk.deploy.transport import DeployError, LocalTransport
from tests._utils.deploy import bundle_variant, current_id, edgesdk
from tests._utils.sshd import free_port


def test_a_deploy_away_from_a_removed_release_reports_no_previous_release(tiny_bundle, tmp_path):
    root = tmp_path / "board"
    assert edgesdk("deploy", tiny_bundle.path, "--to", root).returncode == 0
    shutil.rmtree(root / "releases" / tiny_bundle.bundle_id)
    newer = bundle_variant(tiny_bundle.path, tmp_path / "newer", "newer")

    done = edgesdk("deploy", newer.path, "--to", root, "--json")

    assert done.returncode == 0, done.stderr
    assert current_id(root) == newer.bundle_id
    assert not (root / "previous").is_symlink()
    assert json.loads(done.stdout)["previous"] is None
    assert (f"releases/{tiny_bundle.bundle_id}, which current pointed to, is no longer on the board (its directory "
            "was removed), so there is no previous release to roll back to") in done.stderr


def test_a_unit_that_does_not_come_up_after_a_deploy_away_from_a_removed_release_keeps_the_new_one(
        tiny_bundle, tmp_path, systemd):
    """The unit an earlier deploy --service installed does not come up on the new release (a blank EDGESDK_API_KEY,
    which 'edgesdk serve' refuses and 'run' never reads), and the release it served was removed since: there is
    nothing to switch back to, and the error says the new release stays current."""
    env, _state = systemd
    root, port = tmp_path / "board", free_port()
    first = edgesdk("deploy", tiny_bundle.path, "--to", root, "--service", "--service-port", port, env=env)
    assert first.returncode == 0, first.stderr
    shutil.rmtree(root / "releases" / tiny_bundle.bundle_id)
    newer = bundle_variant(tiny_bundle.path, tmp_path / "newer", "newer")

    failed = edgesdk("deploy", newer.path, "--to", root, env={**env, "EDGESDK_API_KEY": " "})

    assert failed.returncode == 8, failed.stderr
    assert "Traceback" not in failed.stderr
    assert current_id(root) == newer.bundle_id
    assert "the system service edgesdk-serve did not come up" in failed.stderr
    assert (f"releases/{newer.bundle_id} (smoke-tested) stays current: there is no earlier release to go back "
            "to") in failed.stderr
    assert "may be" not in failed.stderr
    assert "once the board answers" not in failed.stderr


def test_a_switch_back_the_board_refuses_says_current_stays_the_new_release(tiny_bundle, tmp_path):
    """The release to switch back to went after the probe (removed by hand, or by another deploy's prune): the board
    refuses the switch back before it moves any link, so current is the new release, not "either"."""
    root = tmp_path / "board"
    newer = bundle_variant(tiny_bundle.path, tmp_path / "newer", "newer")
    for bundle in (tiny_bundle, newer):
        done = edgesdk("deploy", bundle.path, "--to", root)
        assert done.returncode == 0, done.stderr
    shutil.rmtree(root / "releases" / tiny_bundle.bundle_id)
    board = Board(LocalTransport(str(root)), sys.executable, str(root))
    failed = DeployError("the system service edgesdk-serve did not come up", "see its journal")

    try:
        switch_back(board, failed, tiny_bundle.bundle_id, newer.bundle_id, None, None)
    except DeployError as error:
        refused = error
    else:
        raise AssertionError("the switch back to a removed release was not refused")

    assert current_id(root) == newer.bundle_id
    assert refused.problem.startswith("the system service edgesdk-serve did not come up\n")
    assert f"the board refused to switch back to releases/{tiny_bundle.bundle_id}" in refused.problem
    assert f"release {tiny_bundle.bundle_id} is not on the board" in refused.problem
    assert refused.problem.endswith(f"so current stays releases/{newer.bundle_id} (smoke-tested)")
    assert "may be" not in refused.problem
    assert "--rollback --release ID" in refused.fix
    assert "once the board answers" not in refused.fix
