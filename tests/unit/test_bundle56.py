"""The bundle format and its board-side checks: settle_commit (a commit a kill cut between its two renames) removes
the damaged release's copy in .trash once the release is in place again, and never takes a journal's "." or ".."
for that copy (.trash itself, or the deploy root)."""

from __future__ import annotations

import json
import os

import pytest

from edgesdk.deploy.board_common import paths, settle_commit


def commit_cut_short(tmp_path, trash: str, staged: bool = True, released: bool = False):
    """A deploy root as op_commit leaves it when a kill comes after the journal is written: the damaged release's
    copy in .trash/b1-1, the verified transfer in staging/b1 (``staged``), releases/b1 already renamed into place
    (``released``: the kill came after both renames)."""
    p, root = paths(str(tmp_path / "root"))
    for name in ("releases", "staging", ".trash"):
        os.makedirs(p[name])
    for folder, text in ((os.path.join(p[".trash"], "b1-1"), "damaged"),
                         (os.path.join(p["staging"], "b1"), "verified") if staged else (None, None),
                         (os.path.join(p["releases"], "b1"), "verified") if released else (None, None)):
        if folder:
            os.makedirs(folder)
            with open(os.path.join(folder, "model.onnx"), "w") as handle:
                handle.write(text)
    os.makedirs(os.path.join(p[".trash"], "someone-else"))
    with open(p[".commit.json"], "w") as handle:
        json.dump({"bundle_id": "b1", "trash": trash}, handle)
    return p, root


def release_text(p) -> str:
    with open(os.path.join(p["releases"], "b1", "model.onnx")) as handle:
        return handle.read()


@pytest.mark.parametrize("released", [False, True], ids=["cut-between-renames", "cut-before-the-journal-went"])
def test_a_settled_commit_removes_the_replaced_release_s_copy(tmp_path, released):
    """The commit removes .trash last; a commit settled by the next helper left the damaged release's whole copy
    there, taking a bundle's room on the board's card, listed nowhere, until some other bundle's commit."""
    p, root = commit_cut_short(tmp_path, "b1-1", staged=not released, released=released)
    settle_commit(p, root)
    assert release_text(p) == "verified"
    assert not os.path.lexists(os.path.join(p[".trash"], "b1-1"))
    assert os.path.isdir(os.path.join(p[".trash"], "someone-else"))  # not this commit's
    assert not os.path.lexists(p[".commit.json"])


def test_the_copy_goes_back_when_staging_is_gone_and_stays_the_release(tmp_path):
    p, root = commit_cut_short(tmp_path, "b1-1", staged=False)
    settle_commit(p, root)
    assert release_text(p) == "damaged"  # the release as it was before that deploy, not removed with .trash's copy
    assert not os.path.lexists(p[".commit.json"])


@pytest.mark.parametrize("trash", [".", ".."])
def test_a_journal_naming_dot_or_dot_dot_is_no_copy(tmp_path, trash):
    """basename(".") is "." and basename("..") is "..": the whole .trash folder was renamed to releases/b1, and
    ".." (the deploy root) failed the rename with EINVAL in every helper, each of which settles first."""
    p, root = commit_cut_short(tmp_path, trash, staged=False)
    settle_commit(p, root)
    assert not os.path.lexists(os.path.join(p["releases"], "b1"))
    assert sorted(os.listdir(p[".trash"])) == ["b1-1", "someone-else"]
    assert os.path.isdir(root)
    assert not os.path.lexists(p[".commit.json"])


# The keys a caller of BundleWriter.commit gives; report.md stands in for the files the runtime opens.
MINIMAL_MANIFEST = {"target": {"name": "host"}, "model": {}, "graph": {"file": "report.md"},
                    "tokenizer": {"file": "report.md"}, "runtime": {"backend": "ort-cpu", "fallbacks": [], "threads": 1},
                    "stages": []}


@pytest.mark.parametrize(("name", "said"), [
    ("notes.partial", "ends in '.partial'"),
    ("sub/a\\b.txt", "holds a backslash"),
], ids=["partial-suffix", "backslash"])
def test_a_name_the_board_refuses_fails_verification_on_the_host(tmp_path, name, said):
    """verify_bundle (and so 'edgesdk verify' and pack) passed such a bundle; deploy then sent it to the board,
    whose check refused the name as one that "would escape the bundle directory", which it does not."""
    import hashlib
    import json

    from edgesdk.bundle import BundleWriter, verify_bundle
    from edgesdk.deploy.board_common import Refused, verify_dir
    from edgesdk.errors import BundleError

    writer = BundleWriter(tmp_path / "b")
    writer.write_text("report.md", "a small bundle\n")
    path = writer.commit(dict(MINIMAL_MANIFEST)).path
    # a file the build never writes, listed by hand (commit refuses such a name before it publishes the bundle)
    (path / name).parent.mkdir(parents=True, exist_ok=True)
    (path / name).write_text("a file the build never writes\n")
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"][name] = {"size": (path / name).stat().st_size,
                               "sha256": hashlib.sha256((path / name).read_bytes()).hexdigest()}
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (path / "manifest.json").write_text(text)
    (path / "manifest.sha256").write_text(hashlib.sha256(text.encode()).hexdigest() + "\n")
    with pytest.raises(BundleError) as caught:
        verify_bundle(path)
    assert f"{name}: its name {said}" in caught.value.problem
    with pytest.raises(Refused) as board:
        verify_dir(str(path))
    assert said in board.value.problem
    assert "escape" not in board.value.problem
