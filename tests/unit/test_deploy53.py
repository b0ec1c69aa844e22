"""Deploy leftovers, review 53: a commit removes a directory found in staging at a file's name (a receive cannot
rename the file over it); an inventory's ``identity=`` is a key on this machine, found from any directory; a
rollback to a release copied under another name is told the command that works.

Every board operation runs the real helper through a LocalTransport; nothing is mocked."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from edgesdk.deploy import fleet
from edgesdk.deploy.releases import rollback
from edgesdk.deploy.remote import Board
from edgesdk.deploy.report import Reporter
from edgesdk.deploy.session import DeployOptions
from edgesdk.deploy.transfer import bundle_files
from edgesdk.deploy.transport import DeployError, LocalTransport, SshOptions, SshTransport
from tests.unit.test_deploy_helper import deploy_by_hand, make_bundle, stream_for


@pytest.fixture
def board(tmp_path) -> Board:
    root = str(tmp_path / "board")
    return Board(LocalTransport(root), sys.executable, root)


def test_a_commit_removes_a_directory_at_a_files_name_so_the_next_deploy_sends_it(board, tmp_path):
    """A directory in staging/<id> where the manifest lists a file: the commit found it bad and the host said "the
    bad files were removed from staging and are sent again", but os.unlink of a directory fails and the error was
    swallowed, so it stayed, and every later receive failed renaming the file over it ("Is a directory", fix
    "check the permissions and free space"). The commit removes it now, and the next transfer commits."""
    bundle = make_bundle(tmp_path / "a", {"w": os.urandom(100)}, "a")
    sha = bundle_files(bundle)["manifest.json"]["sha256"]
    board.call("receive", {"bundle_id": bundle.bundle_id, "links": {}}, stdin=stream_for(bundle))
    staging = Path(board.root) / "staging" / bundle.bundle_id
    (staging / "w").unlink()
    (staging / "w").mkdir()
    (staging / "w" / "stray").write_bytes(b"x")

    problems = board.call("commit", {"bundle_id": bundle.bundle_id, "manifest_sha256": sha})["problems"]
    assert "w: a directory, not a file" in problems
    assert not os.path.lexists(staging / "w")
    board.call("receive", {"bundle_id": bundle.bundle_id, "links": {}}, stdin=stream_for(bundle))
    assert board.call("commit", {"bundle_id": bundle.bundle_id, "manifest_sha256": sha})["problems"] == []
    assert (Path(board.root) / "releases" / bundle.bundle_id / "w").read_bytes() == (bundle.path / "w").read_bytes()


def test_an_inventory_identity_is_found_from_any_directory(tmp_path, monkeypatch):
    """``identity=keys/pi`` in an inventory went to ssh -i as written, so ssh looked for it under the directory the
    fleet ran from, and a fleet run from anywhere but the inventory's directory failed to log in. A relative key is
    relative to the inventory file now, and ``~`` is the home directory; the board's own paths (remote_root=,
    remote_python=) stay as written, for the board to resolve."""
    home, lab = tmp_path / "home", tmp_path / "lab"
    (lab / "keys").mkdir(parents=True)
    (lab / "keys" / "pi").write_text("key\n")
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "orin").write_text("key\n")
    (lab / "hosts").write_text("pi@b1 identity=keys/pi remote_root=edgesdk remote_python=bin/python3\n"
                               "nvidia@b2 identity=~/.ssh/orin\n"
                               f"pi@b3 identity={lab / 'keys' / 'pi'}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("HOME", str(home))

    boards = fleet.fleet_boards((), Path("../lab/hosts"), (), "~/edgesdk")
    keys = []
    for one in boards:
        options = fleet.board_options(DeployOptions(), one)
        transport = SshTransport(fleet.HostSpec.parse(one.host), options.ssh)
        try:
            args = transport.user_args()
        finally:
            transport.close()
        keys.append(args[args.index("-i") + 1])
    assert keys == [str(lab / "keys" / "pi"), str(home / ".ssh" / "orin"), str(lab / "keys" / "pi")]
    assert all(os.path.isfile(key) for key in keys)  # what ssh opens
    assert (boards[0].remote_root, boards[0].remote_python) == ("edgesdk", "bin/python3")


def test_the_command_line_identity_stays_relative_to_the_working_directory(tmp_path, monkeypatch):
    """-i on the command line is the user's path as their shell gave it: a board of an inventory without identity=
    keeps it as it is."""
    (tmp_path / "hosts").write_text("pi@b1\n")
    board = fleet.read_inventory(tmp_path / "hosts")[0]
    options = fleet.board_options(DeployOptions(ssh=SshOptions(identity="my_key")), board)
    assert options.ssh.identity == "my_key"


def misnamed_copies(board, tmp_path):
    """Bundles a (previous) and b (current) deployed; releases/backup a copy of a's release."""
    a = make_bundle(tmp_path / "a", {"w": os.urandom(100)}, "a")
    b = make_bundle(tmp_path / "b", {"w": os.urandom(100)}, "b")
    deploy_by_hand(board, a)
    deploy_by_hand(board, b)
    shutil.copytree(Path(board.root) / "releases" / a.bundle_id, Path(board.root) / "releases" / "backup")
    return a, b


def refused_rollback(root: Path, release: str) -> DeployError:
    with pytest.raises(DeployError, match=f"releases/{release} on .* fails verification") as refused:
        rollback(DeployOptions(to=root), release, Reporter(total=4, write=lambda line: None))
    return refused.value


def test_a_rollback_to_a_misnamed_copy_is_told_the_rename_that_makes_it_one(board, tmp_path):
    """``--rollback --release backup`` (a copy of a release, its original removed): the fix said "deploy that bundle
    again (it repairs the release)", but a deploy makes releases/<bundle id> and never touches releases/backup.
    The fix is the rename on the board and the rollback after it, which then verifies."""
    a, b = misnamed_copies(board, tmp_path)
    root = Path(board.root)
    shutil.rmtree(root / "releases" / a.bundle_id)

    fix = refused_rollback(root, "backup").fix
    assert "deploy that bundle again" not in fix
    rename = shlex.join(["mv", str(root / "releases" / "backup"), str(root / "releases" / a.bundle_id)])
    assert f"({rename})" in fix
    assert f"'edgesdk deploy --rollback --release {a.bundle_id}'" in fix
    os.rename(root / "releases" / "backup", root / "releases" / a.bundle_id)  # the fix, as a user runs it
    assert board.call("verify", {"bundle_id": a.bundle_id})["problems"] == []


def test_a_rollback_to_a_copy_of_a_release_the_board_holds_names_that_release(board, tmp_path):
    a, b = misnamed_copies(board, tmp_path)
    root = Path(board.root)
    fix = refused_rollback(root, "backup").fix
    assert fix == f"roll back to the release that holds that bundle: 'edgesdk deploy --rollback --release {a.bundle_id}'"
    shutil.copytree(root / "releases" / b.bundle_id, root / "releases" / "current-copy")
    fix = refused_rollback(root, "current-copy").fix
    assert f"releases/{b.bundle_id}, which holds that bundle, is current already" in fix
    assert "deploy that bundle again" not in fix


def test_a_rollback_to_a_damaged_release_is_still_told_to_deploy_it_again(board, tmp_path):
    a, _b = misnamed_copies(board, tmp_path)
    root = Path(board.root)
    (root / "releases" / a.bundle_id / "w").write_bytes(b"damaged")
    fix = refused_rollback(root, a.bundle_id).fix
    assert fix == "deploy that bundle again (it repairs the release), or roll back to another one"


def test_a_commit_removes_nothing_a_link_in_staging_leads_outside_it_to(board, tmp_path):
    """A name the manifest lists read through a link in its parent path (``sub`` a link to a directory elsewhere)
    is reported bad, but what lies there is not the deploy's: the commit removes the link, never the directory it
    leads to, and the next transfer commits."""
    bundle = make_bundle(tmp_path / "a", {"w": os.urandom(100), "sub/x": os.urandom(50)}, "a")
    sha = bundle_files(bundle)["manifest.json"]["sha256"]
    board.call("receive", {"bundle_id": bundle.bundle_id, "links": {}}, stdin=stream_for(bundle))
    staging = Path(board.root) / "staging" / bundle.bundle_id
    outside = tmp_path / "outside"
    (outside / "x").mkdir(parents=True)
    (outside / "x" / "keep").write_bytes(b"mine")
    shutil.rmtree(staging / "sub")
    (staging / "sub").symlink_to(outside, target_is_directory=True)

    problems = board.call("commit", {"bundle_id": bundle.bundle_id, "manifest_sha256": sha})["problems"]
    assert any(problem.startswith("sub/x:") for problem in problems)
    assert (outside / "x" / "keep").read_bytes() == b"mine"
    assert not os.path.lexists(staging / "sub")
    board.call("receive", {"bundle_id": bundle.bundle_id, "links": {}}, stdin=stream_for(bundle))
    assert board.call("commit", {"bundle_id": bundle.bundle_id, "manifest_sha256": sha})["problems"] == []


def test_an_inventory_identity_of_an_unknown_users_home_is_refused_by_its_line(tmp_path):
    """``identity=~nosuchuser/key``: no home directory to expand it against, which raised RuntimeError out of
    reading the inventory; it is refused with the file, the line and a fix."""
    hosts = tmp_path / "hosts"
    hosts.write_text("pi@b1 identity=~edgesdk-no-such-user-here/.ssh/pi\n")
    with pytest.raises(fleet.DeployError) as caught:
        fleet.read_inventory(hosts)
    assert "line 1" in caught.value.problem
    assert "identity" in caught.value.problem
    assert "full path" in caught.value.fix
