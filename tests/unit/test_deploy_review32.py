"""``edgesdk deploy``: compressed bundle archives, the smoke test's command in its refusal, a stalled runtime upload."""

from __future__ import annotations

import pytest

from tests._utils.deploy import current_id, edgesdk


@pytest.mark.parametrize("name", ["b.tar.gz", "b.tar.xz", "B.TGZ"])
def test_deploy_accepts_a_compressed_archive_from_pack(tiny_bundle, tmp_path, name):
    """'edgesdk pack' writes .tar.gz / .tgz, .tar.bz2 and .tar.xz as the name asks; deploy took only a plain .tar
    and refused the others as 'a file, not a bundle directory' with the fix to unpack them first."""
    archive = tmp_path / name
    packed = edgesdk("pack", tiny_bundle.path, archive)
    assert packed.returncode == 0, packed.stderr
    proc = edgesdk("deploy", archive, "--to", tmp_path / "dir")
    assert proc.returncode == 0, proc.stderr
    assert current_id(tmp_path / "dir") == tiny_bundle.bundle_id
