"""The bundle format (edgesdk.bundle): paths given as strings, a damaged manifest.sha256 named as such, a
directory given to unpack, and a packed archive flushed to the disk before it takes its name. Each test writes
its own small bundle with BundleWriter."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import pytest

from edgesdk.bundle import MANIFEST, MANIFEST_DIGEST, BundleWriter, pack_bundle, unpack_bundle, verify_bundle
from edgesdk.errors import BundleError
from tests.unit.test_bundle45 import synced  # noqa: F401 - the fixture: every fsync and os.replace, in order

# The keys a caller of BundleWriter.commit gives; report.md stands in for the files the runtime opens.
MINIMAL_MANIFEST = {"target": {"name": "host"}, "model": {}, "graph": {"file": "report.md"},
                    "tokenizer": {"file": "report.md"}, "runtime": {"backend": "ort-cpu", "fallbacks": [], "threads": 1},
                    "stages": []}


def write_bundle(path: Path) -> Path:
    writer = BundleWriter(path)
    writer.write_text("report.md", "a small bundle\n")
    writer.write_text("kernels/index.json", "{}\n")  # a file in a subdirectory travels too
    return writer.commit(dict(MINIMAL_MANIFEST)).path


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
def test_pack_and_unpack_take_paths_given_as_strings(tmp_path, suffix):
    bundle = write_bundle(tmp_path / "b")
    archive = pack_bundle(str(bundle), str(tmp_path / f"b{suffix}"))
    assert archive == tmp_path / f"b{suffix}"
    unpacked = unpack_bundle(str(archive), str(tmp_path / "out"))
    assert unpacked.path == tmp_path / "out" / "b"
    assert (unpacked.path / "kernels" / "index.json").read_text() == "{}\n"


def test_pack_into_a_directory_given_as_a_string_names_the_archive_for_the_bundle(tmp_path):
    bundle = write_bundle(tmp_path / "b")
    (tmp_path / "archives").mkdir()
    assert pack_bundle(str(bundle), str(tmp_path / "archives")) == tmp_path / "archives" / "b.tar"


def _refusal(path: Path) -> BundleError:
    with pytest.raises(BundleError) as caught:
        verify_bundle(path)
    return caught.value


@pytest.mark.parametrize("damage", [
    lambda digest: b"",  # an empty file
    lambda digest: digest[:20],  # a copy stopped part way
    lambda digest: digest.upper(),
    lambda digest: digest.replace(b"\n", b"\v\n"),  # a flipped bit turned the newline into another character
], ids=["empty", "cut", "upper-case", "vertical-tab"])
def test_a_manifest_digest_that_is_no_sha256_is_named_as_the_damaged_file(tmp_path, damage):
    bundle = write_bundle(tmp_path / "b")
    digest_path = bundle / MANIFEST_DIGEST
    digest_path.write_bytes(damage(digest_path.read_bytes()))
    text = digest_path.read_text().removesuffix("\n")
    error = _refusal(bundle)
    shown = f"{MANIFEST_DIGEST} says {text!r}" if text else f"{MANIFEST_DIGEST} is empty"
    assert shown in error.problem
    assert f"{MANIFEST_DIGEST} is damaged or was cut short" in error.problem
    assert hashlib.sha256((bundle / MANIFEST).read_bytes()).hexdigest() in error.problem
    assert "re-copy the bundle" in error.fix
    assert "manifest was modified" not in error.fix


def test_a_manifest_that_differs_from_a_sound_digest_is_still_named_as_modified(tmp_path):
    bundle = write_bundle(tmp_path / "b")
    other = hashlib.sha256(b"another manifest").hexdigest()
    (bundle / MANIFEST_DIGEST).write_text(other + "\n")
    error = _refusal(bundle)
    actual = hashlib.sha256((bundle / MANIFEST).read_bytes()).hexdigest()
    assert f"{MANIFEST} has sha256 {actual}, {MANIFEST_DIGEST} says '{other}'" in error.problem
    assert "damaged or was cut short" not in error.problem
    assert "the manifest was modified or corrupted" in error.fix


def test_a_bundle_directory_given_to_unpack_is_named_as_one_that_needs_no_unpacking(tmp_path):
    bundle = write_bundle(tmp_path / "b")
    with pytest.raises(BundleError) as caught:
        unpack_bundle(bundle, tmp_path / "out")
    assert f"{bundle} is a directory, not an archive" in caught.value.problem
    assert "it is a bundle already" in caught.value.fix
    assert f"cp -r {bundle} {tmp_path / 'out'}/" in caught.value.fix
    assert not (tmp_path / "out").exists()


def test_a_directory_that_is_no_bundle_given_to_unpack_asks_for_the_archive(tmp_path):
    (tmp_path / "folder").mkdir()
    with pytest.raises(BundleError) as caught:
        unpack_bundle(tmp_path / "folder", tmp_path / "out")
    assert f"{tmp_path / 'folder'} is a directory, not an archive" in caught.value.problem
    assert caught.value.fix == "pass the archive file that 'edgesdk pack' wrote"


@pytest.mark.parametrize("suffix", [".tar", ".tar.xz"])
def test_pack_flushes_the_archive_to_the_disk_before_it_takes_its_name(tmp_path, synced, suffix):  # noqa: F811 - the imported fixture
    """A card pulled (or a power cut) after pack returned must not leave an empty archive under the name."""
    bundle = write_bundle(tmp_path / "b")
    (tmp_path / "out").mkdir()
    synced.clear()
    archive = pack_bundle(bundle, tmp_path / "out" / f"b{suffix}")
    partial = archive.with_name(archive.name + ".partial")
    published = synced.index(("replace", str(partial), str(archive)))
    assert ("fsync", str(partial)) in synced[:published]
    assert ("fsync", str(archive.parent)) in synced[published:]
    with tarfile.open(archive) as tar:  # what was synced is the whole archive
        assert sorted(tar.getnames()) == ["b/kernels/index.json", "b/manifest.json", "b/manifest.sha256",
                                          "b/report.md"]
