"""Bundle writes and archives: a manifest that verification would refuse never replaces the earlier bundle (it was
published, then failed verification, with the earlier bundle already removed), and an archive holding a plain file
beside its bundle directory is told so (it was called a member that escapes the bundle or is not a plain file)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from edgesdk.bundle import BundleWriter, unpack_bundle, verify_bundle
from edgesdk.errors import BundleError

MINIMAL_MANIFEST = {"target": {"name": "host"}, "model": {}, "graph": {"file": "report.md"},
                    "tokenizer": {"file": "report.md"}, "runtime": {"backend": "ort-cpu", "fallbacks": [], "threads": 1},
                    "stages": []}


def _bundle(path: Path, text: str, manifest: dict | None = None):
    writer = BundleWriter(path)
    writer.write_text("report.md", text)
    return writer.commit(manifest or dict(MINIMAL_MANIFEST))


@pytest.mark.parametrize(("change", "said"), [
    ({"runtime": {"backend": "ort-cpu", "fallbacks": [], "threads": 0}}, "'runtime.threads'"),
    ({"graph": {"file": "report.md", "max_context": None}}, "'graph.max_context'"),
    ({"tokenizer": {"file": "tokenizer.json"}}, "'tokenizer.json' is opened by the runtime"),
])
def test_a_manifest_verification_refuses_leaves_the_earlier_bundle(tmp_path, change, said):
    earlier = _bundle(tmp_path / "bundle", "earlier\n")
    with pytest.raises(BundleError, match=said) as caught:
        _bundle(tmp_path / "bundle", "later\n", {**MINIMAL_MANIFEST, **change})
    assert "is left as it was" in caught.value.problem
    kept = verify_bundle(tmp_path / "bundle")
    assert kept.bundle_id == earlier.bundle_id
    assert (kept.path / "report.md").read_text() == "earlier\n"


def test_a_sound_manifest_still_replaces_the_earlier_bundle(tmp_path):
    _bundle(tmp_path / "bundle", "earlier\n")
    _bundle(tmp_path / "bundle", "later\n")
    assert (verify_bundle(tmp_path / "bundle").path / "report.md").read_text() == "later\n"


def test_a_file_beside_the_bundle_directory_is_named_as_such(tmp_path):
    bundle = _bundle(tmp_path / "bundle", "hello\n")
    (tmp_path / "README").write_text("notes\n")
    archive = tmp_path / "both.tar"
    with tarfile.open(archive, "w") as tar:  # as 'tar -C DIR -cf both.tar bundle README' writes it
        tar.add(bundle.path, arcname="bundle")
        tar.add(tmp_path / "README", arcname="README")
    with pytest.raises(BundleError, match="holds the file 'README' beside the bundle directory") as caught:
        unpack_bundle(archive, tmp_path / "out")
    assert "escape" not in caught.value.problem
    assert "tar -C PARENT -cf ARCHIVE NAME" in caught.value.fix
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["/README", "../README"])
def test_a_file_outside_the_archive_root_is_still_named_as_escaping(tmp_path, name):
    archive = tmp_path / "bad.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo(name)
        tar.addfile(info)
    with pytest.raises(BundleError, match="would escape the bundle"):
        unpack_bundle(archive, tmp_path / "out")


def test_a_file_name_the_board_refuses_is_refused_before_it_replaces_anything(tmp_path):
    earlier = _bundle(tmp_path / "bundle", "earlier\n")
    writer = BundleWriter(tmp_path / "bundle")
    writer.write_text("report.md", "later\n")
    writer.write_text("notes.partial", "a name the board takes for a file still arriving\n")
    with pytest.raises(BundleError, match="notes.partial: its name ends in '.partial'"):
        writer.commit(dict(MINIMAL_MANIFEST))
    assert verify_bundle(tmp_path / "bundle").bundle_id == earlier.bundle_id


@pytest.mark.parametrize(("names", "said"), [(["model.gguf"], "only the file 'model.gguf',"),
                                             (["model.gguf", "tokenizer.json"],
                                              "only the files 'model.gguf', 'tokenizer.json',")])
def test_an_archive_of_files_alone_is_said_to_hold_no_bundle_directory(tmp_path, names, said):
    """As 'tar -cf m.tar model.gguf' writes it: there is no bundle directory for the file to lie beside."""
    archive = tmp_path / "m.tar"
    with tarfile.open(archive, "w") as tar:
        for name in names:
            (tmp_path / name).write_text("data\n")
            tar.add(tmp_path / name, arcname=name)
    with pytest.raises(BundleError, match="holds no bundle directory") as caught:
        unpack_bundle(archive, tmp_path / "out")
    assert said in caught.value.problem
    assert "beside" not in caught.value.problem
    assert "tar -C PARENT -cf ARCHIVE NAME" in caught.value.fix
    assert not (tmp_path / "out").exists()
