"""A deploy of another build of a bundle the board holds (the same content id, another manifest) says so, not that
the board's release is damaged, and sends only the manifest."""

from __future__ import annotations

import shutil

from tests._utils.deploy import current_id, edgesdk
from tests.unit.test_deploy_transfer47 import another_build, write_build


def test_a_rebuild_of_a_deployed_bundle_is_named_a_rebuild_not_damage(tiny_bundle, tmp_path):
    root = tmp_path / "board"
    copy = tmp_path / "bundle"
    shutil.copytree(tiny_bundle.path, copy)
    first = edgesdk("deploy", copy, "--to", root)
    assert first.returncode == 0, first.stderr
    write_build(copy, another_build((copy / "manifest.json").read_text()))
    again = edgesdk("deploy", copy, "--to", root)
    said = again.stderr + again.stdout
    assert again.returncode == 0, said
    assert "holds another build of this bundle" in said
    assert "is damaged" not in said
    assert current_id(root) == tiny_bundle.bundle_id
    assert (root / "current" / "manifest.json").read_bytes() == (copy / "manifest.json").read_bytes()
