"""Security review 47: archives whose headers claim what tarfile would hold in memory whole, and pack's partial file
at a predictable name in a directory another user may write."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest

from edgesdk.bundle import ARCHIVE_HEADER_LIMIT, BundleWriter, pack_bundle, unpack_bundle, verify_bundle
from edgesdk.errors import BundleError


def small_bundle(destination: Path):
    """A verified bundle of two small files, written without the build pipeline (no torch)."""
    writer = BundleWriter(destination)
    writer.write_text("model.onnx", "graph")
    writer.write_text("tokenizer.json", "{}")
    return writer.commit({"target": {"name": "host"}, "model": {}, "graph": {"file": "model.onnx"},
                          "tokenizer": {"file": "tokenizer.json"}, "stages": [],
                          "runtime": {"backend": "ort-cpu", "fallbacks": [], "threads": 1}})


def test_pack_does_not_write_the_archive_through_a_link_at_its_partial_name(tmp_path):
    bundle = small_bundle(tmp_path / "b")
    victim = tmp_path / "victim.txt"
    victim.write_text("this user's file\n")
    shared = tmp_path / "shared"  # a directory another user can write, such as /tmp
    shared.mkdir()
    (shared / "b.tar.partial").symlink_to(victim)
    archive = pack_bundle(bundle.path, shared / "b.tar")
    assert victim.read_text() == "this user's file\n"
    assert not (shared / "b.tar.partial").is_symlink()
    assert archive.is_file()
    assert not archive.is_symlink()
    assert verify_bundle(unpack_bundle(archive, tmp_path / "out").path).bundle_id == bundle.bundle_id


def _gzip(raw: bytes) -> bytes:
    return gzip.compress(raw, 1)


def test_unpack_refuses_an_extended_header_claiming_a_huge_size_before_reading_it(tmp_path):
    # a pax header claiming 1 GiB: tarfile reads its data into memory whole (a few kB of gzip hold it in zeros)
    header = tarfile.TarInfo("././@PaxHeader")
    header.type, header.size = tarfile.XHDTYPE, 1 << 30
    archive = tmp_path / "b.tar.gz"
    archive.write_bytes(_gzip(header.tobuf(format=tarfile.USTAR_FORMAT) + bytes(4096)))
    with pytest.raises(BundleError, match=r"an extended header \(pax, or a GNU long name\) claims 1,073,741,824 "
                                          r"bytes.*at most 1,048,576") as caught:
        unpack_bundle(archive, tmp_path / "out")
    assert "only unpack archives made by 'edgesdk pack'" in caught.value.fix
    assert not (tmp_path / "out").exists()


def test_unpack_refuses_a_pax_sparse_map_before_reading_it(tmp_path):
    # a pax 1.0 sparse member: tarfile reads the map, as many numbers as its data's first line says, into a list
    info = tarfile.TarInfo("b/x.bin")
    info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "b/x.bin",
                        "GNU.sparse.realsize": "1"}
    body = b"1000000000\n" + b"0\n" * 100
    info.size = len(body)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(body))
    archive = tmp_path / "b.tar.gz"
    archive.write_bytes(_gzip(raw.getvalue()))
    with pytest.raises(BundleError, match=r"sparse member 'b/x\.bin' would escape the bundle or is not a plain file"):
        unpack_bundle(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _with_checksum(block: bytearray) -> bytes:
    block[148:156] = b" " * 8
    block[148:155] = b"%06o\0" % sum(block)
    return bytes(block)


def test_unpack_refuses_an_old_gnu_sparse_member_before_reading_its_extension_blocks(tmp_path):
    # GNU tar's old sparse type 'S' with its "extended" flag: tarfile reads extension blocks while each says so
    info = tarfile.TarInfo("b/x.bin")
    info.type = tarfile.GNUTYPE_SPARSE
    block = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    block[482] = 1  # isextended: an extension block follows (here none: the archive ends, and tarfile failed on it)
    archive = tmp_path / "b.tar"
    archive.write_bytes(_with_checksum(block))
    with pytest.raises(BundleError, match=r"sparse member 'b/x\.bin' would escape the bundle or is not a plain file"):
        unpack_bundle(archive, tmp_path / "out")


def test_unpack_refuses_an_archive_of_more_members_than_a_bundle_holds_before_writing_any(tmp_path):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for number in range(ARCHIVE_HEADER_LIMIT + 1):
            tar.addfile(tarfile.TarInfo(f"b/{number}"))
    archive = tmp_path / "b.tar.gz"
    archive.write_bytes(_gzip(raw.getvalue()))
    with pytest.raises(BundleError, match=rf"holds more than {ARCHIVE_HEADER_LIMIT:,} members"):
        unpack_bundle(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ the board's deploy root, writable by another user

def test_a_deploy_root_every_user_may_write_is_refused_before_its_lock_file_is_opened(tmp_path):
    from edgesdk.deploy.board_common import Lock, Refused

    victim = tmp_path / "victim"
    victim.write_text("a file of the deploying user's\n")
    shared = tmp_path / "shared"  # mode 777 without the sticky bit: any user may put or replace entries in it
    shared.mkdir()
    shared.chmod(0o777)
    root = shared / "edgesdk"
    root.mkdir()
    (root / ".deploy.lock").symlink_to(victim)  # the lock is truncated when taken: it went through the link
    with pytest.raises(Refused, match=r"is not private: .*shared is writable by every user \(mode 777, no sticky bit\)"
                       ) as caught:
        Lock(str(root))
    assert "chmod o-w" in caught.value.fix
    assert victim.read_text() == "a file of the deploying user's\n"
    with Lock(str(tmp_path / "private" / "edgesdk")):  # a root of this user's own is taken as before
        pass


def test_a_deploy_root_another_user_owns_is_refused(tmp_path):
    import os

    from edgesdk.deploy.board_common import Lock, Refused

    if os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    root = tmp_path / "edgesdk"
    root.mkdir()
    os.chown(root, 65534, 65534)
    with pytest.raises(Refused, match=r"edgesdk belongs to .*, not to this user \(uid 0\) or root"):
        Lock(str(root))
    assert not (root / ".deploy.lock").exists()
