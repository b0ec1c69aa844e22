"""Deploy's counts of files read as English: one file to send is '1 file', not '1 files'.

A transfer cut after the new manifest files arrived leaves them complete in ``staging/<id>/`` (the board's
layout, edgesdk/deploy/board_common.py); the next deploy then sends the one file still missing."""

from __future__ import annotations

import shutil

from tests._utils.deploy import bundle_variant, current_id, edgesdk


def test_one_file_left_to_send_is_counted_as_one_file(tiny_bundle, tmp_path):
    root = tmp_path / "board"
    first = edgesdk("deploy", tiny_bundle.path, "--to", root)
    assert first.returncode == 0, first.stderr
    newer = bundle_variant(tiny_bundle.path, tmp_path / "newer", "newer", padding=4096)
    staging = root / "staging" / newer.bundle_id
    staging.mkdir(parents=True)
    for name in ("manifest.json", "manifest.sha256"):
        shutil.copyfile(newer.path / name, staging / name)

    second = edgesdk("deploy", newer.path, "--to", root)
    assert second.returncode == 0, second.stderr
    assert "4.1 kB to send (1 file)," in second.stderr
    assert "4.1 kB sent in 1 file," in second.stdout
    assert "1 files" not in second.stderr + second.stdout
    assert current_id(root) == newer.bundle_id
