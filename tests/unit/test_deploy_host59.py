"""Deploy, review 59: the host side of a deploy against boards whose Python is too old for edgesdk, and
``--rollback --release`` with an id shortened to its start (a real deploy root, ``--to DIR``).

A board whose Python is 3.8 (JetPack 5's) had the edgesdk wheel built on this machine (``pip wheel``, minutes
where it waits on the package index, and a failure offline that named setuptools, not the board) and sent before
the board's install refused the Python; with ``--no-install`` the fix said to deploy without it, into that same
refusal. ``--release`` took only a whole id, and named none of the releases the board holds when it matched none."""

from __future__ import annotations

import shutil
import sys

import pytest

from edgesdk.deploy import install
from edgesdk.deploy.probe import BoardFacts
from edgesdk.deploy.remote import Board
from edgesdk.deploy.session import board_edgesdk
from edgesdk.deploy.transport import DeployError, LocalTransport
from tests._utils.deploy import bundle_variant, current_id, edgesdk


def _facts(root, version):
    return BoardFacts.from_probe({"root": str(root), "arch": "x86_64", "disk": {"free": 10**10},
                                  "python": {"version": list(version), "bits": 64}})


def test_a_board_python_older_than_edgesdk_needs_is_refused_before_a_wheel_is_built(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))

    with pytest.raises(DeployError) as refused:
        install.runtime_source((3, 8, 18), False)

    assert refused.value.problem == ("the board's Python 3.8.18 is older than 3.10, which edgesdk needs, so the "
                                     "edgesdk runtime cannot be installed with it")
    assert "--remote-python" in refused.value.fix
    assert not list((tmp_path / "cache").rglob("*.whl"))


def test_no_edgesdk_on_a_board_whose_python_is_too_old_names_the_python_in_the_fix(tmp_path):
    """--no-install onto a board with no runtime: "deploy without --no-install" ran the install, which refuses
    Python 3.8; the fix names the Python to install first."""
    board = Board(LocalTransport(str(tmp_path)), sys.executable, str(tmp_path))

    with pytest.raises(DeployError) as old:
        board_edgesdk(board, _facts(tmp_path, (3, 8, 10)), local=False)
    with pytest.raises(DeployError) as new:
        board_edgesdk(board, _facts(tmp_path, (3, 11, 2)), local=False)

    assert "install Python >= 3.10 on the board (its Python 3.8.10 is older than edgesdk needs)" in old.value.fix
    assert "--remote-python /path/to/python3.10" in old.value.fix
    assert new.value.fix == "deploy without --no-install: it installs the runtime into the deploy root"


@pytest.fixture
def two_releases(tiny_bundle, tmp_path):
    """A deploy root holding the tiny bundle (previous), a variant of it (current) and a copy of the tiny bundle's
    release made by hand under a name that starts as its id does."""
    root = tmp_path / "board"
    newer = bundle_variant(tiny_bundle.path, tmp_path / "newer", "newer")
    for bundle in (tiny_bundle, newer):
        done = edgesdk("deploy", bundle.path, "--to", root)
        assert done.returncode == 0, done.stderr
    copy = f"{tiny_bundle.bundle_id[:8]}-copy"
    shutil.copytree(root / "releases" / tiny_bundle.bundle_id, root / "releases" / copy, symlinks=True)
    return root, tiny_bundle.bundle_id, newer.bundle_id, copy


def test_a_release_prefix_of_two_releases_is_refused_naming_both(two_releases):
    root, old, new, copy = two_releases

    refused = edgesdk("deploy", "--rollback", "--release", old[:4], "--to", root)

    assert refused.returncode == 8, refused.stderr
    assert f"--release {old[:4]!r} is the start of 2 releases on" in refused.stderr
    assert old in refused.stderr
    assert copy in refused.stderr
    assert "pass more of the id" in refused.stderr
    assert current_id(root) == new


def test_a_release_that_names_none_lists_the_releases_held(two_releases):
    root, old, new, copy = two_releases

    refused = edgesdk("deploy", "--rollback", "--release", "zz", "--to", root)

    assert refused.returncode == 8, refused.stderr
    assert "--release 'zz' is not a release on" in refused.stderr
    assert all(name in refused.stderr for name in (old, new, copy))
    assert current_id(root) == new


def test_a_release_prefix_of_one_release_rolls_back_to_it(two_releases):
    root, old, new, _copy = two_releases

    back = edgesdk("deploy", "--rollback", "--release", old[:9], "--to", root)

    assert back.returncode == 0, back.stderr
    assert current_id(root) == old
    assert f"from {new} to {old}" in back.stdout
