"""Deploy's exit status and --json, review 65: a file that is no bundle exited 8 (a deploy error) where deploy's
documented status for a bundle that is none is 5, on one board and on a fleet; one board's --json printed the fleet
keys (``ok``, ``state``, ``host``...) only when it failed, ``"remote_root": "None"`` where neither --host nor --to was
given, and nothing for an error found before the board (no BUNDLE, a BUNDLE beside --status); a fleet's --json did not
say which boards refused; the board's "no room" reply named the deploy root for the service step, which writes its
unit into systemd's directory, gave a free-space figure read after the failure as if it were the room at the
failure, and worded an unknown operation "while the helper's 'bogus' operation".

Boards here are deploy roots on this machine (``--to DIR``: the board helper through a LocalTransport, as over ssh),
or boards an ssh client that only notes its start never reaches.
"""

from __future__ import annotations

import contextlib
import errno
import json
import stat
from dataclasses import fields
from pathlib import Path

import pytest

from edgesdk.deploy import board_transfer, fleet
from edgesdk.deploy.orchestrate import DeployResult
from edgesdk.deploy.orchestrate import deploy as do_deploy
from edgesdk.deploy.releases import STATUS_KEYS
from edgesdk.deploy.remote import BOARD_PARTS
from edgesdk.deploy.session import unpack_if_archive
from edgesdk.errors import DISK_FULL, BundleError
from tests._utils.deploy import bundle_variant, edgesdk

DEPLOY_KEYS = [item.name for item in fields(DeployResult)]


def recording_ssh(tmp_path: Path) -> tuple[Path, Path]:
    """An ssh client command that notes each start, then fails as a board that is off: whether any board was
    contacted."""
    marker = tmp_path / "ssh-started"
    script = tmp_path / "ssh"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\nexit 255\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, marker


def no_bundle_file(tmp_path: Path) -> Path:
    other = tmp_path / "notes.txt"
    other.write_text("not a bundle\n")
    return other


# --- 1. a file that is no bundle is a bundle error: exit 5 ------------------------------------------------------


def test_a_file_that_is_neither_bundle_nor_archive_is_a_bundle_error(tmp_path):
    other = no_bundle_file(tmp_path)
    with contextlib.ExitStack() as stack, pytest.raises(BundleError) as info:
        unpack_if_archive(other, stack)
    assert info.value.exit_code == 5
    assert f"{other} is a file, but neither a bundle directory nor a bundle archive" in info.value.problem


@pytest.mark.parametrize("how", ["--host", "--hosts"])
def test_deploying_a_file_that_is_no_bundle_exits_5_without_contacting_a_board(tmp_path, how):
    other = no_bundle_file(tmp_path)
    ssh, marker = recording_ssh(tmp_path)
    if how == "--host":
        boards = ["--host", "pi@127.0.0.1:1"]
    else:
        inventory = tmp_path / "boards.txt"
        inventory.write_text("pi@127.0.0.1:1\npi@127.0.0.1:2\n")
        boards = ["--hosts", inventory]

    done = edgesdk("deploy", other, *boards, "--ssh-command", ssh)

    assert done.returncode == 5, done.stderr
    assert f"{other} is a file, but neither a bundle directory nor a bundle archive" in done.stderr
    assert not marker.exists()
    assert "Traceback" not in done.stderr


# --- 2. one board's --json: the fleet keys either way -----------------------------------------------------------


def test_a_single_board_deploy_json_that_succeeds_carries_the_fleet_keys(tiny_bundle, tmp_path):
    root = tmp_path / "root"

    done = edgesdk("deploy", tiny_bundle.path, "--to", root, "--json")

    assert done.returncode == 0, done.stderr
    entry = json.loads(done.stdout)
    assert (entry["ok"], entry["state"], entry["error"], entry["fix"], entry["refused"]) == (True, "ok", None, None,
                                                                                             False)
    assert (entry["host"], entry["remote_root"], entry["release"]) == (None, str(root), tiny_bundle.bundle_id)
    assert set(DEPLOY_KEYS) <= set(entry)  # the result's own keys are still there, with their values
    assert entry["bundle_id"] == tiny_bundle.bundle_id
    assert entry["where"]
    assert entry["root"]
    assert entry["generated"] is not None
    failed = fleet.Outcome(fleet.FleetBoard(host=None, root=str(root)), state=fleet.FAILED)
    assert list(entry) == list(failed.as_json(DEPLOY_KEYS))  # one shape for success and failure

    status = edgesdk("deploy", "--status", "--to", root, "--json")
    assert status.returncode == 0, status.stderr
    info = json.loads(status.stdout)
    assert (info["ok"], info["state"], info["release"], info["current"]) == (True, "ok", tiny_bundle.bundle_id,
                                                                             tiny_bundle.bundle_id)
    assert list(info) == list(fleet.Outcome(fleet.FleetBoard(host=None), state=fleet.FAILED).as_json(STATUS_KEYS))


def test_a_deploy_json_without_host_or_to_gives_a_null_remote_root(tiny_bundle):
    done = edgesdk("deploy", tiny_bundle.path, "--json")

    assert done.returncode == 8, done.stderr
    entry = json.loads(done.stdout)
    assert entry["remote_root"] is None  # was the string "None"
    assert entry["host"] is None
    assert entry["error"].startswith("deploy needs exactly one of --host user@board and --to DIR")


@pytest.mark.parametrize(("arguments", "keys", "error"), [
    (["--json"], DEPLOY_KEYS, "no BUNDLE given"),
    (["BUNDLE", "--status", "--json"], list(STATUS_KEYS), "--status, --rollback and --remove take no BUNDLE"),
])
def test_an_error_found_before_the_board_still_prints_the_boards_object(tmp_path, arguments, keys, error):
    root = tmp_path / "root"
    args = [str(tmp_path) if word == "BUNDLE" else word for word in arguments]

    done = edgesdk("deploy", *args, "--to", root)

    assert done.returncode == 8, done.stderr
    entry = json.loads(done.stdout)
    assert set(keys) <= set(entry)
    assert (entry["ok"], entry["state"], entry["remote_root"]) == (False, fleet.FAILED, str(root))
    assert entry["error"].startswith(error)
    assert entry["refused"] is True  # the same command fails again
    assert error in done.stderr
    assert not root.exists()


def test_a_single_board_json_of_a_file_that_is_no_bundle_exits_5_and_says_it_refused(tmp_path):
    other = no_bundle_file(tmp_path)

    done = edgesdk("deploy", other, "--to", tmp_path / "root", "--json")

    assert done.returncode == 5, done.stderr
    entry = json.loads(done.stdout)
    assert (entry["ok"], entry["refused"], entry["bundle_id"]) == (False, True, None)
    assert "neither a bundle directory nor a bundle archive" in entry["error"]


# --- 4. a fleet's --json says which boards refused --------------------------------------------------------------


def test_a_fleet_json_entry_says_whether_the_board_refused(tiny_bundle, tmp_path):
    other_target = bundle_variant(tiny_bundle.path, tmp_path / "rpi5", "rpi5", target="rpi5")
    boards = [fleet.FleetBoard(host="refuses", label="refuses"), fleet.FleetBoard(host="later", label="later")]

    def work(board, report, progress):
        from edgesdk.deploy.session import DeployOptions

        python = None if board.host == "refuses" else str(tmp_path / "no-python-yet")
        result = do_deploy(other_target.path, DeployOptions(to=tmp_path / f"root-{board.host}", remote_python=python),
                           report, progress)
        return result.__dict__, result.bundle_id

    outcomes, _ = fleet.run_fleet(boards, work, lambda board: None, fleet.Console(write=lambda line: None))
    entries = fleet.json_entries(outcomes, DEPLOY_KEYS)

    assert [(e["host"], e["ok"], e["refused"]) for e in entries] == [("refuses", False, True), ("later", False, False)]
    done = fleet.Outcome(fleet.FleetBoard(host="ok"), state=fleet.OK, result={"bundle_id": "r1"}, release="r1")
    assert done.as_json(DEPLOY_KEYS)["refused"] is False


def test_a_fleet_json_of_a_bundle_that_is_none_lists_every_board_refused_and_not_started(tmp_path):
    other = no_bundle_file(tmp_path)
    ssh, marker = recording_ssh(tmp_path)
    hosts = ["pi@127.0.0.1:1", "pi@127.0.0.1:2"]

    done = edgesdk("deploy", other, "--host", hosts[0], "--host", hosts[1], "--json", "--ssh-command", ssh)

    assert done.returncode == 5, done.stderr
    listed = json.loads(done.stdout)
    assert [(e["host"], e["ok"], e["state"], e["refused"]) for e in listed] == [
        (host, False, fleet.NOT_STARTED, True) for host in hosts]
    assert all("neither a bundle directory nor a bundle archive" in e["error"] for e in listed)
    assert set(DEPLOY_KEYS) <= set(listed[0])
    assert not marker.exists()


# --- 3. the board's "no room" reply -----------------------------------------------------------------------------


def bundled_helper() -> dict:
    """The board helper as the board runs it: its parts concatenated and run with BOARD_BUNDLED set (edgesdk
    itself is not imported there), as a namespace."""
    folder = Path(board_transfer.__file__).parent
    source = "\n".join((folder / part).read_text() for part in BOARD_PARTS)
    namespace = {"BOARD_BUNDLED": 1, "__name__": "edgesdk_deploy_helper"}
    exec(compile(source, "edgesdk-deploy-helper", "exec"), namespace)  # noqa: S102 - the helper's own code
    return namespace


def test_no_room_in_the_service_step_names_the_unit_directory_and_reads_its_room_now(tmp_path, monkeypatch):
    units = tmp_path / "units"
    units.mkdir()
    monkeypatch.setenv("EDGESDK_UNIT_DIR", str(units))
    root = tmp_path / "root"
    helper = bundled_helper()

    reply = helper["no_room"]("service", {"root": str(root)}, OSError(errno.ENOSPC, "No space left on device"))

    assert reply["error"].startswith(f"the board ran out of room under the unit directory {units} or the deploy "
                                     f"root {root} while writing the service unit: No space left on device ("), reply
    assert f"{units}: " in reply["error"]
    assert "MB free there now" in reply["error"]
    assert f"free space under the unit directory {units} or the deploy root {root}" in reply["fix"]


def test_no_room_says_its_free_space_was_read_after_the_failure(tmp_path):
    reply = bundled_helper()["no_room"]("switch", {"root": str(tmp_path)}, OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert reply["error"].startswith(f"the board ran out of room under the deploy root {tmp_path} while switching "
                                     "current: Disk quota exceeded, ")
    assert reply["error"].endswith(" MB free there now")


def test_no_room_words_an_operation_it_has_no_words_for():
    reply = bundled_helper()["no_room"]("bogus", {}, OSError(errno.ENOSPC, "No space left on device"))
    assert "while running the helper's 'bogus' operation: No space left on device" in reply["error"]


def test_the_helper_keeps_one_list_of_no_room_errors():
    helper = bundled_helper()
    assert helper["WRITE_NO_ROOM"] == (*board_transfer.DISK_FULL, errno.EFBIG)
    assert set(helper["WRITE_NO_ROOM"]) == set(DISK_FULL)  # edgesdk.errors' list, which the helper cannot import
