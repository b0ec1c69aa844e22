"""Deploy to a fleet and to one board, review 65: what a fleet operator saw on three boards.

A bundle that fails verification failed on every board separately and offered a retry that could only fail again; a
board that refused the bundle (another target) was in that retry too; a disk that filled up during a board's switch
said "board: No space left on device" and to check the permissions; a single board's --json printed nothing when it
failed; the second of two deploys of one bundle named a stale previous release; the summary did not tell a board the
deploy changed from one it found up to date; and 'edgesdk verify' refused an archive that deploy takes.

Boards here are deploy roots on this machine (``--to DIR``: the board helper run through a LocalTransport, exactly as
over ssh) or ports nothing listens on; tests/e2e/test_fleet65.py runs the fleet's retry lines against a real sshd.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from edgesdk.deploy import fleet
from edgesdk.deploy.orchestrate import DeployResult
from edgesdk.deploy.orchestrate import deploy as do_deploy
from edgesdk.deploy.releases import STATUS_KEYS
from edgesdk.deploy.remote import Board
from edgesdk.deploy.report import Reporter
from edgesdk.deploy.session import DeployOptions
from edgesdk.deploy.transport import DeployError, LocalTransport
from tests._utils.child_script import script_outcome
from tests._utils.deploy import bundle_variant, current_id, edgesdk
from tests._utils.small_disk import small_disk
from tests._utils.sshd import free_port
from tests.unit.test_deploy_helper import commit_by_hand, deploy_by_hand, make_bundle

DEPLOY_KEYS = [item.name for item in fields(DeployResult)]


def damaged_copy(bundle, destination: Path) -> tuple[Path, str]:
    """A copy of ``bundle`` with one listed file grown by a byte; the file's name."""
    shutil.copytree(bundle.path, destination)
    name = next(name for name in sorted(bundle.manifest["files"]) if name != "model.onnx.data")
    with open(destination / name, "ab") as handle:
        handle.write(b"x")
    return destination, name


def recording_ssh(tmp_path: Path) -> tuple[Path, Path]:
    """An ssh client command that notes each time it is started, then fails as a board that is off: it tells whether
    deploy contacted any board."""
    marker = tmp_path / "ssh-started"
    script = tmp_path / "ssh"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\nexit 255\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, marker


# --- 1. a fleet verifies its bundle once, before any board ------------------------------------------------------


def test_a_fleet_whose_bundle_fails_verification_contacts_no_board_and_exits_with_the_bundle_error(tiny_bundle,
                                                                                                  tmp_path):
    bad, name = damaged_copy(tiny_bundle, tmp_path / "bad")
    ssh, marker = recording_ssh(tmp_path)
    boards = [f"pi@127.0.0.1:{free_port()}", f"pi@127.0.0.1:{free_port()}"]

    done = edgesdk("deploy", bad, "--host", boards[0], "--host", boards[1], "--ssh-command", ssh)

    assert done.returncode == 5, done.stderr
    assert not marker.exists()  # no board contacted
    assert f"bundle {bad} failed verification" in done.stderr
    assert f"{name}: " in done.stderr  # the file that failed, which the summary's first line lost
    assert "retry" not in done.stdout + done.stderr
    assert not any(line.startswith(boards[0]) for line in done.stderr.splitlines())


def test_a_fleet_given_a_path_that_is_no_bundle_contacts_no_board_and_exits_5(tmp_path):
    ssh, marker = recording_ssh(tmp_path)
    missing = tmp_path / "no-such-bundle"

    done = edgesdk("deploy", missing, "--host", f"pi@127.0.0.1:{free_port()}", "--host",
                   f"pi@127.0.0.1:{free_port()}", "--ssh-command", ssh)

    assert done.returncode == 5, done.stderr
    assert not marker.exists()
    assert f"bundle {missing} does not exist" in done.stderr
    assert "retry" not in done.stdout + done.stderr


# --- 2. a board that refused the bundle is not in the retry -----------------------------------------------------


def test_a_board_that_refused_the_bundle_is_left_out_of_the_retry_and_named_apart(tiny_bundle, tmp_path):
    """Two "boards" (deploy roots here): one refuses a bundle built for another target, one fails where a retry may
    succeed (its Python is not there yet). Only the second is retried; the first is named with its own fix."""
    other_target = bundle_variant(tiny_bundle.path, tmp_path / "rpi5", "rpi5", target="rpi5")
    boards = [fleet.FleetBoard(host="refuses", label="refuses"), fleet.FleetBoard(host="later", label="later")]

    def work(board, report, progress):
        if board.host == "refuses":
            options = DeployOptions(to=tmp_path / "root-refuses")
        else:
            options = DeployOptions(to=tmp_path / "root-later", remote_python=str(tmp_path / "no-python-yet"))
        result = do_deploy(other_target.path, options, report, progress)
        return result.__dict__, result.bundle_id

    outcomes, stopped = fleet.run_fleet(boards, work, lambda board: None, fleet.Console(write=lambda line: None))

    assert not stopped
    assert [o.state for o in outcomes] == [fleet.FAILED, fleet.FAILED]
    assert "was built for target 'rpi5'" in outcomes[0].problem
    assert [o.refused for o in outcomes] == [True, False]
    assert [b.host for b in fleet.retry_boards(outcomes)] == ["later"]
    assert [b.host for b in fleet.refused_boards(outcomes)] == ["refuses"]


def test_a_deploy_refused_by_the_target_check_says_so_in_its_progress(tiny_bundle, tmp_path):
    other_target = bundle_variant(tiny_bundle.path, tmp_path / "rpi5", "rpi5", target="rpi5")
    progress: dict = {}
    with pytest.raises(DeployError, match="was built for target 'rpi5'"):
        do_deploy(other_target.path, DeployOptions(to=tmp_path / "root"), Reporter(total=8, write=lambda line: None),
                  progress)
    assert progress["refused"] is True
    assert current_id(tmp_path / "root") is None


# --- 3. a disk that fills up during a board-side step -----------------------------------------------------------


# A switch to releases/argv[2] in the deploy root argv[1], in a process whose files (and the helper's it starts) may
# not grow past argv[3] bytes (RLIMIT_FSIZE, SIGXFSZ ignored): the switch's history line fails with EFBIG.
SWITCH_UNDER_LIMIT = """
import json, resource, signal, sys
from edgesdk.deploy.remote import Board
from edgesdk.deploy.transport import DeployError, LocalTransport

board = Board(LocalTransport(sys.argv[1]), sys.executable, sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), int(sys.argv[3])))
try:
    board.call("switch", {"bundle_id": sys.argv[2]})
    print(json.dumps({"raised": None}))
except DeployError as exc:
    print(json.dumps({"raised": type(exc).__name__, "problem": exc.problem, "fix": exc.fix}))
"""


def two_releases(root: Path, tmp_path: Path) -> tuple[str, str]:
    """releases/<first> current and releases/<second> committed, not switched to."""
    board = Board(LocalTransport(str(root)), sys.executable, str(root))
    first = make_bundle(tmp_path / "first", {"w": os.urandom(100)}, "first")
    second = make_bundle(tmp_path / "second", {"w": os.urandom(100)}, "second")
    deploy_by_hand(board, first)
    commit_by_hand(board, second)
    return first.bundle_id, second.bundle_id


def test_a_switch_whose_write_hits_the_file_size_limit_names_the_step_the_root_and_its_room(tmp_path):
    """A failed write(2) names no file: the reply was "board: File too large" and "check the permissions"."""
    pytest.importorskip("resource")
    root = tmp_path / "board"
    first, second = two_releases(root, tmp_path)
    limit = 20_000
    history = root / "history.jsonl"
    line = history.read_text().splitlines()[-1] + "\n"
    history.write_text(line * (limit // len(line) + 1))  # already past the limit: the switch's line cannot be added

    said = script_outcome(SWITCH_UNDER_LIMIT, str(root), second, str(limit))

    assert said["raised"] == "BoardRefusal", said
    assert said["problem"].startswith(f"the board could not write a file under the deploy root {root} while "
                                      "switching current: File too large"), said
    assert "ulimit -f" in said["problem"]
    assert "MB free there" in said["problem"]
    assert said["fix"].startswith("current is untouched; raise the file size limit"), said
    assert "run the same command again: it resumes" in said["fix"]
    assert current_id(root) == first  # the switch put every link back


def fill(path: Path) -> None:
    """Take the rest of the disk ``path`` lies on: write to it until the disk says it is full."""
    full = None
    with open(path, "wb", buffering=0) as filler:
        while full is None:
            try:
                filler.write(b"\0" * 4096)
            except OSError as exc:
                full = exc
    assert full.errno == errno.ENOSPC, full


def test_a_switch_on_a_full_disk_names_the_step_the_root_its_free_space_and_that_current_is_untouched(tmp_path):
    with small_disk(tmp_path / "disk", "512k") as disk:
        root = disk / "board"
        first, second = two_releases(root, tmp_path)
        fill(disk / "filler")
        board = Board(LocalTransport(str(root)), sys.executable, str(root))

        with pytest.raises(DeployError) as refused:
            board.call("switch", {"bundle_id": second})

        assert refused.value.problem.startswith(f"the board ran out of room under the deploy root {root} while "
                                                "switching current: No space left on device, 0.0 MB free there")
        assert refused.value.fix.startswith(f"current is untouched; free space under the deploy root {root}")
        assert "run the same command again: it resumes where this one stopped" in refused.value.fix
        assert current_id(root) == first


# --- 4. --json on one board prints its object when it fails ----------------------------------------------------


def test_status_json_of_an_unreachable_board_prints_its_object_and_exits_with_the_error(tmp_path):
    host = f"pi@127.0.0.1:{free_port()}"

    done = edgesdk("deploy", "--status", "--host", host, "--json", "--ssh-config", "/dev/null")

    assert done.returncode == 8, done.stderr
    entry = json.loads(done.stdout)
    assert entry["ok"] is False
    assert entry["state"] == fleet.FAILED
    assert entry["host"] == host
    assert entry["remote_root"] == "~/edgesdk"
    assert entry["error"].startswith(f"cannot reach {host}")
    assert entry["fix"]
    assert entry["error"] in done.stderr  # the error is still said on stderr
    unreached = fleet.Outcome(fleet.FleetBoard(host=host, root="~/edgesdk"), state=fleet.FAILED)
    assert list(entry) == list(fleet.json_entries([unreached], STATUS_KEYS)[0])  # a fleet entry's keys, in order


def test_deploy_json_of_a_bundle_that_fails_verification_prints_the_boards_object_and_exits_5(tiny_bundle, tmp_path):
    bad, name = damaged_copy(tiny_bundle, tmp_path / "bad")
    root = tmp_path / "root"

    done = edgesdk("deploy", bad, "--to", root, "--json")

    assert done.returncode == 5, done.stderr
    entry = json.loads(done.stdout)
    assert set(DEPLOY_KEYS) <= set(entry)
    assert entry["bundle_id"] is None
    assert entry["ok"] is False
    assert entry["state"] == fleet.FAILED
    assert entry["host"] is None
    assert entry["remote_root"] == str(root)
    assert f"{name}: " in entry["error"]
    assert entry["release"] is None


# --- 5. two deploys of one bundle at once: the previous release as it stands after the switch ----------------


def test_the_second_of_two_concurrent_deploys_of_one_bundle_names_the_previous_release_the_board_has(tiny_bundle,
                                                                                                     tmp_path):
    """current b, previous a; two deploys of c probe the board. The first switches (current c, previous b); the
    second finds c current already and said "previous: a", what its probe read, where --rollback goes to b."""
    root = tmp_path / "board"
    a, b, c = (bundle_variant(tiny_bundle.path, tmp_path / name, name) for name in "abc")
    for bundle in (a, b):
        do_deploy(bundle.path, DeployOptions(to=root), Reporter(total=8, write=lambda line: None))
    board = Board(LocalTransport(str(root)), sys.executable, str(root))
    first_done = []

    def other_deploy_switches_first(line: str) -> None:
        if "switch current" in line and "[8/8]" in line and not first_done:  # this deploy probed and committed c
            first_done.append(board.call("switch", {"bundle_id": c.bundle_id, "action": "deploy"}))

    result = do_deploy(c.path, DeployOptions(to=root), Reporter(total=8, write=other_deploy_switches_first))

    assert first_done
    assert result.switched is False
    assert os.readlink(root / "previous") == f"releases/{b.bundle_id}"
    assert result.previous == b.bundle_id  # not a, which the probe read
    assert f"(previous: {b.bundle_id}, which --rollback goes to)" in result.summary()
    assert first_done[0]["previous"] == b.bundle_id  # the switch's reply says it


# --- 6. the summary tells changed boards from unchanged ones ----------------------------------------------------


def test_the_fleet_summary_counts_and_marks_the_boards_the_deploy_changed():
    def outcome(host, state, result=None):
        return fleet.Outcome(fleet.FleetBoard(host=host, label=host), state=state, release="r1", seconds=1.0,
                             result=result or {}, problem=None if state == fleet.OK else "cannot reach it")

    outcomes = [outcome("pi@new", fleet.OK, {"switched": True}),
                outcome("pi@same", fleet.OK, {"switched": False, "runtime_switched_to": "", "repaired": ""}),
                outcome("pi@runtime", fleet.OK, {"switched": False, "runtime_switched_to": "py3.11-abc"}),
                outcome("pi@repaired", fleet.OK, {"switched": False, "repaired": "w: missing"}),
                outcome("pi@off", fleet.FAILED)]

    lines = fleet.summary("deploy", outcomes, 2.0, changed=fleet.deploy_changed)

    assert lines[0] == "deploy of 5 boards: 4 of 5 boards ok, 1 failed (3 changed, 1 unchanged; 2.0 s)"
    assert lines[1].split() == ["BOARD", "RESULT", "RELEASE", "SECONDS", "CHANGED"]
    assert [line.split()[4] for line in lines[2:7]] == ["yes", "no", "yes", "yes", "-"]
    assert lines[6].split()[:4] == ["pi@off", "failed", "r1", "1.0"]
    every = fleet.summary("deploy", outcomes[:1], 1.0, changed=fleet.deploy_changed)[0]
    assert every == "deploy of 1 board: 1 of 1 board ok (1 changed; 1.0 s)"
    # --status and --rollback: no column, the count as it was
    assert fleet.summary("status", outcomes[:1], 1.0)[0] == "status of 1 board: 1 of 1 board ok (1.0 s)"


# --- 7. verify takes an archive, as deploy does -----------------------------------------------------------------


def test_verify_takes_a_packed_archive_and_names_it(tiny_bundle, tmp_path):
    archive = tmp_path / "b3.tar"
    assert edgesdk("pack", tiny_bundle.path, archive).returncode == 0

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    env = {**os.environ, "TMPDIR": str(temporary)}

    done = edgesdk("verify", archive, env=env)

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"ok: {archive} (bundle {tiny_bundle.bundle_id}, target host, ")
    wrong = edgesdk("verify", archive, "--target", "rpi5", env=env)
    assert wrong.returncode == 5
    assert f"bundle {archive} (unpacked) was built for target 'host', not 'rpi5'" in wrong.stderr
    assert not list(temporary.iterdir())  # the unpacked copy is removed


def test_verify_refuses_a_file_that_is_no_bundle_archive_as_a_bundle_error(tmp_path):
    other = tmp_path / "notes.txt"
    other.write_text("not a bundle\n")
    done = edgesdk("verify", other)
    assert done.returncode == 5
    assert f"{other} is a file, but neither a bundle directory nor a bundle archive" in done.stderr
