"""The board side of deploy (board_transfer, board_ops): a file the board's filesystem refuses at its size (EFBIG),
and a release prune could not remove, which its reply and the deploy's output name.

Every board operation runs the real helper through a LocalTransport."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgesdk.deploy.orchestrate import prune_old_releases
from edgesdk.deploy.remote import Board
from edgesdk.deploy.report import Reporter
from edgesdk.deploy.transport import LocalTransport
from tests._utils.child_script import script_outcome
from tests.unit.test_deploy_helper import deploy_several, make_bundle, stream_for

# Sends the upload stream in argv[2] to a receive into the deploy root argv[1] of bundle argv[3] (with the file
# argv[4] linked from releases/argv[5] where they are given), in a process whose files (and the helper's it starts)
# may not grow past 20,000 bytes (RLIMIT_FSIZE, SIGXFSZ ignored): the write fails with EFBIG, as a write past 4 GiB on
# a FAT32 card does.
SMALL_FILES = """
import json, resource, signal, sys
from edgesdk.deploy.remote import Board
from edgesdk.deploy.transport import DeployError, LocalTransport

board = Board(LocalTransport(sys.argv[1]), sys.executable, sys.argv[1])
stream = open(sys.argv[2], "rb").read()
params = {"bundle_id": sys.argv[3]}
if len(sys.argv) > 5:
    params["links"] = {sys.argv[4]: sys.argv[5]}
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
try:
    board.call("receive", params, stdin=stream)
    print(json.dumps({"raised": None}))
except DeployError as exc:
    print(json.dumps({"raised": type(exc).__name__, "problem": exc.problem, "fix": exc.fix}))
"""


# What the board says when big.bin (100,000 bytes) meets SMALL_FILES' limit writing into ``staging``.
TOO_LARGE_FIX = ("deploy to a filesystem without the 4 GiB file size limit of FAT32 (ext4, say: pass --remote-root a "
                 "directory on such a disk, or reformat the card), or raise the file size limit of the login shell on "
                 "the board (ulimit -f unlimited), then deploy again; the current release is untouched")


def too_large_problem(staging: Path) -> str:
    return (f"the board refused to write big.bin (100,000 bytes, 0.1 MB) into {staging}: its filesystem, or a file "
            "size limit on the deploy helper, takes no file that large (the write stopped after 20,000 bytes: File "
            "too large)")


def test_a_file_over_the_boards_file_size_limit_is_refused_naming_its_size_and_the_filesystem(tmp_path):
    """EFBIG fell through to the generic "check the permissions and free space" advice, naming only the .partial:
    neither helps with a FAT32 card's 4 GiB limit or ulimit -f, and its .partial (4 GiB there) stayed."""
    pytest.importorskip("resource")
    root = tmp_path / "board"
    bundle = make_bundle(tmp_path / "b", {"a.bin": os.urandom(1_000), "big.bin": os.urandom(100_000)})
    upload = tmp_path / "upload"
    upload.write_bytes(stream_for(bundle))
    staging = root / "staging" / bundle.bundle_id

    outcome = script_outcome(SMALL_FILES, str(root), str(upload), bundle.bundle_id)
    assert outcome["raised"] == "BoardRefusal", outcome
    assert outcome["problem"] == too_large_problem(staging)
    assert outcome["fix"] == TOO_LARGE_FIX
    assert sorted(os.listdir(staging)) == ["a.bin"]  # the file that arrived whole stays; the .partial goes


@pytest.fixture
def undeletable(tmp_path):
    """Makes ``folder`` under a release impossible to remove: a tmpfs mounted there (rmdir EBUSY) as root, else a
    read-only directory holding a file (unlink EACCES). Undone after the test."""
    undo = []

    def make(folder: Path) -> str:
        folder.mkdir()
        if os.geteuid() == 0:
            if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)],
                              capture_output=True).returncode:
                pytest.skip("cannot mount tmpfs here")
            undo.append(["umount", str(folder)])
            return f"{folder}: Device or resource busy"
        (folder / "held").write_bytes(b"x")
        folder.chmod(0o555)
        undo.append(["chmod", "755", str(folder)])
        return f"{folder / 'held'}: Permission denied"

    yield make
    for command in undo:
        subprocess.run(command, check=True)


def test_a_release_prune_could_not_remove_is_reported_with_the_reason_and_shown_by_the_deploy(tmp_path, undeletable):
    """Its removal failed part-way and prune's reply listed it neither removed nor kept, with no word of it: the
    deploy said nothing while the release's files still took their space on the board."""
    root = tmp_path / "board"
    board = Board(LocalTransport(str(root)), sys.executable, str(root))
    ids = deploy_several(board, tmp_path, 4)  # current ids[3], previous ids[2]
    stuck = root / "releases" / ids[0]
    reason = undeletable(stuck / "held")
    os.utime(stuck, (0, 0))  # changed long before its last switch: no deploy in flight

    reply = board.call("prune", {"keep": 1})
    assert reply["removed"] == [ids[1]]
    assert reply["kept"] == [ids[3], ids[2]]
    assert reply["failed"] == [{"name": ids[0], "path": str(stuck), "error": reason}]
    assert stuck.is_dir()

    lines = []  # the next deploy's prune: what the failed removal took out of the release left it no deploy in flight
    prune_old_releases(board, Reporter(1, write=lines.append), keep=1)
    assert len(lines) == 1, lines
    assert lines[0].endswith(f" warning: the board's {stuck} could not be removed ({reason}) and still takes its "
                             f"space: remove it by hand on the board, rm -rf {stuck} (with sudo where another user "
                             "owns its files)")


def test_a_stale_transfer_prune_could_not_remove_is_reported_too(tmp_path, undeletable):
    root = tmp_path / "board"
    board = Board(LocalTransport(str(root)), sys.executable, str(root))
    bundle = make_bundle(tmp_path / "b", {"w": b"weights"})
    stale = root / "staging" / "abcd0123abcd0123"
    stale.mkdir(parents=True)
    reason = undeletable(stale / "held")
    os.utime(stale, (0, 0))  # last used in 1970
    board.call("receive", {"bundle_id": bundle.bundle_id}, stdin=stream_for(bundle))

    reply = board.call("prune", {"keep": 1})
    assert reply["removed"] == []
    assert reply["failed"] == [{"name": "staging/abcd0123abcd0123", "path": str(stale), "error": reason}]
