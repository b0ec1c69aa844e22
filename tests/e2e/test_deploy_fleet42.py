"""``edgesdk deploy`` to several boards against real OpenSSH servers on 127.0.0.1.

Two sshd instances on two ports are two boards (each with its own deploy root in a temporary
directory); a port nothing listens on is a board that is off. As in test_deploy_ssh.py, the runtime
venv inherits this interpreter's packages, so no test downloads anything.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from edgesdk.bundle import verify_bundle
from tests._utils.deploy import bundle_variant, current_id, edgesdk, interrupt_once_held
from tests._utils.sshd import free_port, serve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def board_a(tmp_path_factory):
    yield from serve(tmp_path_factory, "sshd-a")


@pytest.fixture(scope="module")
def board_b(tmp_path_factory):
    yield from serve(tmp_path_factory, "sshd-b")


def common(*servers) -> list:
    """Options that point ssh at the test servers' files only (the first server's key is the default -i)."""
    known = " ".join(str(server.known_hosts) for server in servers)
    return ["--ssh-config", "/dev/null", "-i", str(servers[0].user_key),
            "--ssh-option", f"UserKnownHostsFile={known}", "--ssh-option", "GlobalKnownHostsFile=/dev/null",
            "--remote-python", sys.executable]


def inventory(path: Path, *lines: str) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def summary_row(stdout: str, label: str) -> str:
    rows = [line for line in stdout.splitlines() if line.startswith(f"  {label} ")]
    assert len(rows) == 1, stdout
    return rows[0]


def retry_command(text: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith("retry the "))
    return shlex.split(line.split(": ", 1)[1])


def test_two_boards_are_deployed_concurrently_then_status_and_json_cover_both(board_a, board_b, tiny_bundle,
                                                                              tmp_path):
    root_a, root_b = tmp_path / "board-a", tmp_path / "board-b"
    boards = inventory(tmp_path / "boards.txt", "# two boards, one setting each",
                       f"{board_a.destination}   remote_root={root_a}",
                       "",
                       f"{board_b.destination}   remote_root={root_b} identity={board_b.user_key}  # own key")
    done = edgesdk("deploy", tiny_bundle.path, "--hosts", boards, *common(board_a, board_b),
                   "--runtime-venv-system-site-packages")
    assert done.returncode == 0, done.stderr
    for root in (root_a, root_b):
        assert current_id(root) == tiny_bundle.bundle_id
        verify_bundle(root / "current")
    # every progress line carries its board, whole
    for server in (board_a, board_b):
        assert f"{server.destination}: deploy [8/8] switch current" in done.stderr
        assert f"{server.destination}: deploy       current -> releases/{tiny_bundle.bundle_id} (was none)" \
            in done.stderr
    assert not [line for line in done.stderr.splitlines() if line.startswith("deploy ")], done.stderr
    assert done.stdout.startswith("deploy of 2 boards: 2 of 2 boards ok (")
    for server in (board_a, board_b):
        assert summary_row(done.stdout, server.destination).split()[1:3] == ["ok", tiny_bundle.bundle_id]
    assert "retry" not in done.stdout

    status = edgesdk("deploy", "--status", "--hosts", boards, *common(board_a, board_b))
    assert status.returncode == 0, status.stderr
    blocks = status.stdout.split("\n\n")
    assert len(blocks) == 2
    for block, server, root in zip(blocks, (board_a, board_b), (root_a, root_b), strict=True):
        assert block.startswith(f"board      {server.destination} (")
        assert f"root       {root}" in block
        assert f"current    {tiny_bundle.bundle_id}" in block

    as_json = edgesdk("deploy", "--status", "--json", "--hosts", boards, *common(board_a, board_b))
    assert as_json.returncode == 0, as_json.stderr
    listed = json.loads(as_json.stdout)
    assert [(item["host"], item["ok"], item["root"], item["current"]) for item in listed] == [
        (board_a.destination, True, str(root_a), tiny_bundle.bundle_id),
        (board_b.destination, True, str(root_b), tiny_bundle.bundle_id)]

    # a deploy --json: one object per board, the single-board object with host and ok
    newer = bundle_variant(tiny_bundle.path, tmp_path / "newer", "newer")
    again = edgesdk("deploy", newer.path, "--json", "--hosts", boards, *common(board_a, board_b),
                    "--runtime-venv-system-site-packages")
    assert again.returncode == 0, again.stderr
    results = json.loads(again.stdout)
    assert [(r["host"], r["ok"], r["bundle_id"], r["previous"]) for r in results] == [
        (board_a.destination, True, newer.bundle_id, tiny_bundle.bundle_id),
        (board_b.destination, True, newer.bundle_id, tiny_bundle.bundle_id)]
    assert "deploy of 2 boards: 2 of 2 boards ok" in again.stderr  # the summary stays off stdout

    back = edgesdk("deploy", "--rollback", "--hosts", boards, *common(board_a, board_b))
    assert back.returncode == 0, back.stderr
    assert f"{board_b.destination}: rollback [4/4] switch current" in back.stderr
    for root in (root_a, root_b):
        assert current_id(root) == tiny_bundle.bundle_id


def test_an_unreachable_board_fails_alone_and_the_summary_says_how_to_retry_it(board_a, tiny_bundle, tmp_path):
    root = tmp_path / "board"
    dead = f"{board_a.user}@127.0.0.1:{free_port()}"
    proc = edgesdk("deploy", tiny_bundle.path, "--host", dead, "--host", board_a.destination, "--remote-root", root,
                   *common(board_a), "--runtime-venv-system-site-packages")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert current_id(root) == tiny_bundle.bundle_id
    assert proc.stdout.startswith("deploy of 2 boards: 1 of 2 boards ok, 1 failed (")
    failed = summary_row(proc.stdout, dead)
    assert failed.split()[1] == "failed"
    assert f"cannot reach {dead}" in failed
    assert summary_row(proc.stdout, board_a.destination).split()[1] == "ok"
    assert f"{dead}: error: cannot reach {dead}" in proc.stderr
    assert f"{dead}:   fix: check that the board is powered" in proc.stderr
    retry = retry_command(proc.stdout)
    assert retry[:3] == ["edgesdk", "deploy", str(tiny_bundle.path)]
    hosts = [retry[i + 1] for i, word in enumerate(retry) if word == "--host"]
    assert hosts == [dead]
    assert retry[retry.index("--remote-root") + 1] == str(root)
    assert "--runtime-venv-system-site-packages" in retry


def test_fail_fast_starts_no_board_after_the_first_failure(board_a, tiny_bundle, tmp_path):
    root = tmp_path / "board"
    dead = f"{board_a.user}@127.0.0.1:{free_port()}"
    proc = edgesdk("deploy", tiny_bundle.path, "--host", dead, "--host", board_a.destination, "--remote-root", root,
                   "--jobs", 1, "--fail-fast", *common(board_a), "--runtime-venv-system-site-packages")
    assert proc.returncode == 1, proc.stderr
    assert not root.exists()
    assert "1 failed, 1 not started" in proc.stdout
    assert summary_row(proc.stdout, board_a.destination).split()[1:3] == ["not", "started"]
    retry = retry_command(proc.stdout)
    assert [retry[i + 1] for i, word in enumerate(retry) if word == "--host"] == [dead, board_a.destination]
    assert "--fail-fast" in retry


HOLD_RECEIVE = '''
import os, sys, time
marker, args = sys.argv[1], sys.argv[2:]
if not (args and " receive " in args[-1]):
    os.execvp("ssh", ["ssh", *args])
open(marker, "w").close()
time.sleep(600)  # until the SIGINT
'''


def test_ctrl_c_stops_starting_boards_says_what_the_running_one_kept_and_exits_130(board_a, tiny_bundle, tmp_path):
    """Three deploy roots on one board, one at a time: the first is up to date, the second is held in its
    transfer when Ctrl-C comes, the third never starts."""
    roots = [tmp_path / name for name in ("one", "two", "three")]
    first = edgesdk("deploy", tiny_bundle.path, "--host", board_a.destination, "--remote-root", roots[0],
                    *common(board_a), "--runtime-venv-system-site-packages")
    assert first.returncode == 0, first.stderr
    boards = inventory(tmp_path / "boards.txt", *(f"{board_a.destination} remote_root={root}" for root in roots))
    hold = tmp_path / "hold_ssh.py"
    hold.write_text(HOLD_RECEIVE)
    marker = tmp_path / "held"
    cut = interrupt_once_held(["deploy", tiny_bundle.path, "--hosts", boards, "--jobs", 1, *common(board_a),
                               "--runtime-venv-system-site-packages",
                               "--ssh-command", f"{sys.executable} {hold} {marker}"], marker)
    assert cut.returncode == 130, cut.stderr
    assert "Traceback" not in cut.stderr
    labels = [f"{board_a.destination} {root}" for root in roots]
    assert f"{labels[1]}: error: deploy interrupted (Ctrl-C): {board_a.destination} still has no current " \
           f"release; releases/{tiny_bundle.bundle_id} was not switched to" in cut.stderr
    assert "1 of 3 boards ok, 1 interrupted, 1 not started" in cut.stdout
    assert summary_row(cut.stdout, labels[0]).split()[2:4] == ["ok", tiny_bundle.bundle_id]
    assert summary_row(cut.stdout, labels[1]).split()[2:4] == ["interrupted", "none"]
    assert summary_row(cut.stdout, labels[2]).split()[2:5] == ["not", "started", "-"]
    assert current_id(roots[0]) == tiny_bundle.bundle_id
    assert current_id(roots[1]) is None
    assert not roots[2].exists()
    retry = retry_command(cut.stdout)
    assert [retry[i + 1] for i, word in enumerate(retry) if word == "--limit"] == labels[1:]
    assert retry[retry.index("--hosts") + 1] == str(boards)
