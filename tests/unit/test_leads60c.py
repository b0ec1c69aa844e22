"""Leads 60c: what a Ctrl-C while a deploy switches current says of the way back to the release current pointed to
(real sshd, the real board helper): a plain 'edgesdk deploy --rollback' goes to the release ``previous`` names,
which is that release only where the switch happened; ``--rollback --release ID`` names it."""

from __future__ import annotations

import json

from tests._utils.deploy import bundle_variant, current_id, edgesdk


def _board(server, root) -> dict:
    from tests.e2e.test_deploy_interrupt38 import deploy_args

    status = edgesdk(*deploy_args(server, root, "--status", "--json"))
    assert status.returncode == 0, status.stderr
    return json.loads(status.stdout)


def test_ctrl_c_while_switching_names_the_release_to_roll_back_to(ssh_server, tiny_bundle, tmp_path):
    """A board on its second release (previous: its first) cut while a third deploy switched said
    'edgesdk deploy --rollback' goes back; where the switch had not happened that rollback went to the first release,
    not to the second current pointed to. The way back names the second, and does what it says in either case."""
    from tests.e2e.test_deploy_interrupt38 import deploy_args, interrupt_when_held

    root = tmp_path / "board"
    second = bundle_variant(tiny_bundle.path, tmp_path / "second", "second")
    third = bundle_variant(tiny_bundle.path, tmp_path / "third", "third")
    for bundle in (tiny_bundle, second):
        done = edgesdk(*deploy_args(ssh_server, root, bundle.path))
        assert done.returncode == 0, done.stderr

    cut = interrupt_when_held(tmp_path, deploy_args(ssh_server, root, third.path), "switch", 0)

    assert cut.returncode == 130, cut.stderr
    assert "Traceback" not in cut.stderr
    board = _board(ssh_server, root)
    # held before the switch ran: a plain --rollback would go to the first release, not back to the second
    assert (board["current"], board["previous"]) == (second.bundle_id, tiny_bundle.bundle_id)
    assert "'edgesdk deploy --rollback' goes back" not in cut.stderr, cut.stderr
    said = " ".join(cut.stderr.split())
    assert (f"where current already points to releases/{third.bundle_id}, 'edgesdk deploy --rollback --release "
            f"{second.bundle_id}' goes back to releases/{second.bundle_id} (a plain --rollback goes to the release "
            f"previous names, which is releases/{second.bundle_id} only where the switch happened)") in said, said

    # not switched: the named rollback finds the release current already and changes nothing
    kept = edgesdk(*deploy_args(ssh_server, root, "--rollback", "--release", second.bundle_id))
    assert kept.returncode != 0
    assert f"release {second.bundle_id} is already current" in kept.stderr, kept.stderr
    assert current_id(root) == second.bundle_id

    # switched (the same deploy again finishes it): the named rollback goes back to the second release
    again = edgesdk(*deploy_args(ssh_server, root, third.path))
    assert again.returncode == 0, again.stderr
    assert current_id(root) == third.bundle_id
    back = edgesdk(*deploy_args(ssh_server, root, "--rollback", "--release", second.bundle_id))
    assert back.returncode == 0, back.stderr
    assert current_id(root) == second.bundle_id


def test_ctrl_c_while_switching_from_no_release_names_no_rollback():
    """A board with no current release has none to go back to: no rollback is named."""
    from edgesdk.deploy.orchestrate import interrupted

    cut = interrupted({"where": "pi@board", "bundle_id": "new", "current": None, "stage": "switch"})
    assert "or still to no current release" in cut.problem
    assert "--rollback" not in cut.fix, cut.fix
    assert cut.fix.startswith("'edgesdk deploy --status' shows which; the same deploy again finishes the switch")
