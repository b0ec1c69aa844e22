"""Bundle integrity: the refusals of a bundle that is not as 'edgesdk build' wrote it name the thing and a fix that
works: a file of a bundle passed for the bundle is told to pass its directory (not to unpack it as an archive), and
a bundle whose listed files are intact but which holds files its manifest does not list is told to move those out
(rebuilding is needless, and re-copying the bundle over the directory leaves them there; a stray folder is moved
whole), a runtime chain of only backends this edgesdk lacks is told which edgesdk to install (the release the
manifest names) or which backends this one has, and a schema version below 1 is named malformed."""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil

import pytest

from edgesdk.bundle import MANIFEST, MANIFEST_DIGEST, BundleWriter, verify_bundle
from edgesdk.errors import BundleError
from edgesdk.runtime.session import open_runtime

# The keys a caller of BundleWriter.commit gives; report.md stands in for the files the runtime opens.
MINIMAL_MANIFEST = {"target": {"name": "host"}, "model": {}, "graph": {"file": "report.md"},
                    "tokenizer": {"file": "report.md"}, "runtime": {"backend": "ort-cpu", "fallbacks": [], "threads": 1},
                    "stages": []}


@pytest.fixture
def bundle(tmp_path):
    writer = BundleWriter(tmp_path / "bundle")
    writer.write_text("report.md", "# report\n")
    writer.write_text("model.onnx", "graph bytes")
    return writer.commit(MINIMAL_MANIFEST)


@pytest.mark.parametrize("name", ["model.onnx", "report.md"])
@pytest.mark.parametrize("entry", ["verify_bundle", "open_runtime"])
def test_a_file_of_a_bundle_passed_for_it_is_told_to_pass_its_directory(bundle, name, entry):
    """``edgesdk run bundle/model.onnx`` (llama.cpp's -m takes the model file) was told 'if it is an archive made by
    edgesdk pack, unpack it first: edgesdk unpack bundle/model.onnx DIR', which fails on a graph."""
    check = verify_bundle if entry == "verify_bundle" else lambda path: open_runtime(path, threads=1)
    with pytest.raises(BundleError, match=f"is a file, not a bundle directory: the {name} of a bundle") as caught:
        check(bundle.path / name)
    assert caught.value.fix == f"pass the directory that holds it: {bundle.path}"


def test_a_file_outside_any_bundle_may_still_be_an_archive(bundle, tmp_path):
    loose = tmp_path / "bundle.tar"
    shutil.copyfile(bundle.path / "report.md", loose)
    with pytest.raises(BundleError, match="is a file, not a bundle directory") as caught:
        verify_bundle(loose)
    assert f"edgesdk unpack {loose} DIR" in caught.value.fix


def test_files_added_to_an_intact_bundle_are_named_in_the_fix(bundle):
    """The fix was 'rebuild the bundle, or re-copy it': a copy made over the directory (cp -r, scp -r) leaves the
    added files there, and the refusal stays."""
    (bundle.path / "notes.txt").write_text("mine")
    (bundle.path / "it's").mkdir()
    (bundle.path / "it's" / "a.txt").write_text("mine too")
    with pytest.raises(BundleError, match="notes.txt: not listed in the manifest") as caught:
        verify_bundle(bundle.path)
    fix = caught.value.fix
    assert fix.startswith("move what the manifest does not list out of the bundle")
    assert shlex.split(fix.split(": mv ", 1)[1]) == [str(bundle.path / "it's"), str(bundle.path / "notes.txt"), "DIR"]
    assert "rebuild" not in fix
    _carry_out(fix, bundle.path.parent / "moved")  # the fix, done, leaves the bundle valid
    assert verify_bundle(bundle.path).bundle_id == bundle.bundle_id


def _carry_out(fix: str, directory) -> None:
    """Do the fix's ``mv SOURCE... DIR`` as mv does: each source moved into ``directory``, none over another."""
    *sources, last = shlex.split(fix.split(": mv ", 1)[1])
    assert last == "DIR"
    directory.mkdir()
    for source in sources:
        shutil.move(source, directory)  # refuses a second source of the same name, as GNU mv does


def test_a_stray_folder_is_moved_whole_not_file_by_file(tmp_path):
    """A folder an older bundle left (``old/a/config.json``, ``old/b/config.json``) was to be moved file by file:
    ``mv B/old/a/config.json B/old/b/config.json DIR``, which mv refuses at the second config.json and which would
    flatten the tree. A stray file in a folder that holds listed files is still moved alone."""
    writer = BundleWriter(tmp_path / "bundle")
    writer.write_text("report.md", "# report\n")
    writer.write_text("kernels/index.json", "{}")
    bundle = writer.commit(MINIMAL_MANIFEST)
    for stray in ("old/a/config.json", "old/b/config.json", "kernels/notes.txt"):
        (bundle.path / stray).parent.mkdir(parents=True, exist_ok=True)
        (bundle.path / stray).write_text("{}")
    with pytest.raises(BundleError, match="old/b/config.json: not listed in the manifest") as caught:
        verify_bundle(bundle.path)
    fix = caught.value.fix
    assert shlex.split(fix.split(": mv ", 1)[1]) == [str(bundle.path / "kernels" / "notes.txt"),
                                                     str(bundle.path / "old"), "DIR"]
    _carry_out(fix, tmp_path / "moved")
    assert verify_bundle(bundle.path).bundle_id == bundle.bundle_id
    assert (tmp_path / "moved" / "old" / "b" / "config.json").is_file()


def test_many_added_files_are_counted_not_all_listed_in_the_fix(bundle):
    for index in range(5):
        (bundle.path / f"extra{index}.txt").write_text("x")
    with pytest.raises(BundleError) as caught:
        verify_bundle(bundle.path)
    assert "extra2.txt" in caught.value.fix
    assert "extra3.txt" not in caught.value.fix
    assert caught.value.fix.endswith(" DIR, and the 2 more listed above")


def test_an_added_file_beside_a_damaged_one_keeps_the_rebuild_fix(bundle):
    """Moving the added file out would not make the bundle whole: its own file is damaged."""
    (bundle.path / "notes.txt").write_text("mine")
    (bundle.path / "model.onnx").write_text("graph byteZ")
    with pytest.raises(BundleError, match="model.onnx: sha256 differs") as caught:
        verify_bundle(bundle.path)
    assert caught.value.fix.startswith("rebuild the bundle with 'edgesdk build'")


def test_a_linked_directory_the_listed_files_are_read_through_keeps_the_rebuild_fix(tmp_path):
    """Moving the link out, as the fix for added files says, would take the listed files with it."""
    writer = BundleWriter(tmp_path / "bundle")
    writer.write_text("report.md", "# report\n")
    writer.write_text("kernels/index.json", "{}")
    bundle = writer.commit(MINIMAL_MANIFEST)
    (bundle.path / "kernels").rename(tmp_path / "kernels")
    (bundle.path / "kernels").symlink_to(tmp_path / "kernels")
    with pytest.raises(BundleError, match=r"kernels: not listed in the manifest \(a link to a directory\)") as caught:
        verify_bundle(bundle.path)
    assert caught.value.fix.startswith("rebuild the bundle with 'edgesdk build'")


@pytest.mark.parametrize("built_by", [None, "9.0.0"])
@pytest.mark.parametrize("chain", [["ort-npu"], ["ort-npu", "ort-qnn"]])
def test_a_chain_of_backends_this_edgesdk_lacks_gives_a_fix_that_reads(bundle, chain, built_by):
    """A bundle whose runtime names only backends this edgesdk does not have (a newer release's) was refused with
    the fix "or pass --backend ort-cpu ...": an 'or' with nothing before it, and no word of the edgesdk to install.
    The release to install is the one the manifest names (pip install -U installs the newest, not that one); a
    bundle this very release built names a backend no such release has: the fix names the backends it has."""
    from edgesdk import __version__
    from edgesdk.errors import RuntimeBackendError
    from edgesdk.runtime.session import NOT_BUILT, OPENERS, open_backend

    if built_by is not None:
        rewrite_manifest(bundle.path, lambda manifest: manifest.update(edgesdk_version=built_by))
        bundle = verify_bundle(bundle.path)
    with pytest.raises(RuntimeBackendError, match=f"{chain[0]}: {NOT_BUILT}") as caught:
        open_backend(bundle, chain, threads=1)
    fix = caught.value.fix
    assert not fix.startswith("or ")
    assert "-U" not in fix
    todo = (f"install the edgesdk release that built the bundle (pip install edgesdk=={built_by})" if built_by else
            f"edgesdk {__version__} knows no backend of that name, and the manifest names no other release to "
            f"install; its backends are {', '.join(OPENERS)}")
    for name in chain:
        assert f"{name}: the bundle's runtime names it, and this edgesdk has no such backend: {todo}" in fix
    assert fix.endswith("; or pass --backend ort-cpu")  # onnxruntime is installed here: nothing to install


def test_the_cpu_way_out_names_onnxruntime_to_install_only_where_it_is_missing(monkeypatch):
    """The fix sent a user whose onnxruntime loads to install it; it is named only where it cannot be found."""
    import importlib.util

    from edgesdk.runtime.session import _install_hint

    assert _install_hint(["tensorrt"]).endswith("; or pass --backend ort-cpu")
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else found(name, *a))
    assert _install_hint(["tensorrt"]).endswith("; or pass --backend ort-cpu (needs onnxruntime: pip install edgesdk)")


def rewrite_manifest(path, change) -> None:
    """Apply ``change`` to the manifest and rewrite manifest.sha256 to match, as a hand edit would."""
    manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    change(manifest)
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (path / MANIFEST).write_text(text, encoding="utf-8")
    (path / MANIFEST_DIGEST).write_text(hashlib.sha256(text.encode()).hexdigest() + "\n")


@pytest.mark.parametrize("version", [0, -1])
def test_a_schema_version_below_one_is_named_malformed_not_another_edgesdk_s(bundle, version):
    """Schema versions count from 1: a 0 or a negative one was refused with 'install the edgesdk that built it',
    which no edgesdk did."""
    rewrite_manifest(bundle.path, lambda manifest: manifest.update(schema_version=version, edgesdk_version="0.0.9"))
    with pytest.raises(BundleError, match=f"has manifest schema version {version}, which no edgesdk wrote") as caught:
        verify_bundle(bundle.path)
    assert caught.value.fix == "the manifest was edited by hand or damaged; rebuild the bundle with 'edgesdk build'"


def test_a_newer_schema_version_still_names_the_edgesdk_that_built_it(bundle):
    rewrite_manifest(bundle.path, lambda manifest: manifest.update(schema_version=99, edgesdk_version="9.0.0"))
    with pytest.raises(BundleError, match="has manifest schema version 99; this edgesdk") as caught:
        verify_bundle(bundle.path)
    assert caught.value.fix.endswith("install the edgesdk that built it (edgesdk 9.0.0)")
