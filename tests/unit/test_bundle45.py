"""Review 45 of the bundle format: what a bundle write may replace, a mount point as the output, and
the staged files reaching the disk before the renames that publish them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from edgesdk.bundle import (
    MANIFEST,
    BundleWriter,
    check_replaceable,
    pack_bundle,
    unpack_bundle,
    verify_bundle,
)
from edgesdk.errors import BundleError

MINIMAL_MANIFEST = {"target": {"name": "host"}, "model": {}, "graph": {"file": "report.md"},
                    "tokenizer": {"file": "report.md"}, "runtime": {"backend": "ort-cpu", "fallbacks": [], "threads": 1},
                    "stages": []}


def _small_bundle(path: Path, text: str = "hello\n"):
    writer = BundleWriter(path)
    writer.write_text("report.md", text)
    writer.write_text("sub/notes.txt", "nested\n")
    return writer.commit(dict(MINIMAL_MANIFEST))


def _project(path: Path) -> dict[str, str]:
    """A user's directory with a manifest.json of its own (a browser extension's) and other files."""
    files = {MANIFEST: json.dumps({"name": "my extension", "manifest_version": 3}), "src/app.js": "precious\n"}
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return files


def _unchanged(path: Path, files: dict[str, str]) -> bool:
    return all((path / name).read_text() == text for name, text in files.items())


# --- a directory with a manifest.json is not, by that alone, a bundle to replace ------------------------

def test_a_commit_keeps_a_directory_whose_manifest_json_is_not_a_bundles(tmp_path):
    """Any directory with a file named manifest.json counted as an earlier bundle: 'edgesdk build --out .' in a
    web project (or at a browser extension's folder) deleted the whole directory once the build was done."""
    project = tmp_path / "project"
    files = _project(project)
    with pytest.raises(BundleError, match="holds files and is not a bundle") as info:
        check_replaceable(project)
    assert "--out" in info.value.fix
    writer = BundleWriter(project)
    writer.write_text("report.md", "hello\n")
    with pytest.raises(BundleError, match="holds files and is not a bundle"):
        writer.commit(dict(MINIMAL_MANIFEST))
    writer.discard()
    assert _unchanged(project, files)
    assert sorted(os.listdir(tmp_path)) == ["project"]


def test_unpack_keeps_a_directory_whose_manifest_json_is_not_a_bundles(tmp_path):
    bundle = _small_bundle(tmp_path / "b")
    archive = pack_bundle(bundle.path, tmp_path / "b.tar")
    destination = tmp_path / "dest"
    files = _project(destination / "b")
    with pytest.raises(BundleError, match="holds files and is not a bundle") as info:
        unpack_bundle(archive, destination)
    assert "unpack into another directory" in info.value.fix
    assert _unchanged(destination / "b", files)
    assert sorted(os.listdir(destination)) == ["b"]


def test_an_earlier_bundle_is_still_replaced(tmp_path):
    first = _small_bundle(tmp_path / "out", "old\n")
    (first.path / "stray.txt").write_text("left by hand\n")  # it fails verification; rebuilding replaces it
    second = _small_bundle(tmp_path / "out", "new\n")
    assert second.bundle_id != first.bundle_id
    assert verify_bundle(tmp_path / "out").bundle_id == second.bundle_id
    assert sorted(os.listdir(tmp_path)) == ["out"]


# --- a mount point as the output ------------------------------------------------------------------------

@pytest.fixture
def mount_point(tmp_path):
    """An empty tmpfs mounted on tmp_path/card (an SD card's or a container volume's mount point)."""
    card = tmp_path / "card"
    card.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(card)], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        pytest.skip("no mount command here")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    yield card
    subprocess.run(["umount", str(card)], capture_output=True, timeout=30)


def test_a_mount_point_output_is_refused_before_the_work(mount_point):
    """The whole build ran, then renaming the mount point aside raised a bare OSError (EBUSY) traceback."""
    with pytest.raises(BundleError, match="is a mount point") as info:
        check_replaceable(mount_point)
    assert str(mount_point / "bundle") in info.value.fix
    writer = BundleWriter(mount_point)
    writer.write_text("report.md", "hello\n")
    with pytest.raises(BundleError, match="is a mount point"):
        writer.commit(dict(MINIMAL_MANIFEST))
    writer.discard()
    assert os.listdir(mount_point) == []
    assert _small_bundle(mount_point / "bundle").path.parent == mount_point  # inside it, as the fix says


def test_a_bind_mount_of_the_same_file_system_is_seen_too(tmp_path, mount_point):
    """os.path.ismount compares devices, so a directory bind-mounted from its own file system passes it."""
    source, target = mount_point / "source", mount_point / "target"
    source.mkdir()
    target.mkdir()
    bound = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True, timeout=30)
    if bound.returncode != 0:
        pytest.skip("cannot bind-mount here")
    try:
        assert not os.path.ismount(target)
        with pytest.raises(BundleError, match="is a mount point"):
            check_replaceable(target)
    finally:
        subprocess.run(["umount", str(target)], capture_output=True, timeout=30)


def test_a_rename_the_checks_did_not_foresee_is_a_bundle_error_and_keeps_both(tmp_path, mount_point):
    """Where the mount point is not seen beforehand (no /proc), the rename's EBUSY is named, not raised bare."""
    from edgesdk.bundle import _move_into_place

    staging = tmp_path / ".card.partial"
    staging.mkdir()
    (staging / "report.md").write_text("new\n")
    with pytest.raises(BundleError, match=r"cannot replace .*card with the new bundle") as info:
        _move_into_place(staging, mount_point)
    assert "mount point" in info.value.fix
    assert (staging / "report.md").is_file()
    assert os.listdir(mount_point) == []


# --- the staged files reach the disk before the renames ----------------------------------------------------

@pytest.fixture
def synced(monkeypatch):
    """Every fsync (by the path of its descriptor) and every os.replace, in order; both still run."""
    events: list[tuple] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(handle):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{handle}")))
        return real_fsync(handle)

    def replace(source, destination, **kwargs):
        events.append(("replace", os.fspath(source), os.fspath(destination)))
        return real_replace(source, destination, **kwargs)

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc/self/fd to name a descriptor's file")
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


def _check_published_durably(events: list[tuple], staging: Path, destination: Path) -> None:
    """Each file of the bundle at ``destination`` was synced under ``staging`` before the rename that put it
    there, and the directory holding ``destination`` after that rename."""
    publish = next(i for i, event in enumerate(events)
                   if event[0] == "replace" and event[2] == str(destination) and event[1] == str(staging))
    before = {event[1] for event in events[:publish] if event[0] == "fsync"}
    files = [p.relative_to(destination) for p in destination.rglob("*") if p.is_file()]
    assert files
    unsynced = [str(name) for name in files if str(staging / name) not in before]
    assert unsynced == [], f"not synced before the rename into place: {unsynced}"
    assert str(staging) in before  # the staged directories' entries
    assert str(staging / "sub") in before
    after = {event[1] for event in events[publish:] if event[0] == "fsync"}
    assert str(destination.parent) in after


def test_a_commit_syncs_the_bundle_before_publishing_it(tmp_path, synced):
    """Without fsync a power cut after the commit (the earlier bundle already removed) could leave the new
    name holding empty files: ext4 may write the rename before the files' data."""
    destination = tmp_path / "out"
    _small_bundle(destination, "old\n")
    synced.clear()
    _small_bundle(destination, "new\n")
    _check_published_durably(synced, tmp_path / ".out.partial", destination)
    replaced_aside = next(i for i, event in enumerate(synced) if event[0] == "replace" and event[2].endswith(".out.old"))
    assert replaced_aside < next(i for i, event in enumerate(synced) if event[0] == "replace"
                                 and event[2] == str(destination))


def test_unpack_syncs_the_bundle_before_publishing_it(tmp_path, synced):
    bundle = _small_bundle(tmp_path / "b")
    archive = pack_bundle(bundle.path, tmp_path / "b.tar")
    synced.clear()
    unpacked = unpack_bundle(archive, tmp_path / "dest")
    _check_published_durably(synced, tmp_path / "dest" / ".b.unpacking", unpacked.path)


# --- GGUF export reads the graph's weights only where the runtime would ------------------------------------

def _edited_graph(bundle, tmp_path: Path, label: str, edit) -> Path:
    """A copy of ``bundle`` whose model.onnx had ``edit(tensors by name)`` applied, relisted in the manifest."""
    import shutil

    onnx = pytest.importorskip("onnx")
    from tests.unit.test_bundle_damage36 import relist

    path = tmp_path / label
    shutil.copytree(bundle.path, path)
    model = onnx.load(str(path / "model.onnx"), load_external_data=False)
    edit(model, [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL])
    onnx.save_model(model, str(path / "model.onnx"))
    relist(path, "model.onnx")
    verify_bundle(path)  # the hashes match: only the graph's own check can tell
    return path


def _set_external(tensor, key: str, value) -> None:
    entry = next(entry for entry in tensor.external_data if entry.key == key)
    entry.value = value(entry.value)


GRAPH_EDITS = {
    # an offset moved into the next tensor: the GGUF file was written with the neighbour's bytes in it
    "overlap": (lambda model, external: _set_external(external[len(external) // 2], "offset",
                                                      lambda v: str(int(v) + 4)), "overlap in model.onnx.data"),
    # a location outside the bundle: read from there, or (cached) silently from the first file read
    "absolute": (lambda model, external: _set_external(external[0], "location", lambda v: "/etc/hostname"),
                 "'/etc/hostname', which is not a weights file in the bundle"),
    "escapes": (lambda model, external: _set_external(external[-1], "location", lambda v: "../" + v),
                "which is not a weights file in the bundle"),
}


@pytest.mark.parametrize("label", sorted(GRAPH_EDITS))
def test_gguf_export_refuses_a_graph_the_runtime_refuses(tiny_bundle, tmp_path, label):
    pytest.importorskip("gguf")
    from edgesdk.export.gguf_export import export_gguf
    from edgesdk.runtime.session import open_runtime

    edit, match = GRAPH_EDITS[label]
    path = _edited_graph(tiny_bundle, tmp_path, label, edit)
    with pytest.raises(BundleError, match=match):
        open_runtime(path, threads=1, ignore_target=True)
    out = tmp_path / f"{label}.gguf"
    with pytest.raises(BundleError, match=match) as info:
        export_gguf(path, out)
    assert "model.onnx" in info.value.problem
    assert info.value.fix
    assert not out.exists()


def test_gguf_export_of_an_intact_bundle_still_runs(tiny_bundle, tmp_path):
    pytest.importorskip("gguf")
    from edgesdk.export.gguf_export import export_gguf

    export_gguf(tiny_bundle.path, tmp_path / "intact.gguf")
    assert (tmp_path / "intact.gguf").stat().st_size > 0
