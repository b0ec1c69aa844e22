"""The bundle format (edgesdk.bundle): verification, atomic writing, pack/unpack and hostile archives.

Every test works on a copy of the session bundle (a real bundle built from the tiny Llama for the
``host`` target); the session bundle itself is never modified.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from edgesdk.bundle import (
    MANIFEST,
    MANIFEST_DIGEST,
    SCHEMA_VERSION,
    BundleWriter,
    pack_bundle,
    unpack_bundle,
    verify_bundle,
)
from edgesdk.errors import BundleError

BUNDLE_FILES = [
    "model.onnx",
    "model.onnx.data",
    "tokenizer.json",
    "chat_template.jinja",
    "report.md",
    MANIFEST,
    MANIFEST_DIGEST,
]
# The keys a caller of BundleWriter.commit must give (the writer adds schema, version, id and files).
# Every test writer below writes report.md; it stands in for the files the runtime opens.
MINIMAL_MANIFEST = {"target": {"name": "host"}, "model": {}, "graph": {"file": "report.md"},
                    "tokenizer": {"file": "report.md"}, "runtime": {"backend": "ort-cpu", "fallbacks": [], "threads": 1},
                    "stages": []}


# --- helpers -------------------------------------------------------------------------------------

def copy_bundle(bundle, tmp_path: Path) -> Path:
    destination = tmp_path / bundle.path.name
    shutil.copytree(bundle.path, destination)
    return destination


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def refused(path: Path, match: str, **kwargs) -> BundleError:
    with pytest.raises(BundleError, match=match) as info:
        verify_bundle(path, **kwargs)
    assert info.value.fix
    return info.value


def rewrite_manifest(path: Path, change) -> None:
    """Edit manifest.json and rewrite manifest.sha256 to match, so only the content checks can fire."""
    manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    change(manifest)
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (path / MANIFEST).write_text(text, encoding="utf-8")
    (path / MANIFEST_DIGEST).write_text(hashlib.sha256(text.encode()).hexdigest() + "\n", encoding="utf-8")


def snapshot(root: Path, exclude: Path) -> dict[str, bytes | None]:
    """Every path under root (outside exclude) with the content of files: to show nothing was written."""
    state = {}
    for path in root.rglob("*"):
        if path == exclude or exclude in path.parents:
            continue
        state[str(path)] = path.read_bytes() if path.is_file() and not path.is_symlink() else None
    return state


def add_directory(tar: tarfile.TarFile, directory: Path, top: str) -> None:
    """Add a bundle directory under the top-level name ``top``, like pack_bundle but without verifying."""
    tar.add(directory, arcname=top, recursive=False)
    for path in sorted(directory.iterdir()):
        tar.add(path, arcname=f"{top}/{path.name}", recursive=False)


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes = b"evil\n") -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def add_special(tar: tarfile.TarFile, name: str, kind: bytes, linkname: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    tar.addfile(info)


def leftovers(destination_dir: Path) -> list[str]:
    return sorted(os.listdir(destination_dir)) if destination_dir.exists() else []


# --- verification ----------------------------------------------------------------------------------

def test_session_bundle_has_the_expected_files(tiny_bundle):
    # Keeps the byte-flip test below exhaustive: it must cover every file a bundle holds.
    assert sorted(os.listdir(tiny_bundle.path)) == sorted(BUNDLE_FILES)
    assert sorted(tiny_bundle.manifest["files"]) == sorted(set(BUNDLE_FILES) - {MANIFEST, MANIFEST_DIGEST})


def test_copied_bundle_verifies(tiny_bundle, tmp_path):
    path = copy_bundle(tiny_bundle, tmp_path)
    bundle = verify_bundle(path)
    assert bundle.path == path
    assert bundle.bundle_id == tiny_bundle.bundle_id
    assert bundle.manifest["schema_version"] == SCHEMA_VERSION
    assert bundle.file("model.onnx") == path / "model.onnx"


def test_expected_target_matches(tiny_bundle, tmp_path):
    path = copy_bundle(tiny_bundle, tmp_path)
    assert verify_bundle(path, expected_target="host").target == "host"


def test_wrong_target_is_refused_naming_both_targets(tiny_bundle, tmp_path):
    path = copy_bundle(tiny_bundle, tmp_path)
    error = refused(path, r"built for target 'host', not 'rpi5'", expected_target="rpi5")
    assert "--target rpi5" in error.fix


@pytest.mark.parametrize("name", BUNDLE_FILES)
def test_one_flipped_byte_in_any_file_is_refused(tiny_bundle, tmp_path, name):
    path = copy_bundle(tiny_bundle, tmp_path)
    file = path / name
    offset = random.Random(f"flip-{name}").randrange(file.stat().st_size)
    flip_byte(file, offset)
    if name == MANIFEST:
        match = rf"{re.escape(MANIFEST)} has sha256 [0-9a-f]{{64}}, {re.escape(MANIFEST_DIGEST)} says"
    elif name == MANIFEST_DIGEST:  # the digest differs per build: a flipped hex digit may read as another, or as none
        match = rf"{re.escape(MANIFEST_DIGEST)} says"
    else:
        match = rf"failed verification:\n  - {re.escape(name)}: sha256 differs from the manifest"
    refused(path, match)


def test_every_byte_of_the_manifest_digest_is_checked(tiny_bundle, tmp_path):
    # manifest.sha256 is tiny, so try every offset, the trailing newline included ("\n" ^ 1 is "\v",
    # which a whitespace strip would silently drop).
    path = copy_bundle(tiny_bundle, tmp_path)
    digest = path / MANIFEST_DIGEST
    original = digest.read_bytes()
    assert original.endswith(b"\n")
    for offset in range(len(original)):
        flip_byte(digest, offset)
        refused(path, rf"{re.escape(MANIFEST_DIGEST)} says")
        digest.write_bytes(original)
    verify_bundle(path)


def test_missing_listed_file_is_refused(tiny_bundle, tmp_path):
    path = copy_bundle(tiny_bundle, tmp_path)
    (path / "tokenizer.json").unlink()
    refused(path, r"failed verification:\n  - tokenizer\.json: missing")


def test_extra_unlisted_file_is_refused(tiny_bundle, tmp_path):
    path = copy_bundle(tiny_bundle, tmp_path)
    (path / "extra.bin").write_bytes(b"not part of the bundle")
    (path / "sub").mkdir()
    (path / "sub" / "hidden.txt").write_text("nested extra\n")
    error = refused(path, r"extra\.bin: not listed in the manifest")
    assert "sub/hidden.txt: not listed in the manifest" in str(error)


def test_truncated_file_is_refused(tiny_bundle, tmp_path):
    path = copy_bundle(tiny_bundle, tmp_path)
    data = path / "model.onnx.data"
    size = data.stat().st_size
    with open(data, "r+b") as handle:
        handle.truncate(size // 2)
    refused(path, rf"model\.onnx\.data: {size // 2} bytes, manifest says {size}")


def test_rewriting_the_manifest_consistently_still_verifies(tiny_bundle, tmp_path):
    # The helper used below must not itself break the bundle, or the next tests would prove nothing.
    path = copy_bundle(tiny_bundle, tmp_path)
    rewrite_manifest(path, lambda manifest: None)
    assert verify_bundle(path).bundle_id == tiny_bundle.bundle_id


def test_unknown_schema_version_is_refused(tiny_bundle, tmp_path):
    path = copy_bundle(tiny_bundle, tmp_path)
    rewrite_manifest(path, lambda manifest: manifest.update(schema_version=99, edgesdk_version="9.1.0"))
    error = refused(path, r"manifest schema version 99; this edgesdk \(.*\) reads versions 1, 2")
    assert "rebuild" in error.fix
    assert error.fix.endswith("install the edgesdk that built it (edgesdk 9.1.0)")


def test_manifest_lacking_a_required_key_is_refused(tiny_bundle, tmp_path):
    path = copy_bundle(tiny_bundle, tmp_path)
    rewrite_manifest(path, lambda manifest: manifest.pop("graph"))
    refused(path, r"manifest lacks \['graph'\]")


def _drop_size(manifest):
    del next(iter(manifest["files"].values()))["size"]


def _unlist_the_graph(manifest):
    del manifest["files"][manifest["graph"]["file"]]


def _weights_record(**change):
    """A graph.weights record (edgesdk/weights_file.py) naming a listed file, with ``change`` applied."""
    def add(manifest):
        facts = manifest["files"]["model.onnx.data"]
        manifest["graph"]["weights"] = {"file": "model.onnx.data", "codec": "zlib", "external_name": "model.onnx.data",
                                        "bytes": facts["size"], "sha256": facts["sha256"], **change}
    return add


@pytest.mark.parametrize(("change", "match"), [
    (lambda m: m.update(files=list(m["files"])), "'files' must map file names to {size, sha256}, got list"),
    (lambda m: m.update(files=None), "'files' must map file names to {size, sha256}, got NoneType"),
    (_drop_size, r"files\[.*\] must be {size: int, sha256: str}"),
    (lambda m: m.update(target="rpi5"), "'target' must be a mapping with a 'name' string, got 'rpi5'"),
    (lambda m: m["tokenizer"].pop("file"), "'tokenizer' must be a mapping with a 'file' string"),
    (_unlist_the_graph, "is opened by the runtime but not listed in 'files'"),
    (lambda m: m["runtime"].pop("backend"), "'runtime' must have a 'backend' string, got None"),
    (lambda m: m.update(runtime="ort-cpu"), "'runtime' must be a mapping with 'backend'"),
    (lambda m: m["runtime"].update(fallbacks="ort-cpu"), r"'runtime.fallbacks' must be a list"),
    (lambda m: m["runtime"].update(threads="4"), r"'runtime.threads' must be a whole number of at least 1"),
    (lambda m: m["runtime"].update(threads=0), r"'runtime.threads' must be a whole number of at least 1, got 0"),
    (_weights_record(bytes=None), r"'graph.weights' must be a mapping with file, codec, external_name, bytes"),
    (_weights_record(external_name="../../escaped.data"),
     r"'graph.weights.external_name' must be a bare file name, got '\.\./\.\./escaped\.data'"),
    (_weights_record(external_name="/tmp/escaped.data"), r"'graph.weights.external_name' must be a bare file name"),
    (_weights_record(bytes=-1), r"'graph.weights.bytes' must be a whole number >= 0, got -1"),  # -1 + 1: no limit
], ids=["files-list", "files-null", "entry-without-size", "target-string", "tokenizer-without-file",
        "graph-unlisted", "runtime-without-backend", "runtime-string", "fallbacks-string", "threads-string",
        "threads-zero", "weights-without-bytes", "weights-name-with-dotdot", "weights-name-absolute",
        "weights-negative-bytes"])
def test_a_hand_edited_manifest_is_refused_with_what_is_wrong(tiny_bundle, tmp_path, change, match):
    """The digest matches (the edit rewrote it), so only the manifest's own shape can catch these;
    each was a traceback (AttributeError, KeyError, TypeError)."""
    path = copy_bundle(tiny_bundle, tmp_path)
    rewrite_manifest(path, change)
    error = refused(path, match)
    assert "edited by hand" in error.fix


def test_a_sound_weights_record_is_accepted(tiny_bundle, tmp_path):
    path = copy_bundle(tiny_bundle, tmp_path)
    rewrite_manifest(path, _weights_record())
    assert verify_bundle(path).manifest["graph"]["weights"]["external_name"] == "model.onnx.data"


def test_manifest_listing_a_path_outside_the_bundle_is_refused(tiny_bundle, tmp_path):
    path = copy_bundle(tiny_bundle, tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_text("secret\n")
    facts = {"size": outside.stat().st_size, "sha256": hashlib.sha256(outside.read_bytes()).hexdigest()}
    rewrite_manifest(path, lambda manifest: manifest["files"].update({"../outside.txt": facts}))
    refused(path, r"\.\./outside\.txt: path escapes the bundle")


def test_manifest_that_is_not_json_is_refused(tiny_bundle, tmp_path):
    path = copy_bundle(tiny_bundle, tmp_path)
    text = "{not json"
    (path / MANIFEST).write_text(text)
    (path / MANIFEST_DIGEST).write_text(hashlib.sha256(text.encode()).hexdigest() + "\n")
    refused(path, r"manifest\.json is not valid JSON")


def test_directory_that_is_not_a_bundle_is_refused(tmp_path):
    (tmp_path / "README.txt").write_text("just a directory\n")
    refused(tmp_path, r"has no manifest\.json: it is incomplete or not a bundle")


def test_a_folder_holding_a_bundle_names_the_bundle_inside(tiny_bundle, tmp_path):
    """A deploy root (its ``current``) or the folder 'edgesdk unpack' wrote into, passed as the bundle."""
    holder = tmp_path / "holder"
    holder.mkdir()
    copy_bundle(tiny_bundle, holder)
    inner = next(child for child in holder.iterdir() if (child / "manifest.json").is_file())
    (holder / "current").symlink_to(inner.name)
    error = refused(holder, "is not a bundle but holds 2")
    assert f"pass the bundle itself, e.g. {holder / 'current'}" in error.fix


def test_bundle_without_digest_is_refused(tiny_bundle, tmp_path):
    path = copy_bundle(tiny_bundle, tmp_path)
    (path / MANIFEST_DIGEST).unlink()
    refused(path, r"has no manifest\.sha256: it is incomplete or not a bundle")


def test_path_that_does_not_exist_is_refused(tmp_path):
    refused(tmp_path / "no-such-bundle", r"no-such-bundle does not exist or is not a directory")


def test_a_bundle_left_aside_by_an_interrupted_write_is_pointed_out(tiny_bundle, tmp_path):
    path = copy_bundle(tiny_bundle, tmp_path)
    aside = path.with_name(f".{path.name}.old")
    path.rename(aside)
    error = refused(path, r"holds the bundle that was there before an interrupted write")
    assert f"mv {aside} {path}" in error.fix


def test_file_instead_of_directory_is_refused(tmp_path):
    file = tmp_path / "bundle.tar"
    file.write_bytes(b"x")
    error = refused(file, r"bundle\.tar is a file, not a bundle directory")
    assert f"edgesdk unpack {file} DIR" in error.fix


# --- BundleWriter ----------------------------------------------------------------------------------

def test_writer_stages_until_commit(tmp_path):
    destination = tmp_path / "out"
    source = tmp_path / "weights.bin"
    source.write_bytes(bytes(range(256)) * 8)
    writer = BundleWriter(destination)
    writer.add_file(source, "model.onnx.data")
    writer.write_text("report.md", "hello\n")

    assert writer.staging == tmp_path / ".out.partial"
    assert not destination.exists()
    assert sorted(os.listdir(tmp_path)) == [".out.partial", "weights.bin"]

    bundle = writer.commit(dict(MINIMAL_MANIFEST))
    assert destination.is_dir()
    assert sorted(os.listdir(tmp_path)) == ["out", "weights.bin"]
    assert sorted(os.listdir(destination)) == [MANIFEST, MANIFEST_DIGEST, "model.onnx.data", "report.md"]
    assert bundle.manifest["files"]["report.md"] == {"size": 6, "sha256": hashlib.sha256(b"hello\n").hexdigest()}
    assert verify_bundle(destination, expected_target="host").bundle_id == bundle.bundle_id


def test_writer_discards_a_stale_partial_directory(tmp_path):
    stale = tmp_path / ".out.partial"
    stale.mkdir()
    (stale / "leftover.bin").write_bytes(b"from an interrupted build")
    writer = BundleWriter(tmp_path / "out")
    writer.write_text("report.md", "fresh\n")
    bundle = writer.commit(dict(MINIMAL_MANIFEST))
    assert sorted(bundle.manifest["files"]) == ["report.md"]
    verify_bundle(bundle.path)


def test_commit_over_an_existing_bundle_replaces_it(tmp_path):
    destination = tmp_path / "out"
    first = BundleWriter(destination)
    first.write_text("old.txt", "old\n")
    first.write_text("report.md", "old\n")
    old = first.commit(dict(MINIMAL_MANIFEST))

    second = BundleWriter(destination)
    second.write_text("new.txt", "new\n")
    second.write_text("report.md", "new\n")
    assert (destination / "old.txt").is_file()  # the old bundle stays usable until the commit
    new = second.commit(dict(MINIMAL_MANIFEST))

    assert sorted(os.listdir(destination)) == [MANIFEST, MANIFEST_DIGEST, "new.txt", "report.md"]
    assert sorted(os.listdir(tmp_path)) == ["out"]  # no .out.old or .out.partial left behind
    assert new.bundle_id != old.bundle_id
    assert verify_bundle(destination).bundle_id == new.bundle_id


def test_a_commit_after_one_killed_between_its_renames_clears_what_it_left(tmp_path):
    """Killed between its two renames, a commit leaves the earlier bundle at .out.old and nothing at
    out; the next build's commit replaces it, so the leftover goes too."""
    destination = tmp_path / "out"
    first = BundleWriter(destination)
    first.write_text("report.md", "old\n")
    first.commit(dict(MINIMAL_MANIFEST))
    os.replace(destination, tmp_path / ".out.old")  # the first rename of an interrupted commit
    second = BundleWriter(destination)
    second.write_text("report.md", "new\n")
    new = second.commit(dict(MINIMAL_MANIFEST))
    assert sorted(os.listdir(tmp_path)) == ["out"]
    assert verify_bundle(destination).bundle_id == new.bundle_id


def test_commit_over_a_link_to_a_bundle_replaces_the_link(tmp_path):
    """Removing the link put aside was an OSError (rmtree on a symbolic link) after the commit."""
    first = BundleWriter(tmp_path / "real")
    first.write_text("report.md", "old\n")
    old = first.commit(dict(MINIMAL_MANIFEST))
    (tmp_path / "link").symlink_to("real")
    second = BundleWriter(tmp_path / "link")
    second.write_text("report.md", "new\n")
    new = second.commit(dict(MINIMAL_MANIFEST))
    assert sorted(os.listdir(tmp_path)) == ["link", "real"]
    assert not (tmp_path / "link").is_symlink()
    assert verify_bundle(tmp_path / "link").bundle_id == new.bundle_id
    assert verify_bundle(tmp_path / "real").bundle_id == old.bundle_id  # the bundle the link named stays


def test_identical_content_gives_identical_bundle_id(tmp_path):
    ids = []
    for name in ("a", "b"):
        writer = BundleWriter(tmp_path / name)
        writer.write_text("report.md", "same content\n")
        writer.write_text("sub/notes.txt", "nested\n")
        ids.append(writer.commit(dict(MINIMAL_MANIFEST)).bundle_id)
    assert ids[0] == ids[1]

    writer = BundleWriter(tmp_path / "c")
    writer.write_text("report.md", "other content\n")
    writer.write_text("sub/notes.txt", "nested\n")
    assert writer.commit(dict(MINIMAL_MANIFEST)).bundle_id != ids[0]


def test_rewriting_the_session_bundle_reproduces_its_id(tiny_bundle, tmp_path):
    writer = BundleWriter(tmp_path / "again")
    for name in tiny_bundle.manifest["files"]:
        writer.add_file(tiny_bundle.path / name, name)
    written_by_writer = ("schema_version", "edgesdk_version", "created", "bundle_id", "files")
    manifest = {k: v for k, v in tiny_bundle.manifest.items() if k not in written_by_writer}
    bundle = writer.commit(manifest)
    assert bundle.bundle_id == tiny_bundle.bundle_id
    assert bundle.manifest["files"] == tiny_bundle.manifest["files"]


# --- pack / unpack ---------------------------------------------------------------------------------

def test_pack_unpack_round_trip(tiny_bundle, tmp_path):
    path = copy_bundle(tiny_bundle, tmp_path)
    archive = pack_bundle(path, tmp_path / "bundle.tar")
    assert archive == tmp_path / "bundle.tar"
    assert not (tmp_path / "bundle.tar.partial").exists()

    unpacked = unpack_bundle(archive, tmp_path / "unpacked")
    assert unpacked.path == tmp_path / "unpacked" / path.name
    assert unpacked.bundle_id == tiny_bundle.bundle_id
    assert verify_bundle(unpacked.path, expected_target="host").bundle_id == tiny_bundle.bundle_id
    for name in BUNDLE_FILES:
        assert (unpacked.path / name).read_bytes() == (path / name).read_bytes()
    assert leftovers(tmp_path / "unpacked") == [path.name]  # no .NAME.unpacking left


def test_unpack_over_an_existing_bundle_replaces_it(tiny_bundle, tmp_path):
    path = copy_bundle(tiny_bundle, tmp_path)
    archive = pack_bundle(path, tmp_path / "bundle.tar")
    destination = tmp_path / "unpacked"
    unpack_bundle(archive, destination)
    (destination / path.name / "stray.txt").write_text("left by hand\n")
    bundle = unpack_bundle(archive, destination)
    assert not (bundle.path / "stray.txt").exists()
    verify_bundle(bundle.path)


KILLED_UNPACK = """
import os, signal, sys
from pathlib import Path
from edgesdk.bundle import unpack_bundle

archive, destination, kill_at = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
steps = 0


def kill_at_step(event, args):
    global steps
    if event in ("os.rename", "os.remove", "os.rmdir"):  # every rename, and every file rmtree removes
        steps += 1
        if steps == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


sys.addaudithook(kill_at_step)
unpack_bundle(archive, destination)
"""


def test_unpack_killed_at_any_step_leaves_a_whole_bundle(tiny_bundle, tmp_path):
    """Over an earlier bundle, unpack removed it file by file and then renamed the new one in: killed
    in between, the bundle's directory was half deleted, or gone with nothing pointing to the new one."""
    archive = pack_bundle(tiny_bundle.path, tmp_path / "bundle.tar")
    destination = tmp_path / "dest"
    name = tiny_bundle.path.name
    for kill_at in range(1, 100):
        shutil.rmtree(destination, ignore_errors=True)
        copy_bundle(tiny_bundle, destination)
        child = subprocess.run([sys.executable, "-c", KILLED_UNPACK, str(archive), str(destination), str(kill_at)],
                               capture_output=True, text=True, timeout=120)
        if child.returncode == 0:  # it ran past its last step
            break
        assert child.returncode == -signal.SIGKILL, child.stderr
        if (destination / name).exists():
            assert verify_bundle(destination / name).bundle_id == tiny_bundle.bundle_id
        else:  # killed between the renames: the earlier bundle is aside, and pointed out
            refused(destination / name, "holds the bundle that was there before an interrupted write")
            assert verify_bundle(destination / f".{name}.old").bundle_id == tiny_bundle.bundle_id
        assert unpack_bundle(archive, destination).bundle_id == tiny_bundle.bundle_id
        assert leftovers(destination) == [name]
    assert kill_at > 3


def test_unpack_over_a_link_to_a_bundle_replaces_the_link(tiny_bundle, tmp_path):
    """Removing the link was an OSError (rmtree on a symbolic link) that left the staging directory."""
    archive = pack_bundle(tiny_bundle.path, tmp_path / "bundle.tar")
    elsewhere = copy_bundle(tiny_bundle, tmp_path / "elsewhere")
    destination = tmp_path / "dest"
    destination.mkdir()
    (destination / elsewhere.name).symlink_to(elsewhere)
    bundle = unpack_bundle(archive, destination)
    assert not bundle.path.is_symlink()
    assert leftovers(destination) == [elsewhere.name]
    verify_bundle(elsewhere)


def test_pack_refuses_a_corrupt_bundle(tiny_bundle, tmp_path):
    path = copy_bundle(tiny_bundle, tmp_path)
    flip_byte(path / "model.onnx", 100)
    with pytest.raises(BundleError, match=r"model\.onnx: sha256 differs from the manifest") as info:
        pack_bundle(path, tmp_path / "bundle.tar")
    assert info.value.fix
    assert not (tmp_path / "bundle.tar").exists()
    assert not (tmp_path / "bundle.tar.partial").exists()


def _dotdot(tar, bundle, tmp_path):
    add_directory(tar, bundle, bundle.name)
    add_bytes(tar, "../evil")


def _dotdot_inside(tar, bundle, tmp_path):
    add_directory(tar, bundle, bundle.name)
    add_bytes(tar, f"{bundle.name}/../../evil")


def _absolute_tmp(tar, bundle, tmp_path):
    add_directory(tar, bundle, bundle.name)
    add_bytes(tar, "/tmp/evil")


def _absolute_into_tmp_path(tar, bundle, tmp_path):
    add_directory(tar, bundle, bundle.name)
    add_bytes(tar, str(tmp_path / "escaped.txt"))


def _symlink(tar, bundle, tmp_path):
    add_directory(tar, bundle, bundle.name)
    add_special(tar, f"{bundle.name}/link", tarfile.SYMTYPE, linkname=str(tmp_path / "outside.txt"))


def _hardlink(tar, bundle, tmp_path):
    add_directory(tar, bundle, bundle.name)
    add_special(tar, f"{bundle.name}/hard", tarfile.LNKTYPE, linkname=str(tmp_path / "outside.txt"))


def _fifo(tar, bundle, tmp_path):
    add_directory(tar, bundle, bundle.name)
    add_special(tar, f"{bundle.name}/fifo", tarfile.FIFOTYPE)


def _sparse(tar, bundle, tmp_path):
    """A member of no stored bytes that unpacks to 64 MiB of zeros (or to any size its header says)."""
    add_directory(tar, bundle, bundle.name)
    info = tarfile.TarInfo(f"{bundle.name}/sparse.bin")
    info.pax_headers = {"GNU.sparse.size": str(64 << 20), "GNU.sparse.map": "0,0", "GNU.sparse.name": info.name}
    tar.addfile(info, io.BytesIO(b""))


def _two_top_level_directories(tar, bundle, tmp_path):
    add_directory(tar, bundle, bundle.name)
    add_directory(tar, bundle, "second")


def _top_level_file(tar, bundle, tmp_path):
    add_bytes(tar, "evil.txt")


HOSTILE = {
    "dotdot": (_dotdot, r"member '\.\./evil' would escape the bundle"),
    "dotdot-inside": (_dotdot_inside, r"member '[^']*/\.\./\.\./evil' would escape the bundle"),
    "absolute-tmp": (_absolute_tmp, r"member '/tmp/evil' would escape the bundle"),
    "absolute-tmp-path": (_absolute_into_tmp_path, r"member '/[^']*escaped\.txt' would escape the bundle"),
    "symlink": (_symlink, r"link '[^']*/link' would escape the bundle or is not a plain file"),
    "hardlink": (_hardlink, r"link '[^']*/hard' would escape the bundle or is not a plain file"),
    "fifo": (_fifo, r"member '[^']*/fifo' would escape the bundle or is not a plain file"),
    "sparse": (_sparse, r"sparse member '[^']*/sparse\.bin' would escape the bundle or is not a plain file"),
    "two-top-level-dirs": (_two_top_level_directories, r"holds 2 top-level entries .* expected one bundle directory"),
    "top-level-file": (_top_level_file, r"holds no bundle directory, only the file 'evil\.txt'"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_unpack_refuses_hostile_archives(tiny_bundle, tmp_path, case):
    build, match = HOSTILE[case]
    work = tmp_path / "work"
    work.mkdir()
    bundle = copy_bundle(tiny_bundle, work)
    (tmp_path / "outside.txt").write_text("must stay untouched\n")
    archive = tmp_path / "hostile.tar"
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        build(tar, bundle, tmp_path)
    destination = tmp_path / "dest"
    tmp_evil_existed = os.path.lexists("/tmp/evil")
    before = snapshot(tmp_path, exclude=destination)

    with pytest.raises(BundleError, match=match) as info:
        unpack_bundle(archive, destination)

    assert "edgesdk pack" in info.value.fix
    assert snapshot(tmp_path, exclude=destination) == before
    assert leftovers(destination) == []
    if not tmp_evil_existed:
        assert not os.path.lexists("/tmp/evil")


def test_pack_from_inside_the_bundle_names_its_directory(tiny_bundle, tmp_path, monkeypatch):
    path = copy_bundle(tiny_bundle, tmp_path)
    monkeypatch.chdir(path)
    archive = pack_bundle(Path("."), tmp_path / "bundle.tar")
    assert unpack_bundle(archive, tmp_path / "unpacked").path == tmp_path / "unpacked" / path.name


def test_pack_stores_linked_files_as_files(tiny_bundle, tmp_path):
    path = copy_bundle(tiny_bundle, tmp_path / "work")
    moved = tmp_path / "elsewhere.json"
    shutil.move(path / "tokenizer.json", moved)
    (path / "tokenizer.json").symlink_to(moved)
    verify_bundle(path)
    unpacked = unpack_bundle(pack_bundle(path, tmp_path / "bundle.tar"), tmp_path / "dest")
    assert not (unpacked.path / "tokenizer.json").is_symlink()
    assert (unpacked.path / "tokenizer.json").read_bytes() == moved.read_bytes()


def test_pack_into_a_missing_directory_is_a_clear_error(tiny_bundle, tmp_path):
    path = copy_bundle(tiny_bundle, tmp_path)
    with pytest.raises(BundleError, match=r"cannot write the archive .*nowhere/bundle\.tar") as info:
        pack_bundle(path, tmp_path / "nowhere" / "bundle.tar")
    assert "writable directory" in info.value.fix


def test_pack_into_an_existing_directory_writes_the_bundle_name_there(tiny_bundle, tmp_path):
    """As cp does; it was "cannot write the archive ... Is a directory" from the rename."""
    path = copy_bundle(tiny_bundle, tmp_path)
    (tmp_path / "outbox").mkdir()
    archive = pack_bundle(path, tmp_path / "outbox")
    assert archive == tmp_path / "outbox" / f"{path.name}.tar"
    assert unpack_bundle(archive, tmp_path / "unpacked").bundle_id == tiny_bundle.bundle_id


def test_unpack_takes_an_archive_made_with_tar_dot(tiny_bundle, tmp_path):
    """``tar -C parent -cf x.tar .`` adds a ``./`` member for the archive's root."""
    path = copy_bundle(tiny_bundle, tmp_path / "parent")
    archive = tmp_path / "dot.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(path.parent, arcname=".")
    assert unpack_bundle(archive, tmp_path / "dest").bundle_id == tiny_bundle.bundle_id


def test_unpack_over_a_file_of_the_bundle_name_keeps_the_file(tiny_bundle, tmp_path):
    path = copy_bundle(tiny_bundle, tmp_path / "work")
    archive = pack_bundle(path, tmp_path / "bundle.tar")
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / path.name).write_text("mine\n")
    with pytest.raises(BundleError, match="is a file, not a bundle directory"):
        unpack_bundle(archive, tmp_path / "dest")
    assert (tmp_path / "dest" / path.name).read_text() == "mine\n"
    assert leftovers(tmp_path / "dest") == [path.name]


def test_unpack_over_a_directory_that_is_not_a_bundle_keeps_it(tiny_bundle, tmp_path):
    """It was removed and replaced without a word."""
    path = copy_bundle(tiny_bundle, tmp_path / "work")
    archive = pack_bundle(path, tmp_path / "bundle.tar")
    mine = tmp_path / "dest" / path.name
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("precious\n")
    with pytest.raises(BundleError, match="holds files and is not a bundle") as info:
        unpack_bundle(archive, tmp_path / "dest")
    assert "unpack into another directory" in info.value.fix
    assert (mine / "notes.txt").read_text() == "precious\n"
    assert unpack_bundle(archive, tmp_path / "dest2").bundle_id == tiny_bundle.bundle_id
    assert unpack_bundle(archive, tmp_path / "dest2").bundle_id == tiny_bundle.bundle_id  # an earlier bundle: replaced


@pytest.mark.parametrize("under", ["", "sub"])
def test_unpack_into_a_file_names_the_file(tiny_bundle, tmp_path, under):
    archive = pack_bundle(tiny_bundle.path, tmp_path / "b.tar")
    (tmp_path / "afile.txt").write_text("notes")
    destination = tmp_path / "afile.txt" / under if under else tmp_path / "afile.txt"
    with pytest.raises(BundleError, match=r"afile.txt is a file, not a directory") as error:
        unpack_bundle(archive, destination)
    assert "pass a directory" in error.value.fix
    assert (tmp_path / "afile.txt").read_text() == "notes"


def test_pack_into_the_bundle_itself_is_refused(tiny_bundle, tmp_path):
    path = copy_bundle(tiny_bundle, tmp_path / "work")
    with pytest.raises(BundleError, match="would be written inside the bundle"):
        pack_bundle(path, path / "self.tar")
    assert verify_bundle(path).bundle_id == tiny_bundle.bundle_id


def test_unpack_refuses_a_truncated_gzip_archive(tiny_bundle, tmp_path):
    path = copy_bundle(tiny_bundle, tmp_path / "work")
    archive = tmp_path / "bundle.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        add_directory(tar, path, path.name)
    truncated = tmp_path / "truncated.tgz"
    truncated.write_bytes(archive.read_bytes()[: archive.stat().st_size * 2 // 3])
    with pytest.raises(BundleError, match=r"truncated\.tgz") as info:
        unpack_bundle(truncated, tmp_path / "dest")
    assert info.value.fix
    assert leftovers(tmp_path / "dest") == []


@pytest.mark.parametrize("content", [b"this is not a tar archive\n" * 100, b""], ids=["text", "empty"])
def test_unpack_refuses_a_file_that_is_not_a_tar(tmp_path, content):
    archive = tmp_path / "bundle.tar"
    archive.write_bytes(content)
    with pytest.raises(BundleError, match=r"bundle\.tar is not a readable tar archive") as info:
        unpack_bundle(archive, tmp_path / "dest")
    assert info.value.fix
    assert leftovers(tmp_path / "dest") == []


@pytest.mark.parametrize("where", ["in-data", "in-header"])
def test_unpack_refuses_a_truncated_archive(tiny_bundle, tmp_path, where):
    path = copy_bundle(tiny_bundle, tmp_path)
    archive = pack_bundle(path, tmp_path / "bundle.tar")
    with tarfile.open(archive) as tar:
        members = {m.name.rsplit("/", 1)[-1]: m for m in tar.getmembers()}
    data_member = members["model.onnx.data"]
    last = max(members.values(), key=lambda m: m.offset)
    if where == "in-data":  # tarfile fails reading the member list
        cut, match = data_member.offset_data + data_member.size // 2, r"truncated\.tar is truncated or corrupt"
    else:  # tarfile takes a cut header for the end of the archive; verification finds the file missing
        cut, match = last.offset + 100, rf"failed verification:\n  - {re.escape(last.name.split('/')[-1])}: missing"
    truncated = tmp_path / "truncated.tar"
    truncated.write_bytes(archive.read_bytes()[:cut])

    with pytest.raises(BundleError, match=match) as info:
        unpack_bundle(truncated, tmp_path / "dest")
    assert info.value.fix
    assert leftovers(tmp_path / "dest") == []


def test_unpack_refuses_a_corrupt_bundle_and_leaves_nothing(tiny_bundle, tmp_path):
    path = copy_bundle(tiny_bundle, tmp_path)
    flip_byte(path / "model.onnx.data", random.Random("unpack").randrange((path / "model.onnx.data").stat().st_size))
    archive = tmp_path / "corrupt.tar"
    with tarfile.open(archive, "w") as tar:  # by hand: pack_bundle would refuse to pack it
        add_directory(tar, path, path.name)
    destination = tmp_path / "dest"

    with pytest.raises(BundleError, match=r"failed verification:\n  - model\.onnx\.data: sha256 differs") as info:
        unpack_bundle(archive, destination)
    assert info.value.fix
    assert info.value.problem.startswith(f"the bundle {path.name} in {archive} failed verification")  # not .NAME.unpacking
    assert not (destination / path.name).exists()
    assert leftovers(destination) == []  # the .NAME.unpacking staging directory is gone too


def test_failed_unpack_keeps_the_bundle_already_there(tiny_bundle, tmp_path):
    good = copy_bundle(tiny_bundle, tmp_path / "dest")
    corrupt = copy_bundle(tiny_bundle, tmp_path / "work")
    flip_byte(corrupt / "tokenizer.json", 10)
    archive = tmp_path / "corrupt.tar"
    with tarfile.open(archive, "w") as tar:
        add_directory(tar, corrupt, corrupt.name)

    with pytest.raises(BundleError, match=r"tokenizer\.json: sha256 differs from the manifest"):
        unpack_bundle(archive, tmp_path / "dest")
    assert leftovers(tmp_path / "dest") == [good.name]
    assert verify_bundle(good).bundle_id == tiny_bundle.bundle_id


def test_unpack_error_while_writing_leaves_no_staging(tmp_path):
    # A file and a file "inside" it: legal in a tar, impossible on disk; the write fails midway.
    archive = tmp_path / "clash.tar"
    with tarfile.open(archive, "w") as tar:
        add_bytes(tar, "b/a", b"file\n")
        add_bytes(tar, "b/a/c", b"under a file\n")
    with pytest.raises(BundleError, match=r"cannot unpack .*clash\.tar into") as info:
        unpack_bundle(archive, tmp_path / "dest")
    assert info.value.fix
    assert leftovers(tmp_path / "dest") == []


def test_unpack_of_a_folder_of_bundles_never_names_the_staging_directory(tiny_bundle, tmp_path):
    folder = tmp_path / "bundles"
    copy_bundle(tiny_bundle, folder)  # a folder holding a bundle, packed by hand
    archive = tmp_path / "bundles.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(folder, arcname=folder.name)
    with pytest.raises(BundleError, match="is not a bundle but holds 1") as info:
        unpack_bundle(archive, tmp_path / "dest")
    assert ".unpacking" not in info.value.problem + (info.value.fix or ""), info.value  # gone when read
    assert f"the bundle bundles in {archive}" in info.value.problem
