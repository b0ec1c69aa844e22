"""Deploy, 61: what deploy prints about releases, from a user-journey review.

A redeploy of the release that was current said "(previous: none)" while --status showed a previous release and
--rollback went to it; --status's table of releases had no header, and its date (the time a release last became
current) read as its install time; the disk check's "64.4 MB needed" for a 402 kB bundle did not say that 64 MB of
it is a margin; --status of a directory that does not exist gave the free space "in" it; the fix of a switch cut
short said the same deploy again "restarts no unit", where it now restarts one that is down; and a target refusal
left out the board's detection note.

Deploys run into a real board root (``--to DIR``, the real board helper); the lost switch reply runs against a
real sshd on 127.0.0.1 (the ``ssh_server`` fixture) with tests/_utils/fake_systemd.py for systemctl."""

from __future__ import annotations

import json
import os

import pytest

from edgesdk.deploy.orchestrate import (
    interrupted,
    switch_from_a_removed_release,
    switch_of_the_current_release_interrupted,
)
from edgesdk.deploy.probe import DISK_MARGIN_BYTES, BoardFacts, check_disk, check_target
from edgesdk.deploy.releases import RELEASE_COLUMNS, format_status, status
from edgesdk.deploy.session import DeployOptions
from edgesdk.deploy.transport import DeployError
from tests._utils.deploy import bundle_variant, current_id, edgesdk
from tests.unit.test_deploy48 import ServiceBoard
from tests.unit.test_deploy_checks import GB, raw_probe
from tests.unit.test_deploy_mend60 import _lose_nth

# what the same deploy run again does with the unit, where it finds the switch already done
RERUN = ("where it finds the switch already done, it restarts the unit an earlier deploy --service installed only if "
         "that unit is down, and leaves one that answers on its /health running on what it started with: restart "
         "that one, systemctl restart edgesdk-serve, with --user for a user unit")


def _deploy(bundle, root, *extra):
    done = edgesdk("deploy", bundle, "--to", root, *extra)
    assert done.returncode == 0, done.stderr
    return done


def test_a_redeploy_of_the_current_release_names_the_previous_release_rollback_goes_to(tiny_bundle, tmp_path):
    root = tmp_path / "board"
    older = bundle_variant(tiny_bundle.path, tmp_path / "older", "older")
    _deploy(older.path, root)
    second = _deploy(tiny_bundle.path, root)
    assert (f"current -> releases/{tiny_bundle.bundle_id} (previous: {older.bundle_id}, which --rollback goes "
            "to)") in second.stdout

    again = _deploy(tiny_bundle.path, root)
    as_json = _deploy(tiny_bundle.path, root, "--json")

    assert f"current already is releases/{tiny_bundle.bundle_id}" in again.stderr
    assert (f"current -> releases/{tiny_bundle.bundle_id} (previous: {older.bundle_id}, which --rollback goes "
            "to)") in again.stdout, again.stdout
    assert "previous: none" not in again.stdout
    assert json.loads(as_json.stdout)["previous"] == older.bundle_id
    assert status(DeployOptions(to=root))["previous"] == older.bundle_id
    back = edgesdk("deploy", "--rollback", "--to", root)
    assert back.returncode == 0, back.stderr
    assert current_id(root) == older.bundle_id


def test_a_first_deploy_says_there_is_no_release_to_roll_back_to(tiny_bundle, tmp_path):
    done = _deploy(tiny_bundle.path, tmp_path / "board", "--json")
    assert json.loads(done.stdout)["previous"] is None
    again = _deploy(tiny_bundle.path, tmp_path / "board")
    assert (f"current -> releases/{tiny_bundle.bundle_id} (no previous release to roll back to)"
            in again.stdout), again.stdout


def test_status_s_releases_have_a_header_naming_the_last_use_its_json_names_too(tiny_bundle, tmp_path):
    root = tmp_path / "board"
    older = bundle_variant(tiny_bundle.path, tmp_path / "older", "older")
    _deploy(older.path, root)
    _deploy(tiny_bundle.path, root)
    assert edgesdk("deploy", "--rollback", "--to", root).returncode == 0
    history = [json.loads(line) for line in (root / "history.jsonl").read_text().splitlines()]

    info = status(DeployOptions(to=root))
    text = format_status(info)

    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("releases   2"))
    assert "last used: when it last became current" in lines[header]
    assert "--keep keeps the most recently used" in lines[header]
    assert lines[header + 1].split() == ["id", "target", "size", "last", "used"]
    assert lines[header + 2].startswith(f"  * {older.bundle_id}  host ")  # the rollback's release, used last
    assert lines[header + 3].startswith(f"    {tiny_bundle.bundle_id}  host ")
    # the columns line up under the header's
    assert {len(line) - len("2026-12-06 17:37:30") for line in lines[header + 2:header + 4]} \
        == {lines[header + 1].index("last used")}
    used = {release["id"]: release["last_used"] for release in info["releases"]}
    assert used[older.bundle_id] >= history[-1]["time"]  # the rollback's switch, not the install
    assert all(release["last_used"] == release["mtime"] for release in info["releases"])
    as_json = edgesdk("deploy", "--status", "--to", root, "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert [sorted(r) for r in json.loads(as_json.stdout)["releases"]] == [sorted(r) for r in info["releases"]]
    assert RELEASE_COLUMNS[-1].replace(" ", "_") in info["releases"][0]


def test_the_disk_check_says_what_its_figure_counts(tiny_bundle, tmp_path):
    facts = BoardFacts.from_probe(raw_probe(free=100 * GB))
    line = check_disk(400_000, 0, facts, "pi@x")
    assert line.endswith(f"0.4 MB of bundle files to send + {DISK_MARGIN_BYTES // 1_000_000} MB margin left free = "
                         "64.4 MB needed"), line
    with_all = check_disk(400_000, 40_000_000, facts, "pi@x", 12_300_000)
    assert ("0.4 MB of bundle files to send + about 40 MB for the edgesdk runtime it installs + about 12.3 MB for "
            "the TensorRT engine it builds + 64 MB margin left free = 116.7 MB needed") in with_all
    done = _deploy(tiny_bundle.path, tmp_path / "board")
    assert "MB of bundle files to send + 64 MB margin left free = " in done.stderr, done.stderr


def test_status_of_a_directory_that_does_not_exist_names_the_directory_it_measured(tmp_path):
    missing = tmp_path / "nope" / "board"
    info = status(DeployOptions(to=missing))
    assert info["root_exists"] is False
    assert f"GiB free in {tmp_path} (the nearest existing directory above {missing}, which does not exist)" \
        in info["board"], info["board"]
    assert f"free in {missing}" not in info["board"]
    there = tmp_path / "there"
    there.mkdir()
    assert f"GiB free in {there}, " in status(DeployOptions(to=there))["board"]


def test_a_refused_deploy_for_lack_of_disk_names_the_directory_it_measured():
    raw = raw_probe(free=10_000_000)
    raw["disk"]["path"] = "/home/nvidia"
    with pytest.raises(DeployError) as refused:
        check_disk(400_000, 0, BoardFacts.from_probe(raw), "pi@x")
    assert ("10.0 MB free in /home/nvidia (the nearest existing directory above /home/nvidia/edgesdk, which does not "
            "exist)") in refused.value.problem


def test_the_fixes_of_a_switch_cut_short_say_a_rerun_restarts_a_unit_that_is_down():
    cut = interrupted({"where": "b", "bundle_id": "new", "current": "old", "stage": "switch"})
    assert f"the same deploy again finishes the switch ({RERUN})" in cut.fix
    problem, fix = switch_from_a_removed_release("new", "releases/old", "the same deploy again")
    assert f"the same deploy again finishes the switch ({RERUN})" in fix
    runtime = switch_of_the_current_release_interrupted("b", "same", "k2", "k1")
    assert ("the same deploy again finds the switch done and restarts the unit only if it is down, and leaves one "
            "that answers on its /health running on what it started with") in runtime.fix
    assert all("restarts no unit" not in text for text in (cut.fix, fix, runtime.fix))


def test_a_lost_reply_to_a_runtime_switch_says_what_a_rerun_does_with_the_unit(ssh_server, tiny_bundle, tmp_path):
    """A redeploy of the current release with another edgesdk switches runtime/current alone; its reply lost, the
    fix says to restart the unit and what the same deploy again does with it."""
    board = ServiceBoard(tmp_path, ssh_server, tiny_bundle)
    board.runtime(None)
    first = edgesdk(*board.deploy)
    assert first.returncode == 0, first.stderr
    board.runtime("older")  # as if that deploy had run an older edgesdk
    os.unlink(board.root / "runtime" / "current")
    os.symlink("older", board.root / "runtime" / "current")
    board.runtime(None)

    lost = edgesdk(*board.deploy, "--ssh-command", _lose_nth(tmp_path, "switch", 1, True))

    assert lost.returncode == 8, lost.stderr
    assert "the board's reply to the switch did not come back, so runtime/current may already point to" in lost.stderr
    flat = " ".join(lost.stderr.split())
    assert ("the same deploy again finds the switch done and restarts the unit only if it is down, and leaves one "
            "that answers on its /health running on what it started with") in flat, lost.stderr
    assert "restarts no unit" not in flat


def _jetson(model: str, compatible: tuple[str, ...], mem: int = 16 * GB) -> BoardFacts:
    raw = raw_probe(model + "\x00", "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64\n",
                    mem=mem)
    raw["device_tree_compatible"] = "".join(part + "\x00" for part in compatible)
    return BoardFacts.from_probe(raw)


ORIN_NANO_WITH_NX = ("nvidia,p3768-0000+p3767-0000", "nvidia,p3767-0000", "nvidia,tegra234")


def test_a_target_refusal_gives_the_board_s_detection_note_worded_for_deploy():
    """An Orin Nano developer kit's model string with an Orin NX 16GB module in the compatible: the model string
    decides (orin-nano-8gb), and the note's advice, "pass --target orin-nx-16gb", is not deploy's."""
    facts = _jetson("NVIDIA Jetson Orin Nano Developer Kit", ORIN_NANO_WITH_NX, mem=7_620_000 * 1024)
    assert facts.board.suggested_target == "orin-nano-8gb"
    with pytest.raises(DeployError) as refused:
        check_target("orin-nx-16gb", facts, "nvidia@orin", ignore=False)
    problem = refused.value.problem
    assert "the bundle was built for target 'orin-nx-16gb', but nvidia@orin is 'orin-nano-8gb'" in problem
    assert "name different modules: orin-nano-8gb is suggested, from the model string" in problem
    assert ("if the module is the compatible's, this 'orin-nx-16gb' bundle is built for it: pass --ignore-target to "
            "deploy it") in problem
    assert "pass --target" not in problem
    assert "target= in Python" not in problem
    with pytest.raises(DeployError) as other:
        check_target("rpi5", facts, "nvidia@orin", ignore=False)
    assert ("build the bundle with 'edgesdk build --target orin-nx-16gb' and deploy that with --ignore-target"
            in other.value.problem)
    # the bundle matches the model string's profile: the note still says the module may be the other one
    matched = check_target("orin-nano-8gb", facts, "nvidia@orin", ignore=False)
    assert matched.startswith("target 'orin-nano-8gb' matches the board\n")
    assert "build the bundle with 'edgesdk build --target orin-nx-16gb' and deploy that with --ignore-target" in matched


def test_a_board_of_two_modules_is_refused_with_its_note():
    facts = _jetson("Custom carrier", ("nvidia,p3768-0000+p3767-0000", "nvidia,p3768-0000+p3767-0004"))
    assert facts.board.suggested_target is None
    with pytest.raises(DeployError) as refused:
        check_target("orin-nx-16gb", facts, "nvidia@carrier", ignore=False)
    problem = refused.value.problem
    assert "cannot tell which target profile matches nvidia@carrier" in problem
    assert "the device tree's compatible names more than one module (" in problem
    assert ("so no target is suggested: deploy a bundle built for the module's profile with --ignore-target (this one "
            "was built for 'orin-nx-16gb')") in problem
    assert "pass --target" not in problem


def test_a_board_without_a_note_is_refused_as_before():
    facts = _jetson("NVIDIA Jetson Orin NX Engineering Reference Developer Kit",
                    ("nvidia,p3768-0000+p3767-0001", "nvidia,p3767-0001", "nvidia,tegra234"), mem=7_620_000 * 1024)
    assert facts.board.detection_note is None
    with pytest.raises(DeployError) as refused:
        check_target("orin-nano-4gb", facts, "nvidia@orin", ignore=False)
    assert refused.value.problem == ("the bundle was built for target 'orin-nano-4gb', but nvidia@orin is "
                                     "'orin-nx-8gb' (NVIDIA Jetson Orin NX Engineering Reference Developer Kit, "
                                     "module Orin NX 8GB (p3767-0001))")
