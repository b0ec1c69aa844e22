"""``edgesdk deploy``: the board helper's answers, prune and transfer planning on a board root holding foreign
entries, and ``--to`` with a Python that cannot be started.

The board side runs for real through a local transport (``python -c BOOT OP JSON``), as over ssh.
"""

from __future__ import annotations

import os
import sys
import textwrap

import pytest

from edgesdk.deploy.remote import Board, BoardRefusal, parse_reply
from edgesdk.deploy.transport import DeployError, LocalTransport
from tests._utils.deploy import bundle_variant, current_id, edgesdk


@pytest.fixture
def board(tmp_path) -> Board:
    root = str(tmp_path / "board")
    return Board(LocalTransport(root), sys.executable, root)


def test_a_remote_python_that_cannot_be_started_is_named_with_to(tmp_path):
    """'deploy --to DIR --remote-python PATH' with no program at PATH ended in Python's FileNotFoundError
    traceback; it is refused as over ssh, naming the Python and the option."""
    root = tmp_path / "dir"
    for python in (tmp_path / "no such python", tmp_path / "not-executable"):
        if python.name == "not-executable":
            python.write_text("")
        proc = edgesdk("deploy", "--status", "--to", root, "--remote-python", python)
        assert proc.returncode == 8, proc.stderr
        assert "Traceback" not in proc.stderr
        assert f"'{python}' cannot be started" in proc.stderr
        assert "--remote-python PATH" in proc.stderr
    assert not root.exists()


LOCALE_WARNING = b"bash: warning: setlocale: LC_ALL: cannot change locale (de_DE.UTF-8): No such file or directory\n"


def test_a_helper_killed_on_a_board_whose_shell_warns_about_its_locale_is_no_answer():
    """A board without the client's locale has its login shell print 'No such file or directory' before every
    command. A helper killed before it answered (exit 137, or 143) was then taken for a Python that never started:
    a BoardRefusal, which tells deploy and --rollback that the operation did nothing."""
    killed = (137, b"", LOCALE_WARNING + b"(exit status 137: the command was killed by SIGKILL)\n")
    with pytest.raises(DeployError) as lost:
        parse_reply(killed, "pi@board", "python3", "switch")
    assert not isinstance(lost.value, BoardRefusal)
    assert "cannot be started" not in lost.value.problem
    assert "the deploy helper (switch) failed on pi@board with exit 137" in lost.value.problem
    for code, said in ((127, b"sh: 1: python3: not found\n"), (126, b"sh: 1: python3: Permission denied\n")):
        with pytest.raises(BoardRefusal, match="'python3' cannot be started"):
            parse_reply((code, b"", LOCALE_WARNING + said), "pi@board", "python3", "switch")


def test_a_rollback_whose_helper_dies_after_the_switch_says_the_switch_may_have_happened(tiny_bundle, tmp_path):
    """The rollback took such a helper's end for the board's refusal and passed on 'python cannot be started',
    though current had moved; it says current may already point to the release it rolled back to."""
    root = tmp_path / "dir"
    second = bundle_variant(tiny_bundle.path, tmp_path / "second", "second")
    for bundle in (tiny_bundle, second):
        assert edgesdk("deploy", bundle.path, "--to", root).returncode == 0
    python = tmp_path / "python"
    python.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        printf '%s\\n' '{LOCALE_WARNING.decode().strip()}' >&2
        if [ "$3" = switch ]; then "{sys.executable}" "$@" >/dev/null; kill -9 $$; fi
        exec "{sys.executable}" "$@"
        """))
    python.chmod(0o755)
    back = edgesdk("deploy", "--rollback", "--to", root, "--remote-python", python)
    assert back.returncode == 8
    assert current_id(root) == tiny_bundle.bundle_id  # the switch happened; its answer did not come back
    assert "cannot be started" not in back.stderr
    assert f"current may already point to releases/{tiny_bundle.bundle_id}" in back.stderr


def test_prune_leaves_a_release_committed_again_after_it_was_pruned(board, tmp_path):
    """A bundle deployed once (so history.jsonl has a switch to it), pruned since, and deployed again: while that
    deploy builds its engine or smoke-tests, another deploy's prune took the release for an old one (switched to
    before) and removed it, and the deploy failed at its switch. A release committed after its last switch is in
    flight, as one never switched to is."""
    from tests.unit.test_deploy_helper import commit_by_hand, deploy_by_hand, make_bundle

    bundles = [make_bundle(tmp_path / f"b{i}", {"w": os.urandom(100)}, str(i)) for i in range(3)]
    for bundle in bundles:
        deploy_by_hand(board, bundle)
    again = bundles[0]
    assert board.call("prune", {"keep": 1})["removed"] == [again.bundle_id]

    commit_by_hand(board, again)  # deployed again; its smoke test is running
    assert board.call("prune", {"keep": 1})["removed"] == []  # another deploy finishes meanwhile
    assert board.call("switch", {"bundle_id": again.bundle_id})["to"] == again.bundle_id

    assert board.call("prune", {"keep": 1})["removed"] == [bundles[1].bundle_id]  # switched: no longer in flight


def test_prune_leaves_an_old_release_another_deploy_of_its_bundle_just_committed(board, tmp_path):
    """The same for a bundle whose old release is still there: the commit finds it sound and keeps it, and it
    is in flight from then on."""
    from tests.unit.test_deploy_helper import commit_by_hand, deploy_by_hand, make_bundle

    bundles = [make_bundle(tmp_path / f"b{i}", {"w": os.urandom(100)}, str(i)) for i in range(3)]
    for bundle in bundles:
        deploy_by_hand(board, bundle)
    assert commit_by_hand(board, bundles[0])["kept"] is True
    assert board.call("prune", {"keep": 1})["removed"] == []
    assert board.call("switch", {"bundle_id": bundles[0].bundle_id})["to"] == bundles[0].bundle_id


def test_a_foreign_directory_in_releases_is_not_linked_from(board, tmp_path):
    """A directory under releases/ that no deploy made ('releases/my copy', a name with a space) holding a file of
    the bundle was planned as the source of a hard link, and the receive refused it as 'bundle id 'my copy' is not
    a plain name' with the fix to rebuild the bundle: every deploy of that bundle failed. Only releases are linked
    from; the file is sent."""
    import shutil

    from edgesdk.deploy.report import Reporter
    from edgesdk.deploy.transfer import bundle_files, make_plan, send
    from tests.unit.test_deploy_helper import make_bundle

    data = os.urandom(1000)
    bundle = make_bundle(tmp_path / "b", {"w": data})
    foreign = tmp_path / "board" / "releases" / "my copy"
    foreign.mkdir(parents=True)
    shutil.copy(bundle.path / "w", foreign / "w")
    files = bundle_files(bundle)
    facts = board.call("probe", {"bundle_id": bundle.bundle_id, "files": files,
                                 "manifest_sha256": files["manifest.json"]["sha256"]})
    assert "my copy" in {r["id"] for r in facts["state"]["releases"]}  # --status still lists it
    plan = make_plan(files, facts["plan"])
    assert plan.links == {}
    send(board, bundle, files, plan, Reporter(1, write=lambda line: None))
    sha = files["manifest.json"]["sha256"]
    assert board.call("commit", {"bundle_id": bundle.bundle_id, "manifest_sha256": sha})["problems"] == []
    assert (tmp_path / "board" / "releases" / bundle.bundle_id / "w").read_bytes() == data


def test_a_file_beside_the_engine_directories_does_not_stop_the_probe(board, tmp_path):
    """A file in engines/<bundle-id>/ (a note, a copied engine.plan) made the probe's listing of cached engines
    fail with 'Not a directory', so every deploy of that bundle stopped at its probe; only directories are engines."""
    from edgesdk.deploy.transfer import bundle_files
    from tests.unit.test_deploy_helper import make_bundle

    bundle = make_bundle(tmp_path / "b", {"w": os.urandom(100)})
    engines = tmp_path / "board" / "engines" / bundle.bundle_id
    (engines / "jp6.0-trt8.6-sm87").mkdir(parents=True)
    (engines / "jp6.0-trt8.6-sm87" / "engine.plan").write_bytes(b"x")
    (engines / "notes.txt").write_text("built by hand\n")
    files = bundle_files(bundle)
    facts = board.call("probe", {"bundle_id": bundle.bundle_id, "files": files,
                                 "manifest_sha256": files["manifest.json"]["sha256"]})
    assert facts["engines"] == ["jp6.0-trt8.6-sm87"]


def test_a_release_directory_with_a_foreign_manifest_is_listed_without_facts(board, tmp_path):
    """A directory under releases/ whose manifest.json is some other tool's (its 'files' a list) failed the
    listing of releases with 'AttributeError', so --status and every deploy stopped at the probe."""
    foreign = tmp_path / "board" / "releases" / "other"
    foreign.mkdir(parents=True)
    (foreign / "manifest.json").write_text('{"target": {"name": "host"}, "files": ["model.bin"]}')
    proc = edgesdk("deploy", "--status", "--to", tmp_path / "board")
    assert proc.returncode == 0, proc.stderr
    assert any(line.split()[:3] == ["other", "?", "?"] for line in proc.stdout.splitlines()), proc.stdout
