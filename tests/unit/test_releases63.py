"""Deploy's releases on the board, 63: --keep after a deploy of the same bundle again, and --status of a runtime stamp
that names no key. The board helper is the real one (``--to DIR`` runs it here)."""

from __future__ import annotations

import json
import os

from edgesdk.deploy.orchestrate import deploy
from edgesdk.deploy.releases import format_status, status
from edgesdk.deploy.report import Reporter
from edgesdk.deploy.session import DeployOptions
from tests._utils.deploy import bundle_variant, current_id


def quiet(options: DeployOptions, bundle_path):
    return deploy(bundle_path, options, Reporter(total=8, write=lambda line: None))


def test_a_release_deployed_twice_is_pruned_by_keep_once_current_moved_on(tiny_bundle, tmp_path):
    """A deploy of the release that was current commits it again (its mtime: when a deploy committed it) and its switch
    moves nothing, so no history line said it was switched to since: prune took it for a release another deploy had in
    flight and kept it past --keep, without a word, for six hours."""
    root = tmp_path / "board"
    second, third = (bundle_variant(tiny_bundle.path, tmp_path / name, name) for name in ("second", "third"))
    first = tiny_bundle
    quiet(DeployOptions(to=root), first.path)
    again = quiet(DeployOptions(to=root), first.path)
    assert not again.switched  # the same release, current already
    quiet(DeployOptions(to=root), second.path)
    pruned = []
    deploy(third.path, DeployOptions(to=root, keep=1), Reporter(total=8, write=pruned.append))
    assert current_id(root) == third.bundle_id
    held = sorted(os.listdir(root / "releases"))
    assert held == sorted([second.bundle_id, third.bundle_id]), held  # current and previous only
    assert any(f"removed old releases {first.bundle_id} (--keep 1)" in line for line in pruned), pruned


def test_status_of_a_runtime_stamp_that_names_no_key_says_so(tmp_path):
    """runtime/current's edgesdk-runtime.json without "key" (edited by hand) ended --status with a KeyError."""
    root = tmp_path / "board"
    venv = root / "runtime" / "handmade"
    venv.mkdir(parents=True)
    (venv / "edgesdk-runtime.json").write_text(json.dumps({"version": "0.1.0"}))
    os.symlink("handmade", root / "runtime" / "current")
    shown = format_status(status(DeployOptions(to=root)))
    line = next(line for line in shown.splitlines() if line.startswith("runtime "))
    assert "names no key" in line
    assert "next deploy installs" in line


def test_a_release_another_deploy_has_in_flight_is_named_when_keep_leaves_it(tiny_bundle, tmp_path):
    """A release another deploy has committed and not switched to yet stays past --keep (that deploy may still switch
    to it); deploy said nothing of it, so --keep 1 left three releases without a word."""
    from edgesdk.deploy.session import open_board
    from edgesdk.deploy.transfer import bundle_files

    root = tmp_path / "board"
    second, third = (bundle_variant(tiny_bundle.path, tmp_path / name, name) for name in ("second", "third"))
    first = tiny_bundle
    for bundle in (first, second):
        quiet(DeployOptions(to=root), bundle.path)
    board = open_board(DeployOptions(to=root))
    try:  # another deploy of the first bundle, committed (as before its smoke test) and not switched yet
        kept = board.call("commit", {"bundle_id": first.bundle_id,
                                     "manifest_sha256": bundle_files(first)["manifest.json"]["sha256"]})
    finally:
        board.transport.close()
    assert kept.get("kept") is True
    lines = []
    deploy(third.path, DeployOptions(to=root, keep=1), Reporter(total=8, write=lines.append))
    assert (root / "releases" / first.bundle_id).is_dir()  # still left alone
    named = [line for line in lines if f"kept releases/{first.bundle_id} past --keep 1" in line]
    assert named, lines
    assert "another deploy may still switch to it" in named[0]
