"""The bundle's checks (edgesdk.bundle): a 'graph.weights' record whose sha256 is of the wrong form, or whose codec is
'none', is named as a malformed manifest by verification (the run named the intact weights file as damaged, or asked
to upgrade edgesdk), and 'edgesdk unpack' replaces what a killed unpack, or anyone, left at its staging path (a link,
a file, a link to nothing) as BundleWriter does, instead of failing with a fix about free space. Each test writes its
own small bundle with BundleWriter."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from edgesdk.bundle import MANIFEST, MANIFEST_DIGEST, BundleWriter, pack_bundle, unpack_bundle, verify_bundle
from edgesdk.errors import BundleError
from edgesdk.weights_file import store_weights

# The keys a caller of BundleWriter.commit gives; report.md stands in for the files the runtime opens.
MINIMAL_MANIFEST = {"target": {"name": "host"}, "model": {}, "graph": {"file": "report.md"},
                    "tokenizer": {"file": "report.md"}, "runtime": {"backend": "ort-cpu", "fallbacks": [], "threads": 1},
                    "stages": []}


def write_bundle(path: Path, weights: bytes | None = None) -> Path:
    """A small bundle; with ``weights``, also a zlib weights file and its 'graph.weights' record."""
    writer = BundleWriter(path)
    writer.write_text("report.md", "a small bundle\n")
    manifest = dict(MINIMAL_MANIFEST)
    if weights is not None:
        plain = path.parent / "model.onnx.data"
        plain.write_bytes(weights)
        _, record = store_weights(plain, writer.staging, "zlib")
        manifest["graph"] = {"file": "report.md", "weights": record}
    return writer.commit(manifest).path


def edit_manifest(path: Path, change) -> None:
    """Change manifest.json and rewrite manifest.sha256 to match, so only the content checks can fire."""
    manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    change(manifest)
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (path / MANIFEST).write_text(text, encoding="utf-8")
    (path / MANIFEST_DIGEST).write_text(hashlib.sha256(text.encode()).hexdigest() + "\n", encoding="utf-8")


def refusal(path: Path) -> BundleError:
    with pytest.raises(BundleError) as caught:
        verify_bundle(path)
    return caught.value


@pytest.mark.parametrize("change", [
    lambda record: record.update(sha256=record["sha256"].upper()),  # PowerShell's Get-FileHash writes capitals
    lambda record: record.update(sha256=record["sha256"][:40]),  # a sha1's length
], ids=["sha256-capitals", "sha256-short"])
def test_a_weights_sha256_of_the_wrong_form_is_named_by_verification(tmp_path, change):
    """Verification passed such a record; the run then inflated the intact weights and refused them as bytes
    that differ from the manifest's, with re-copying as the fix."""
    bundle = write_bundle(tmp_path / "b", weights=os.urandom(3000))
    edit_manifest(bundle, lambda m: change(m["graph"]["weights"]))
    error = refusal(bundle)
    assert f"bundle {bundle}: {MANIFEST} is malformed" in error.problem
    assert "'graph.weights.sha256' must be 64 lowercase hex digits" in error.problem
    assert "rebuild the bundle" in error.fix


def test_a_weights_record_with_codec_none_is_named_by_verification(tmp_path):
    """A plain weights file has no record; the run refused one with codec 'none' as a codec this edgesdk does not
    know, with upgrading edgesdk as the fix."""
    bundle = write_bundle(tmp_path / "b", weights=os.urandom(3000))
    edit_manifest(bundle, lambda m: m["graph"]["weights"].update(codec="none"))
    error = refusal(bundle)
    assert "'graph.weights.codec' is 'none'" in error.problem
    assert "upgrade" not in error.fix


def test_a_well_formed_weights_record_still_verifies(tmp_path):
    bundle = write_bundle(tmp_path / "b", weights=os.urandom(3000))
    assert verify_bundle(bundle).manifest["graph"]["weights"]["codec"] == "zlib"


def _leave_link_to_a_directory(staging: Path, tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "keep.txt").write_text("someone's\n")
    staging.symlink_to(tmp_path / "elsewhere")


@pytest.mark.parametrize("leave", [
    _leave_link_to_a_directory,
    lambda staging, tmp_path: staging.write_text("a file\n"),
    lambda staging, tmp_path: staging.symlink_to(tmp_path / "nothing"),
], ids=["link-to-directory", "file", "dangling-link"])
def test_unpack_replaces_whatever_is_left_at_its_staging_path(tmp_path, leave):
    """unpack removed a left-over staging directory with rmtree, which refuses a link and a file, and checked
    for one with exists(), which a link to nothing fails; each was refused with 'check the free space and
    permissions there'. A link is removed, never followed: the directory it names keeps its files."""
    archive = pack_bundle(write_bundle(tmp_path / "b"), tmp_path / "b.tar")
    into = tmp_path / "into"
    into.mkdir()
    leave(into / ".b.unpacking", tmp_path)
    unpacked = unpack_bundle(archive, into)
    assert unpacked.path == into / "b"
    assert not os.path.lexists(into / ".b.unpacking")
    if (tmp_path / "elsewhere").exists():
        assert (tmp_path / "elsewhere" / "keep.txt").read_text() == "someone's\n"
