"""Deploy, 61: what deploy says when it cannot switch back a redeploy of the release that was current, with another
edgesdk, whose switch moved runtime/current alone. The errors named a switch of current "back to releases/ID" from
that same release, and a rollback to it: current never moved, and a rollback refuses the release that is current.
They now say that current stays, where runtime/current may point, and how to get back to the runtime it ran with.

ssh runs against a real sshd on 127.0.0.1 (the ``ssh_server`` fixture), the board helper is the real one, and
``tests/_utils/fake_systemd.py`` stands in for systemctl."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from edgesdk.deploy.orchestrate import interrupted
from tests._utils import fake_systemd
from tests._utils.deploy import current_id, edgesdk
from tests.unit.test_deploy48 import ServiceBoard, urllib_open
from tests.unit.test_deploy_mend60 import _lose_nth


def serving_on_older(board: ServiceBoard) -> str:
    """``board`` after a first deploy --service, its runtime/current moved back to an ``older`` runtime (as if that
    deploy had run an older edgesdk), and this checkout's runtime installed beside it: that runtime's key, the one a
    redeploy of the current release switches runtime/current to."""
    root = board.root
    board.runtime(None)
    first = edgesdk(*board.deploy, "--service", "--service-port", board.port)
    assert first.returncode == 0, first.stderr
    board.runtime("older")
    os.unlink(root / "runtime" / "current")
    os.symlink("older", root / "runtime" / "current")
    return board.runtime(None)


@pytest.mark.parametrize("happened", [False, True])
def test_no_answer_to_the_switch_back_of_a_runtime_alone_says_current_stays_and_runtime_current_may_have_moved(
        ssh_server, tiny_bundle, tmp_path, happened):
    """The unit an earlier deploy --service installed did not come up on the runtime a redeploy of the current
    release switched to, and the switch of runtime/current back got no answer (its reply lost after it ran, or it
    never reached the board). The error said the current release "may be releases/ID (smoke-tested) or
    releases/ID", the same one, and that a rollback to it goes back to it, which the board refuses."""
    board = ServiceBoard(tmp_path, ssh_server, tiny_bundle)
    root, bundle_id = board.root, tiny_bundle.bundle_id
    try:
        key = serving_on_older(board)
        (root / "runtime" / key / "broken").touch()

        # the first switch is the deploy's, the second the switch back
        failed = edgesdk(*board.deploy, "--ssh-command", _lose_nth(tmp_path, "switch", 2, happened))

        assert failed.returncode == 8, failed.stderr
        assert "Traceback" not in failed.stderr
        said = " ".join(failed.stderr.split())
        assert f"{key} is broken" in said, said  # the unit's journal
        assert "switching runtime/current back to older failed too" in said, said
        assert (f"runtime/current may still point to {key} (smoke-tested with releases/{bundle_id}) or back to "
                "older, the runtime it ran with before this deploy") in said, said
        assert f"releases/{bundle_id} stays current, as it was before this deploy" in said, said
        assert f"or releases/{bundle_id}" not in said, said
        assert "--rollback --release" not in said, said
        assert "once the board answers, 'edgesdk deploy --status' shows which (its runtime line)" in said, said
        assert "Where it is older, restart the unit so it serves with it (systemctl restart edgesdk-serve" in said
        assert ("where it is the new one, deploying this bundle with the edgesdk whose runtime is older (it stays on "
                "the board) switches runtime/current back to it") in said, said
        assert f"'edgesdk deploy --rollback' cannot, as it refuses releases/{bundle_id}" in said, said

        assert current_id(root) == bundle_id
        assert os.readlink(root / "runtime" / "current") == ("older" if happened else key)
        assert (root / "runtime" / "older" / "bin" / "edgesdk").exists()  # still there to go back to
        for broken in (root / "runtime").glob("*/broken"):
            broken.unlink()
        refused = edgesdk("deploy", "--rollback", "--release", bundle_id, *board.deploy[2:])
        assert refused.returncode != 0
        assert f"release {bundle_id} is already current" in refused.stderr, refused.stderr
        if happened:  # what the error says to do where runtime/current is back on older
            restarted = subprocess.run([str(tmp_path / "bin" / "systemctl"), "restart", "edgesdk-serve"],
                                       env={**os.environ, **board.env}, capture_output=True, text=True, timeout=120)
            assert restarted.returncode == 0, restarted.stdout
            assert _healthy(board.port)
            served = [line.split()[0] for line in board.log.read_text().splitlines() if line.endswith(" serve")]
            assert served[-1] == "older"
    finally:
        fake_systemd.stop_all(board.state)


def _healthy(port: int) -> bool:
    """Whether the unit's server on ``port`` answers /health with 200 within a minute of its start."""
    import time
    import urllib.error

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib_open(f"http://127.0.0.1:{port}/health") as reply:
                return reply.status == 200
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.2)
    return False


def test_a_refused_switch_back_of_a_runtime_alone_says_runtime_current_stays_the_new_one(ssh_server, tiny_bundle,
                                                                                         tmp_path):
    """The board refused the switch of runtime/current back (here: the new runtime's server, which did not come up,
    left the deploy root writable by every user, which the board's lock refuses). The error said it "refused to
    switch back to releases/ID", the release current had never left, and that "current stays releases/ID", with
    nothing about runtime/current, the link that moved."""
    board = ServiceBoard(tmp_path, ssh_server, tiny_bundle)
    root, bundle_id = board.root, tiny_bundle.bundle_id
    try:
        key = serving_on_older(board)
        script = root / "runtime" / key / "bin" / "edgesdk"
        script.write_text(f'#!/bin/sh\nif [ "$1" = serve ]; then chmod 777 "{root}"; echo "{key} is broken" >&2; '
                          f'exit 3; fi\nexec "{sys.executable}" -m edgesdk.cli "$@"\n')
        mode = root.stat().st_mode & 0o7777

        failed = edgesdk(*board.deploy)

        os.chmod(root, mode)
        assert failed.returncode == 8, failed.stderr
        assert "Traceback" not in failed.stderr
        said = " ".join(failed.stderr.split())
        assert f"{key} is broken" in said, said
        assert "the board refused to switch runtime/current back to older (the deploy root" in said, said
        assert (f"moved no link, so runtime/current stays {key} (smoke-tested with releases/{bundle_id}, which stays "
                "current, as it was before this deploy)") in said, said
        assert f"back to releases/{bundle_id}" not in said, said
        assert "--rollback --release" not in said, said
        assert "deploying this bundle with the edgesdk whose runtime is older" in said, said
        assert os.readlink(root / "runtime" / "current") == key
        assert current_id(root) == bundle_id
    finally:
        fake_systemd.stop_all(board.state)


def test_the_ctrl_c_message_of_a_runtime_alone_switch_back_names_the_runtime_not_a_switch_of_current():
    """A Ctrl-C while (or after) switching runtime/current back, after the unit did not come up on the runtime a
    redeploy of the current release switched to, said current was being switched "back to releases/ID" after the
    unit "did not come up on releases/ID", the same release, and that current "may point to either"."""
    progress = {"where": "pi@board", "bundle_id": "abc", "current": "abc", "runtime_key": "new-key",
                "runtime_before": "older"}
    during = interrupted({**progress, "stage": "switch back"})
    assert "releases/abc stays current, as it was before this deploy" in during.problem
    assert "while switching runtime/current back to older" in during.problem, during.problem
    assert "did not come up on new-key: runtime/current may point to either" in during.problem, during.problem
    assert "back to releases/abc" not in during.problem
    assert "'edgesdk deploy --status' shows which (its runtime line)" in during.fix
    assert "deploying this bundle with the edgesdk whose runtime is older" in during.fix, during.fix

    after = interrupted({**progress, "stage": "switched back"})
    assert "after switching runtime/current on pi@board back to older" in after.problem, after.problem
    assert "did not come up on new-key; releases/abc stays current" in after.problem, after.problem
    assert "back to releases/abc" not in after.problem
    assert "restart the unit so it serves current" in after.fix

    # a switch back of current to another release: as before
    other = interrupted({**progress, "current": "old", "stage": "switch back"})
    assert "while switching current on pi@board back to releases/old" in other.problem
