"""Ctrl-C during ``edgesdk deploy`` and ``--rollback`` against a real OpenSSH server on 127.0.0.1.

The interrupt is a SIGINT to the command's whole process group, as a terminal sends it (the ssh client
gets it too). An ssh wrapper holds the deploy at a known point (part of the upload forwarded, or a board
operation about to run) and writes a marker file, so the signal lands there and nowhere else.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests._utils.deploy import bundle_variant, current_id, edgesdk, interrupt_once_held

pytestmark = pytest.mark.slow

HOLD_SSH = '''
import os, subprocess, sys, time
operation, forward, marker = sys.argv[1], int(sys.argv[2]), sys.argv[3]
args = sys.argv[4:]
if not (args and f" {operation} " in args[-1]):
    os.execvp("ssh", ["ssh", *args])
proc = subprocess.Popen(["ssh", *args], stdin=subprocess.PIPE) if forward else None
done = 0
while done < forward:
    block = sys.stdin.buffer.read(min(1 << 16, forward - done))
    if not block:
        break
    proc.stdin.write(block)
    proc.stdin.flush()
    done += len(block)
open(marker, "w").close()
time.sleep(600)  # until the SIGINT
'''


def deploy_args(server, root, *extra) -> list:
    return ["deploy", *extra, *server.client_args(), "--host", server.destination, "--remote-root", root,
            "--remote-python", sys.executable, "--runtime-venv-system-site-packages"]


def interrupt_when_held(tmp_path: Path, argv: list, operation: str, forward: int) -> subprocess.CompletedProcess:
    """Run ``edgesdk ARGV`` with its ssh held at ``operation`` after ``forward`` bytes of its input, then
    SIGINT its process group."""
    hold = tmp_path / "hold_ssh.py"
    hold.write_text(HOLD_SSH)
    marker = tmp_path / "held"
    command = f"{sys.executable} {hold} {operation} {forward} {marker}"
    return interrupt_once_held([*argv, "--ssh-command", command], marker)


def test_ctrl_c_during_the_transfer_says_the_board_keeps_its_release_and_the_rerun_finishes(
        ssh_server, tiny_bundle, tmp_path):
    root = tmp_path / "board"
    first = edgesdk(*deploy_args(ssh_server, root, tiny_bundle.path))
    assert first.returncode == 0, first.stderr
    newer = bundle_variant(tiny_bundle.path, tmp_path / "newer", "newer", padding=2_000_000)

    cut = interrupt_when_held(tmp_path, deploy_args(ssh_server, root, newer.path), "receive", 300_000)
    assert cut.returncode == 130, cut.stderr
    assert "Traceback" not in cut.stderr
    assert "Aborted!" not in cut.stderr
    assert (f"error: deploy interrupted (Ctrl-C): {ssh_server.destination} keeps releases/{tiny_bundle.bundle_id} "
            f"as current; releases/{newer.bundle_id} was not switched to") in cut.stderr
    assert "fix: run the same command again" in cut.stderr
    assert current_id(root) == tiny_bundle.bundle_id
    status = edgesdk(*deploy_args(ssh_server, root, "--status"))
    assert status.returncode == 0, status.stderr
    assert (f"staging    {newer.bundle_id} (unfinished transfers: a deploy of the same bundle resumes one; the first "
            "deploy more than a day after one was last written removes it)") in status.stdout

    again = edgesdk(*deploy_args(ssh_server, root, newer.path))
    assert again.returncode == 0, again.stderr
    assert current_id(root) == newer.bundle_id


def test_ctrl_c_while_a_rollback_switches_names_both_releases_current_may_be(ssh_server, tiny_bundle, tmp_path):
    root = tmp_path / "board"
    newer = bundle_variant(tiny_bundle.path, tmp_path / "newer", "newer")
    for bundle in (tiny_bundle, newer):
        done = edgesdk(*deploy_args(ssh_server, root, bundle.path))
        assert done.returncode == 0, done.stderr

    cut = interrupt_when_held(tmp_path, deploy_args(ssh_server, root, "--rollback"), "switch", 0)
    assert cut.returncode == 130, cut.stderr
    assert "Traceback" not in cut.stderr
    assert "Aborted!" not in cut.stderr
    assert (f"error: rollback interrupted (Ctrl-C) while switching current on {ssh_server.destination}: current "
            f"may already point to releases/{tiny_bundle.bundle_id} or still to releases/{newer.bundle_id}"
            ) in cut.stderr
    assert f"--rollback --release {tiny_bundle.bundle_id}" in cut.stderr
    assert current_id(root) == newer.bundle_id  # held before the switch ran on the board


def test_ctrl_c_after_the_switch_says_the_release_is_live(ssh_server, tiny_bundle, tmp_path):
    root = tmp_path / "board"
    first = edgesdk(*deploy_args(ssh_server, root, tiny_bundle.path))
    assert first.returncode == 0, first.stderr
    newer = bundle_variant(tiny_bundle.path, tmp_path / "newer", "newer")

    cut = interrupt_when_held(tmp_path, deploy_args(ssh_server, root, newer.path), "prune", 0)
    assert cut.returncode == 130, cut.stderr
    assert "Traceback" not in cut.stderr
    assert (f"error: deploy interrupted (Ctrl-C) after switching {ssh_server.destination} to "
            f"releases/{newer.bundle_id} (was releases/{tiny_bundle.bundle_id})") in cut.stderr
    assert "fix: the release is live" in cut.stderr
    assert current_id(root) == newer.bundle_id


def test_ctrl_c_during_a_first_deploy_says_the_board_still_has_no_release(ssh_server, tiny_bundle, tmp_path):
    root = tmp_path / "board"
    cut = interrupt_when_held(tmp_path, deploy_args(ssh_server, root, tiny_bundle.path), "receive", 1000)
    assert cut.returncode == 130, cut.stderr
    assert (f"error: deploy interrupted (Ctrl-C): {ssh_server.destination} still has no current release; "
            f"releases/{tiny_bundle.bundle_id} was not switched to") in cut.stderr
    assert current_id(root) is None


def test_ctrl_c_while_probing_says_nothing_changed(ssh_server, tiny_bundle, tmp_path):
    root = tmp_path / "board"
    cut = interrupt_when_held(tmp_path, deploy_args(ssh_server, root, tiny_bundle.path), "probe", 0)
    assert cut.returncode == 130, cut.stderr
    assert "error: deploy interrupted (Ctrl-C) before it changed anything on the board" in cut.stderr
    assert not root.exists()
