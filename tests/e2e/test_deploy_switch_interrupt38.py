"""Ctrl-C while a deploy switches ``current``, against a real OpenSSH server on 127.0.0.1: the switch may have
happened on the board, and the same deploy again then finds current already switched and restarts the unit an
earlier ``deploy --service`` installed only where it is down, leaving one that answers on the release it started
with, so the message says to restart that one."""

from __future__ import annotations

import pytest

from tests._utils.deploy import bundle_variant, current_id, edgesdk
from tests.e2e.test_deploy_interrupt38 import deploy_args, interrupt_when_held

pytestmark = pytest.mark.slow


def test_ctrl_c_while_a_deploy_switches_says_a_rerun_that_finds_it_switched_leaves_a_running_unit(
        ssh_server, tiny_bundle, tmp_path):
    root = tmp_path / "board"
    first = edgesdk(*deploy_args(ssh_server, root, tiny_bundle.path))
    assert first.returncode == 0, first.stderr
    newer = bundle_variant(tiny_bundle.path, tmp_path / "newer", "newer")

    cut = interrupt_when_held(tmp_path, deploy_args(ssh_server, root, newer.path), "switch", 0)
    assert cut.returncode == 130, cut.stderr
    assert "Traceback" not in cut.stderr
    assert (f"while switching current on {ssh_server.destination}: current may already point to "
            f"releases/{newer.bundle_id} (smoke-tested) or still to releases/{tiny_bundle.bundle_id}") in cut.stderr
    assert ("where it finds the switch already done, it restarts the unit an earlier deploy --service installed "
            "only if that unit is down, and leaves one that answers on its /health running on what it started with: "
            "restart that one, systemctl restart edgesdk-serve") in cut.stderr
    assert "restarts no unit" not in cut.stderr
    assert current_id(root) == tiny_bundle.bundle_id  # held before the switch ran on the board

    again = edgesdk(*deploy_args(ssh_server, root, newer.path))
    assert again.returncode == 0, again.stderr
    assert current_id(root) == newer.bundle_id
