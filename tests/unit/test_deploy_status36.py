"""``edgesdk deploy --status`` on a deploy root holding what no deploy wrote: a readable answer, no traceback."""

from __future__ import annotations

import json
import os
import sys

import pytest

from edgesdk.deploy.remote import Board
from edgesdk.deploy.transport import LocalTransport
from tests._utils.deploy import edgesdk
from tests.unit.test_deploy_helper import deploy_by_hand, make_bundle


@pytest.fixture
def root(tmp_path):
    """A root with two releases deployed by the board helper (current the second, previous the first)."""
    root = tmp_path / "board"
    board = Board(LocalTransport(str(root)), sys.executable, str(root))
    for name in ("a", "b"):
        deploy_by_hand(board, make_bundle(tmp_path / name, {"w": os.urandom(10)}, name))
    return root


def status(root) -> str:
    proc = edgesdk("deploy", "--status", "--to", root)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    as_json = edgesdk("deploy", "--status", "--to", root, "--json")
    assert as_json.returncode == 0, as_json.stderr
    json.loads(as_json.stdout)
    return proc.stdout


def test_releases_without_a_bundle_manifest_are_listed(root):
    (root / "releases" / "empty").mkdir()
    (root / "releases" / "odd").mkdir()
    (root / "releases" / "odd" / "manifest.json").write_text(json.dumps({"target": {"name": {"x": 1}}, "files": {}}))
    (root / "releases" / "not-json").mkdir()
    (root / "releases" / "not-json" / "manifest.json").write_text("{")
    out = status(root)
    assert "releases   5" in out
    rows = [line.split(maxsplit=1) for line in out.splitlines() if line.startswith("    ")]  # id, then the rest
    for name in ("empty", "not-json"):
        assert any(row[0] == name and row[1].startswith("? ") for row in rows), out
    # a manifest's target that is no name: shown, not a TypeError
    assert any(row[0] == "odd" and row[1].startswith("{'x': 1} ") for row in rows), out


def test_a_dangling_current_is_named(root):
    """A current whose release was removed by hand was shown as 'current    gone', as if releases/gone existed."""
    os.unlink(root / "current")
    os.symlink(os.path.join("releases", "gone"), root / "current")
    out = status(root)
    assert "current    gone (current points to releases/gone, which does not exist" in out
    assert "--rollback --release ID" in out


@pytest.mark.parametrize("kind", ["directory", "file"])
def test_a_current_that_is_no_link_is_named(root, kind):
    """A current copied as a plain directory (cp -r, rsync without -l) was shown as 'current    none'; a switch
    then fails on it."""
    os.unlink(root / "current")
    if kind == "directory":
        (root / "current").mkdir()
    else:
        (root / "current").write_text("x")
    out = status(root)
    assert f"current    none (current is a {kind}, not the link to a release that deploy makes" in out
    assert f"move {root / 'current'} away" in out
