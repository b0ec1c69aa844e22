"""'edgesdk pack' reads an archive's name as GNU tar's ``tar -a`` does (its suffix.c table): ``.taz`` is gzip,
``.tbz`` and ``.tz2`` are bzip2, ``.tlz`` is lzma and ``.taZ`` (a capital Z) is compress."""

from __future__ import annotations

import pytest

from edgesdk.bundle import pack_bundle, unpack_bundle
from edgesdk.errors import BundleError
from tests.unit.test_bundle52 import write_bundle

GZIP_MAGIC, BZIP2_MAGIC = b"\x1f\x8b", b"BZh"


@pytest.mark.parametrize(("name", "magic"), [("b.taz", GZIP_MAGIC), ("b.tbz", BZIP2_MAGIC), ("b.tz2", BZIP2_MAGIC)])
def test_pack_compresses_gnu_tar_short_names_as_gnu_tar_does(tmp_path, name, magic):
    bundle = write_bundle(tmp_path / "b")
    archive = pack_bundle(bundle, tmp_path / name)
    assert archive.read_bytes().startswith(magic)
    assert (unpack_bundle(archive, tmp_path / "out").path / "report.md").read_text() == "a small bundle\n"


@pytest.mark.parametrize(("name", "kind"), [("b.tlz", "lzma"), ("b.taZ", "compress (.Z)")])
def test_pack_refuses_gnu_tar_short_names_of_compressors_it_cannot_write(tmp_path, name, kind):
    bundle = write_bundle(tmp_path / "b")
    with pytest.raises(BundleError, match=rf"asks for {kind.replace('(', '[(]').replace(')', '[)]')}"):
        pack_bundle(bundle, tmp_path / name)
    assert not (tmp_path / name).exists()
