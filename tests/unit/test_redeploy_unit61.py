"""Deploy, 61: a redeploy that switches nothing still checks the unit an earlier deploy --service installed.

A redeploy of the current release with another edgesdk switched runtime/current alone; the unit did not come up on
it, and the switch of runtime/current back got no answer, so the board kept the new runtime with the unit down. The
same deploy again found current and runtime/current where it would switch them, restarted no unit, and said
"deployed" while nothing served. It now checks that the unit is active and answers on its /health, restarts it
where it does not (as after a switch), and where it still does not come up fails naming the unit and its state,
switching nothing back. A unit that runs and answers is left running.

ssh runs against a real sshd on 127.0.0.1 (the ``ssh_server`` fixture), the board helper is the real one, and
``tests/_utils/fake_systemd.py`` stands in for systemctl. The runtime key hashes this checkout's sources: where
another edit moves it between the set-up and the redeploy, the redeploy switches runtime/current after all (the
assertion on "runtime/current ->" says so), and the test is to be run again."""

from __future__ import annotations

import os
import urllib.error

import pytest

from tests._utils import fake_systemd
from tests._utils.deploy import current_id, edgesdk
from tests.unit.test_deploy48 import ServiceBoard, urllib_open
from tests.unit.test_deploy_mend60 import _lose_nth
from tests.unit.test_switch_back61 import serving_on_older


def _left_down(tmp_path, ssh_server, tiny_bundle):
    """A board whose unit (from a first deploy --service) is down on the runtime a redeploy switched to, as the
    switch of runtime/current back got no answer: (board, that runtime's key)."""
    board = ServiceBoard(tmp_path, ssh_server, tiny_bundle)
    root = board.root
    key = serving_on_older(board)
    (root / "runtime" / key / "broken").touch()
    failed = edgesdk(*board.deploy, "--ssh-command", _lose_nth(tmp_path, "switch", 2, False))
    assert failed.returncode == 8, failed.stderr
    assert "switching runtime/current back to older failed too" in failed.stderr, failed.stderr
    assert os.readlink(root / "runtime" / "current") == key
    assert not _answers(board.port)
    return board, key


def _answers(port) -> bool:
    try:
        with urllib_open(f"http://127.0.0.1:{port}/health") as reply:
            return reply.status == 200
    except (urllib.error.URLError, ConnectionError):
        return False


def _restarts(board) -> int:
    return len([c for c in fake_systemd.calls(board.state) if c[-2:] == ["restart", "edgesdk-serve"]])


def test_a_redeploy_that_switches_nothing_restarts_the_unit_left_down(ssh_server, tiny_bundle, tmp_path):
    board, key = _left_down(tmp_path, ssh_server, tiny_bundle)
    try:
        (board.root / "runtime" / key / "broken").unlink()  # what the journal said is fixed
        restarts = _restarts(board)

        again = edgesdk(*board.deploy)

        assert again.returncode == 0, again.stderr
        assert f"current already is releases/{tiny_bundle.bundle_id}" in again.stderr
        assert "runtime/current ->" not in again.stderr, again.stderr  # nothing switched (see the module's note)
        assert "(from an earlier --service deploy) restarted; it serves current" in again.stderr, again.stderr
        assert _restarts(board) - restarts == 1
        assert _answers(board.port)
        served = [line.split()[0] for line in board.log.read_text().splitlines() if line.endswith(" serve")]
        assert served[-1] == key

        up = edgesdk(*board.deploy)  # the unit runs and answers: left running

        assert up.returncode == 0, up.stderr
        assert ("(from an earlier --service deploy) is active and answers on its /health: left running, as nothing "
                "was switched") in up.stderr, up.stderr
        assert _restarts(board) - restarts == 1
        assert _answers(board.port)
    finally:
        fake_systemd.stop_all(board.state)


@pytest.mark.parametrize("with_service", [False, True])
def test_a_redeploy_that_switches_nothing_whose_unit_stays_down_fails_and_switches_nothing(
        ssh_server, tiny_bundle, tmp_path, with_service):
    """The server still does not come up: the deploy fails naming the unit and its state, with its journal, and
    leaves current and runtime/current as they were (the release was current before this deploy). With --service
    the install restarts the unit and the undo has nothing to switch back either."""
    board, key = _left_down(tmp_path, ssh_server, tiny_bundle)
    root, bundle_id = board.root, tiny_bundle.bundle_id
    try:
        restarts = _restarts(board)
        extra = ["--service", "--service-port", board.port] if with_service else []

        again = edgesdk(*board.deploy, *extra)

        assert again.returncode == 8, again.stderr
        assert "Traceback" not in again.stderr
        said = " ".join(again.stderr.split())
        assert "runtime/current ->" not in said, said  # nothing switched (see the module's note)
        # a system service where the tests run as root, a user one otherwise (board_service.unit_scope)
        assert "service edgesdk-serve did not come up: its server exited (the unit is failed)" in said, said
        assert f"{key} is broken" in said, said  # the unit's journal
        if with_service:
            assert f"releases/{bundle_id} stays current, as it was before this deploy" in said, said
        else:
            assert (f"this deploy switched nothing (releases/{bundle_id} was current already, with runtime/current "
                    f"{key}), so nothing was switched back: releases/{bundle_id} stays current and the unit is not "
                    "serving it") in said, said
            assert "fix: fix what the unit's journal shows (journalctl -u edgesdk-serve" in said, said
        assert "deployed bundle" not in said
        assert current_id(root) == bundle_id
        assert os.readlink(root / "runtime" / "current") == key
        assert _restarts(board) - restarts == 1  # tried once, on the runtime that is current
        assert not _answers(board.port)
    finally:
        fake_systemd.stop_all(board.state)
