"""The board side of deploy: review 46.

The board helper runs for real through a local transport; ``tests/_utils/fake_systemd.py`` stands in for
systemctl only. Where ``systemd-analyze`` is installed, the unit is also checked by systemd's own parser.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from edgesdk.deploy.board_common import Refused
from edgesdk.deploy.board_service import render_unit
from edgesdk.deploy.remote import BoardRefusal
from tests.unit.test_deploy_review35 import board, free_port, good_argv, install  # noqa: F401


def exec_start(unit: str) -> str:
    return next(line for line in unit.splitlines() if line.startswith("ExecStart="))[len("ExecStart="):]


def test_a_dollar_in_the_program_path_is_not_doubled():
    """systemd substitutes ``$`` variables in ExecStart's arguments only, not in its program: a ``$$`` there
    stays two dollars, so the unit named a file that does not exist (measured with systemd-analyze verify:
    "Command /srv/a$$b/bin/edgesdk is not executable"). Arguments still get ``$$`` (systemd.service(5))."""
    line = exec_start(render_unit(["/srv/a$b 100%/bin/edgesdk", "serve", "/srv/a$b 100%/current"], "system"))
    assert line == '"/srv/a$b 100%%/bin/edgesdk" "serve" "/srv/a$$b 100%%/current"'


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_itself_finds_the_program_behind_a_dollar(tmp_path):
    program = tmp_path / "a$b%c d" / "bin" / "edgesdk"
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    unit = tmp_path / "edgesdk-serve.service"
    unit.write_text(render_unit([str(program), "serve", str(tmp_path / "a$b%c d" / "current")], "system"))
    proc = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("char", ["'", '"', "\\", "\t"])
def test_a_program_path_systemd_refuses_is_refused_before_the_unit_is_written(char):
    """systemd refuses a program path holding a quote, an apostrophe, a backslash or a control character as a
    fatal unit error ("Executable name contains special characters", string_is_safe in config_parse_exec): the
    unit was written and enabled all the same, and failed only at its start."""
    with pytest.raises(Refused, match="Executable name contains special characters") as caught:
        render_unit([f"/home/o{char}brien/edgesdk/runtime/current/bin/edgesdk", "serve", "/x/current"], "user")
    assert "--remote-root" in caught.value.fix
    # in an argument the same characters are fine: quoted, as systemd reads them back
    assert exec_start(render_unit(["/opt/edgesdk", "serve", f"/home/o{char}brien/current"], "user")).startswith(
        '"/opt/edgesdk" "serve" "/home/o')


def test_a_relative_program_is_refused():
    with pytest.raises(Refused, match="not an absolute path"):
        render_unit(["bin/edgesdk", "serve", "/x/current"], "user")


def test_install_refuses_such_a_program_and_changes_nothing(board, tmp_path):  # noqa: F811
    """Through the helper: refused before the unit, its record or service.before.json are written, so the
    deploy's undo has nothing to put back and no unit is left that systemd would not load."""
    board, units, _state = board
    port = free_port()
    program = tmp_path / "o'brien" / "python"
    program.parent.mkdir()
    os.symlink(sys.executable, program)
    argv = [str(program), *good_argv(tmp_path, port)[1:]]
    with pytest.raises(BoardRefusal, match="Executable name contains special characters"):
        install(board, argv, port, "t1")
    assert not (units / "edgesdk-serve.service").exists()
    assert not any(name.startswith("service") for name in os.listdir(board.root))


def test_a_link_source_pruned_since_the_probe_is_refused_with_the_fix_that_works(tmp_path):
    """The probe plans to hard-link a file from another release; it runs without the lock, so another deploy's
    prune may remove that release before this receive. The receive failed with 'No such file or directory' and
    the fix 'check the permissions and free space', neither of which says what happened or that a new deploy
    (a new plan) is the fix."""
    from edgesdk.deploy.remote import Board
    from edgesdk.deploy.transfer import bundle_files, make_plan
    from edgesdk.deploy.transport import LocalTransport
    from tests.unit.test_deploy_helper import deploy_by_hand, make_bundle, stream_for

    root = str(tmp_path / "board")
    helper = Board(LocalTransport(root), sys.executable, root)
    one = make_bundle(tmp_path / "b1", {"shared.bin": b"s" * 5000, "a.txt": b"one"})
    deploy_by_hand(helper, one)
    two = make_bundle(tmp_path / "b2", {"shared.bin": b"s" * 5000, "a.txt": b"two"})
    files = bundle_files(two)
    plan = make_plan(files, helper.call("probe", {"bundle_id": two.bundle_id, "files": files})["plan"])
    assert plan.links == {"shared.bin": one.bundle_id}
    shutil.rmtree(os.path.join(root, "releases", one.bundle_id))  # another deploy's prune, after this probe
    with pytest.raises(BoardRefusal, match="no longer holds it") as caught:
        helper.call("receive", {"bundle_id": two.bundle_id, "links": plan.links},
                   stdin=stream_for(two, [name for name, _ in plan.send]))
    assert caught.value.fix.startswith("run the deploy again")
    # and it does: the new plan sends the file
    plan = make_plan(files, helper.call("probe", {"bundle_id": two.bundle_id, "files": files})["plan"])
    assert not plan.links
    assert "shared.bin" in dict(plan.send)
    deploy_by_hand(helper, two, plan.links, [name for name, _ in plan.send])


def test_a_history_grown_past_what_is_read_still_gives_the_last_switch(tmp_path):
    """history.jsonl gets a line per switch and is never trimmed; its readers took only its first 4 MiB, so on a
    board deployed to some 35,000 times (a CI board, every few minutes for a year) the 'last switch' that
    --status shows, and the order prune keeps releases in, came from the oldest switches."""
    from edgesdk.deploy.board_common import HISTORY_READ
    from edgesdk.deploy.remote import Board
    from edgesdk.deploy.transport import LocalTransport
    from tests.unit.test_deploy_helper import deploy_several

    root = tmp_path / "board"
    helper = Board(LocalTransport(str(root)), sys.executable, str(root))
    root.mkdir()
    line = json.dumps({"time": 1.0, "action": "deploy", "from": "gone-a", "to": "gone-b"}) + "\n"
    (root / "history.jsonl").write_text(line * (HISTORY_READ // len(line) + 10))
    ids = deploy_several(helper, tmp_path, 4)
    state = helper.call("probe", {})["state"]
    assert state["last_switch"]["to"] == ids[3]
    assert state["last_switch"]["from"] == ids[2]
    assert [r["id"] for r in state["releases"]] == ids  # oldest first: by the switches, as written
    # the releases' mtimes all alike (a clock set back since): only the history's order tells the older ones
    for release in ids:
        os.utime(root / "releases" / release, (1e9, 1e9))
    helper.call("switch", {"bundle_id": ids[0], "action": "rollback"})  # current ids[0], previous ids[3]
    assert helper.call("prune", {"keep": 3})["removed"] == [ids[1]]


def test_a_switch_onto_a_current_that_is_a_directory_is_refused_plainly_and_leaves_nothing(tmp_path):
    """``current`` a directory (copied there by hand): rename(2) of the new link onto it fails with EISDIR. The
    switch was refused as '<root>/.current.tmp-PID: Is a directory' with the fix 'check the permissions and free
    space', and each try left its temporary link in the deploy root."""
    from edgesdk.deploy.remote import Board
    from edgesdk.deploy.transport import LocalTransport
    from tests.unit.test_deploy_helper import commit_by_hand, make_bundle

    root = tmp_path / "board"
    helper = Board(LocalTransport(str(root)), sys.executable, str(root))
    one = make_bundle(tmp_path / "b1", {"a.txt": b"one"})
    commit_by_hand(helper, one)
    (root / "current").mkdir()
    (root / "current" / "mine.txt").write_text("kept")
    for _ in range(2):
        with pytest.raises(BoardRefusal, match="is a directory, not the link to a release") as caught:
            helper.call("switch", {"bundle_id": one.bundle_id})
        assert caught.value.fix.startswith("move that directory away")
    assert sorted(os.listdir(root)) == [".deploy.lock", "current", "releases", "staging"]
    assert (root / "current" / "mine.txt").read_text() == "kept"
    assert not (root / "history.jsonl").exists()


def test_a_link_that_cannot_replace_its_target_leaves_no_temporary_link(tmp_path):
    from edgesdk.deploy.board_ops import replace_link

    (tmp_path / "previous").mkdir()
    (tmp_path / "previous" / "x").write_text("x")
    with pytest.raises(IsADirectoryError):  # rename(2): EISDIR
        replace_link(str(tmp_path / "previous"), "releases/abc")
    assert sorted(os.listdir(tmp_path)) == ["previous"]
