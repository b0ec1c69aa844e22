"""'edgesdk pack' / 'unpack' with archive names and formats tarfile cannot write or read (zstd, lz4 …),
and hostile members: real tar files, a real bundle."""

from __future__ import annotations

import gzip
import io
import shlex
import shutil
import struct
import subprocess
import tarfile
from pathlib import Path

import pytest

from edgesdk.bundle import pack_bundle, unpack_bundle
from edgesdk.errors import BundleError


def copy_bundle(bundle, where: Path) -> Path:
    destination = where / bundle.path.name
    shutil.copytree(bundle.path, destination)
    return destination


def zstd_frame(data: bytes) -> bytes:
    """A valid zstd frame of raw (stored) blocks, RFC 8878 §3.1.1: magic, a frame header with a 4-byte
    content size, then blocks of at most 128 KiB, each with a 3-byte header (last flag, type 0 = raw, size)."""
    out = bytearray(b"\x28\xb5\x2f\xfd")
    out += bytes([0xA0]) + struct.pack("<I", len(data))  # single segment, 4-byte Frame_Content_Size
    chunks = [data[i:i + (128 << 10)] for i in range(0, len(data), 128 << 10)] or [b""]
    for index, chunk in enumerate(chunks):
        last = index == len(chunks) - 1
        out += (int(last) | (0 << 1) | (len(chunk) << 3)).to_bytes(3, "little") + chunk
    return bytes(out)


@pytest.mark.parametrize("name", ["b.tar.zst", "b.tzst", "b.zst", "b.tar.lz4", "b.tar.lz", "b.tar.Z", "b.zip"])
def test_pack_refuses_a_name_asking_for_a_compressor_it_cannot_write(tiny_bundle, tmp_path, name):
    """It wrote a plain tar under the name: 'tar --zstd -xf b.tar.zst' and every tool trusting the name failed."""
    with pytest.raises(BundleError, match=r"asks for .*which edgesdk does not write.*\.tar\.gz / \.tgz") as info:
        pack_bundle(tiny_bundle.path, tmp_path / name)
    assert "b.tar.xz" in info.value.fix
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # neither the archive nor its .partial


@pytest.mark.parametrize(("name", "opener"), [("b.gz", gzip.open), ("b.tar.gz", gzip.open)])
def test_pack_compresses_a_bare_gz_name_as_tar_a_does(tiny_bundle, tmp_path, name, opener):
    """'b.gz' was written as a plain tar, which 'gzip -d' and 'tar xzf' refuse."""
    archive = pack_bundle(tiny_bundle.path, tmp_path / name)
    assert archive.read_bytes()[:2] == b"\x1f\x8b"
    with opener(archive) as stream:
        assert tarfile.open(fileobj=io.BytesIO(stream.read())).getmember(f"{tiny_bundle.path.name}/manifest.json")
    assert unpack_bundle(archive, tmp_path / "dest").bundle_id == tiny_bundle.bundle_id


def test_unpack_of_a_zstd_archive_names_zstd_and_the_way_out(tiny_bundle, tmp_path):
    plain = pack_bundle(tiny_bundle.path, tmp_path / "b.tar")
    archive = tmp_path / "b.tar.zst"
    archive.write_bytes(zstd_frame(plain.read_bytes()))
    if shutil.which("zstd"):  # the frame is real zstd: the zstd tool restores the tar from it
        restored = subprocess.run(["zstd", "-dc", str(archive)], capture_output=True, check=True).stdout
        assert restored == plain.read_bytes()
    with pytest.raises(BundleError, match=r"b\.tar\.zst is zstd-compressed, which edgesdk cannot read") as info:
        unpack_bundle(archive, tmp_path / "dest")
    assert f"zstd -dc {shlex.quote(str(archive))} > {shlex.quote(str(tmp_path / 'b.tar'))}" in info.value.fix
    assert not (tmp_path / "dest").exists()


def test_the_way_out_of_a_zstd_archive_without_its_suffix_is_a_command_that_works(tiny_bundle, tmp_path):
    """``zstd -d mystery`` refuses a name without a suffix it knows ("unknown suffix"): the command given writes to
    stdout, into a .tar that 'edgesdk unpack' then reads."""
    plain = pack_bundle(tiny_bundle.path, tmp_path / "b.tar")
    archive = tmp_path / "mystery"
    archive.write_bytes(zstd_frame(plain.read_bytes()))
    with pytest.raises(BundleError) as info:
        unpack_bundle(archive, tmp_path / "dest")
    command = f"zstd -dc {shlex.quote(str(archive))} > {shlex.quote(str(tmp_path / 'mystery.tar'))}"
    assert command in info.value.fix
    if shutil.which("zstd"):
        subprocess.run(command, shell=True, check=True, capture_output=True)
        assert (tmp_path / "mystery.tar").read_bytes() == plain.read_bytes()


@pytest.mark.skipif(shutil.which("lz4") is None, reason="needs the lz4 tool to write an lz4 frame")
def test_unpack_of_an_lz4_archive_names_lz4(tiny_bundle, tmp_path):
    plain = pack_bundle(tiny_bundle.path, tmp_path / "b.tar")
    archive = tmp_path / "b.tar.lz4"
    subprocess.run(["lz4", "-q", str(plain), str(archive)], check=True)
    with pytest.raises(BundleError, match=r"b\.tar\.lz4 is lz4-compressed") as info:
        unpack_bundle(archive, tmp_path / "dest")
    assert f"lz4 -dc {shlex.quote(str(archive))} > {shlex.quote(str(tmp_path / 'b.tar'))}" in info.value.fix


def test_unpack_of_a_file_of_no_known_format_keeps_its_message(tmp_path):
    archive = tmp_path / "b.tar"
    archive.write_bytes(b"\x28\xb5 not quite zstd" * 64)
    with pytest.raises(BundleError, match=r"b\.tar is not a readable tar archive"):
        unpack_bundle(archive, tmp_path / "dest")


def _gz_bundle_with(archive: Path, bundle: Path, replace: dict[str, bytes]) -> None:
    """The bundle directory in a .tgz, with the members named in ``replace`` (or added) holding other bytes."""
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        tar.add(bundle, arcname=bundle.name, recursive=False)
        names = sorted({p.name for p in bundle.iterdir()} | set(replace))
        for name in names:
            if name in replace:
                info = tarfile.TarInfo(f"{bundle.name}/{name}")
                info.size = len(replace[name])
                tar.addfile(info, io.BytesIO(replace[name]))
            else:
                tar.add(bundle / name, arcname=f"{bundle.name}/{name}", recursive=False)


@pytest.mark.parametrize(("replace", "match"), [
    ({"tokenizer.json": bytes(4 << 20)}, r"member '[^']*/tokenizer\.json' is 4194304 bytes, but the bundle's "
                                         r"manifest\.json lists \d+"),
    ({"filler.bin": bytes(4 << 20)}, r"member '[^']*/filler\.bin' is not listed in the bundle's manifest\.json"),
    ({"manifest.sha256": bytes(4 << 10)}, r"member '[^']*/manifest\.sha256' is 4096 bytes, far more than"),
], ids=["larger-than-listed", "unlisted", "digest"])
def test_unpack_refuses_members_its_manifest_does_not_claim_before_writing(tiny_bundle, tmp_path, replace, match):
    """A few kB of gzip that unpack to megabytes (or gigabytes) of zeros were written out in full, and only
    verification afterwards found the file too large or unlisted."""
    bundle = copy_bundle(tiny_bundle, tmp_path / "work")
    archive = tmp_path / "inflated.tgz"
    _gz_bundle_with(archive, bundle, replace)
    assert archive.stat().st_size < (1 << 20)
    destination = tmp_path / "dest"
    with pytest.raises(BundleError, match=match) as info:
        unpack_bundle(archive, destination)
    assert "edgesdk pack" in info.value.fix
    assert not destination.exists()  # refused before the staging directory was made


@pytest.mark.parametrize(("kind", "linkname"), [(tarfile.CHRTYPE, ""), (tarfile.BLKTYPE, ""),
                                                (tarfile.SYMTYPE, "../../../etc/passwd")], ids=["chr", "blk", "sym"])
def test_unpack_refuses_devices_and_relative_links_out(tiny_bundle, tmp_path, kind, linkname):
    bundle = copy_bundle(tiny_bundle, tmp_path / "work")
    archive = tmp_path / "hostile.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(bundle, arcname=bundle.name)
        info = tarfile.TarInfo(f"{bundle.name}/model.onnx.data")
        info.type, info.linkname, info.devmajor, info.devminor = kind, linkname, 1, 3
        tar.addfile(info)
    with pytest.raises(BundleError, match=r"'[^']*/model\.onnx\.data' would escape the bundle or is not a plain file"):
        unpack_bundle(archive, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()
