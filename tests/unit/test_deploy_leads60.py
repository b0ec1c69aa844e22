"""Deploy leads 60: the switch back after a switch whose reply was lost, where the release it would go back to was
removed from the board (real sshd, the real board helper); the board's refusal of a file linked from an earlier
release that is over the filesystem's size limit (EFBIG)."""

from __future__ import annotations

import shutil

import pytest

from tests._utils.deploy import bundle_variant, current_id, edgesdk, faulty_ssh_command


def board_with_current_removed(ssh_server, tiny_bundle, tmp_path):
    """A board (real sshd) whose current release, ``tiny_bundle``, had its directory removed by hand, with the
    runtime this checkout's deploy switches to on it already: the board, a newer bundle, and the deploy argv that
    switches the board to it."""
    from tests.unit.test_deploy48 import ServiceBoard

    board = ServiceBoard(tmp_path, ssh_server, tiny_bundle)
    assert edgesdk("deploy", tiny_bundle.path, "--to", board.root).returncode == 0
    shutil.rmtree(board.root / "releases" / tiny_bundle.bundle_id)
    newer = bundle_variant(tiny_bundle.path, tmp_path / "newer", "newer")
    board.runtime(None)  # the runtime this checkout's deploy switches to, on the board already
    return board, newer, ["deploy", newer.path, *board.deploy[2:]]


def test_a_lost_switch_reply_away_from_a_removed_release_does_not_name_it_as_the_switch_back(ssh_server, tiny_bundle,
                                                                                            tmp_path):
    """current pointed to a release whose directory was removed (by hand); the deploy's switch happened on the board
    and its reply was lost. The deploy then asked the board to switch back to the removed release and said that
    switching back to it failed and current may be it, with a rollback as the way back, though no switch and no
    rollback can go to it. It says that the switch may have happened, that the release current pointed to is no
    longer on the board, and that the same deploy again finishes the switch."""
    board, newer, deploy = board_with_current_removed(ssh_server, tiny_bundle, tmp_path)
    root = board.root
    lose = faulty_ssh_command(f"lose:switch:{tmp_path / 'board-gone'}", ssh_server.process.pid)

    failed = edgesdk(*deploy, "--ssh-command", lose)

    assert failed.returncode == 8, failed.stderr
    assert "Traceback" not in failed.stderr
    assert current_id(root) == newer.bundle_id  # the switch did happen
    assert f"switching back to releases/{tiny_bundle.bundle_id}" not in failed.stderr, failed.stderr
    assert "--rollback" not in failed.stderr
    assert (f"the board's reply to the switch did not come back, so current may already point to "
            f"releases/{newer.bundle_id} (smoke-tested) or still to releases/{tiny_bundle.bundle_id}, which is no "
            "longer on the board (its directory was removed)") in failed.stderr, failed.stderr
    assert "deploying the same bundle again finishes the switch" in failed.stderr
    again = edgesdk(*deploy)  # what it says, the board back
    assert again.returncode == 0, again.stderr
    assert current_id(root) == newer.bundle_id


@pytest.fixture
def release_on_its_own_disk():
    """Moves the files of a release directory onto a tmpfs mounted there (mounting one needs root), so that no hard
    link from it reaches staging (EXDEV) and the receive copies its files; unmounted after the test."""
    import os
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = []

    def move(release):
        saved = release.parent / (release.name + ".saved")
        shutil.copytree(release, saved)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(release)],
                          capture_output=True).returncode:
            pytest.skip("cannot mount tmpfs here")
        mounted.append(release)
        shutil.copytree(saved, release, dirs_exist_ok=True)
        shutil.rmtree(saved)

    yield move
    for release in mounted:
        subprocess.run(["umount", str(release)], check=True)


def test_a_file_reused_from_an_earlier_release_over_the_file_size_limit_is_refused_naming_its_size(
        tmp_path, release_on_its_own_disk):
    """A file the board holds in an earlier release is linked into staging, or copied where no hard link reaches it
    (another filesystem). A copy over the filesystem's file size limit (FAT32's 4 GiB, ulimit -f) fell through to the
    generic "check the permissions and free space" advice, where a file sent refuses naming its size and the
    filesystem; the copy cut short goes, the files that arrived whole stay."""
    import os
    import sys

    from edgesdk.deploy.remote import Board
    from edgesdk.deploy.transport import LocalTransport
    from tests._utils.child_script import script_outcome
    from tests.unit.test_board_prune59 import SMALL_FILES, TOO_LARGE_FIX, too_large_problem
    from tests.unit.test_deploy_helper import commit_by_hand, make_bundle, stream_for

    pytest.importorskip("resource")
    root = tmp_path / "board"
    big = os.urandom(100_000)
    earlier = make_bundle(tmp_path / "earlier", {"big.bin": big, "a.bin": os.urandom(1_000)}, note="earlier")
    bundle = make_bundle(tmp_path / "b", {"big.bin": big, "a.bin": os.urandom(1_000)}, note="new")
    assert commit_by_hand(Board(LocalTransport(str(root)), sys.executable, str(root)), earlier)["problems"] == []
    release_on_its_own_disk(root / "releases" / earlier.bundle_id)
    upload = tmp_path / "upload"
    upload.write_bytes(stream_for(bundle, ["a.bin", "manifest.json"]))
    staging = root / "staging" / bundle.bundle_id

    outcome = script_outcome(SMALL_FILES, str(root), str(upload), bundle.bundle_id, "big.bin", earlier.bundle_id)

    assert outcome["raised"] == "BoardRefusal", outcome
    assert outcome["problem"] == too_large_problem(staging)
    assert outcome["fix"] == TOO_LARGE_FIX
    assert os.listdir(staging) == []  # the copy cut short goes
    assert (root / "releases" / earlier.bundle_id / "big.bin").read_bytes() == big
