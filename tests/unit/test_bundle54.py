"""The bundle format and the API checks (edgesdk.bundle, edgesdk.api_checks): a file record whose size or sha256
is of the wrong form is named as such (not the intact file as corrupted), a manifest with no readable schema
version is named as malformed (not as one of another edgesdk's), a left-over staging path that is no directory
does not stop a write, and perplexity's and detokenize's refusals show the value and a fix of their own. Each test
writes its own small bundle with BundleWriter."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from edgesdk import __version__
from edgesdk.api import RequestError
from edgesdk.api_checks import check_perplexity_arguments, detokenize_ids
from edgesdk.bundle import MANIFEST, MANIFEST_DIGEST, BundleWriter, verify_bundle
from edgesdk.errors import BundleError

# The keys a caller of BundleWriter.commit gives; report.md stands in for the files the runtime opens.
MINIMAL_MANIFEST = {"target": {"name": "host"}, "model": {}, "graph": {"file": "report.md"},
                    "tokenizer": {"file": "report.md"}, "runtime": {"backend": "ort-cpu", "fallbacks": [], "threads": 1},
                    "stages": []}
GENERIC_HTTP_FIX = "OpenAI's request bodies"  # RequestError's fix when none is given


def write_bundle(path: Path, report: str = "a small bundle\n") -> Path:
    writer = BundleWriter(path)
    writer.write_text("report.md", report)
    return writer.commit(dict(MINIMAL_MANIFEST)).path


def rewrite_manifest(path: Path, text: str) -> None:
    """Replace manifest.json with ``text`` and manifest.sha256 to match, so only the content checks can fire."""
    (path / MANIFEST).write_text(text, encoding="utf-8")
    (path / MANIFEST_DIGEST).write_text(hashlib.sha256(text.encode()).hexdigest() + "\n", encoding="utf-8")


def edit_manifest(path: Path, change) -> None:
    manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    change(manifest)
    rewrite_manifest(path, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def refusal(path: Path) -> BundleError:
    with pytest.raises(BundleError) as caught:
        verify_bundle(path)
    return caught.value


def test_a_size_of_true_is_refused_as_a_malformed_record(tmp_path):
    """JSON's true is a Python bool, an int: a one-byte file listed with size true passed verification."""
    bundle = write_bundle(tmp_path / "b", report="x")
    edit_manifest(bundle, lambda m: m["files"]["report.md"].update(size=True))
    error = refusal(bundle)
    assert "files['report.md'] must be {size: int, sha256: str}" in error.problem
    assert "'size': True" in error.problem
    assert "the size a whole number of bytes >= 0" in error.problem


@pytest.mark.parametrize("change", [
    lambda record: record.update(sha256=record["sha256"].upper()),  # PowerShell's Get-FileHash writes capitals
    lambda record: record.update(sha256=record["sha256"][:40]),  # a sha1's length
    lambda record: record.update(size=-1),
], ids=["sha256-capitals", "sha256-short", "size-negative"])
def test_a_record_of_the_wrong_form_names_the_record_not_the_intact_file(tmp_path, change):
    """The record was no sha256 (or no size) at all; verification said the file was corrupted or modified, and
    its fix was to rebuild or re-copy an intact file."""
    bundle = write_bundle(tmp_path / "b")
    edit_manifest(bundle, lambda m: change(m["files"]["report.md"]))
    error = refusal(bundle)
    assert f"bundle {bundle}: {MANIFEST} is malformed" in error.problem
    assert "files['report.md'] must be {size: int, sha256: str}" in error.problem
    assert "the sha256 64 lowercase hex digits" in error.problem
    assert "corrupted or modified" not in error.problem


def test_a_well_formed_record_still_verifies(tmp_path):
    bundle = write_bundle(tmp_path / "b", report="")  # size 0 is a whole number of bytes
    assert verify_bundle(bundle).manifest["files"]["report.md"]["size"] == 0


def test_a_manifest_without_a_schema_version_is_named_as_such(tmp_path):
    """It was refused as 'schema version None' with the fix 'install the edgesdk that built it (edgesdk <this
    one>)', which is the edgesdk already running."""
    bundle = write_bundle(tmp_path / "b")
    edit_manifest(bundle, lambda m: m.pop("schema_version"))
    error = refusal(bundle)
    assert f"bundle {bundle}: {MANIFEST} has no schema_version" in error.problem
    assert "reads versions 1, 2" in error.problem
    assert "install the edgesdk that built it" not in error.fix
    assert "rebuild the bundle with 'edgesdk build'" in error.fix


@pytest.mark.parametrize(("text", "kind"), [("[]\n", "list"), ('"bundle"\n', "str"), ("null\n", "NoneType")])
def test_a_manifest_that_is_no_json_object_is_named_as_such(tmp_path, text, kind):
    bundle = write_bundle(tmp_path / "b")
    rewrite_manifest(bundle, text)
    error = refusal(bundle)
    assert f"bundle {bundle}: {MANIFEST} holds a JSON {kind}, not the object" in error.problem
    assert "schema version None" not in error.problem
    assert "install the edgesdk that built it" not in error.fix


def test_a_schema_version_of_another_type_is_no_version(tmp_path):
    bundle = write_bundle(tmp_path / "b")
    edit_manifest(bundle, lambda m: m.update(schema_version="2"))
    error = refusal(bundle)
    assert "has manifest schema version '2', which is no whole number" in error.problem
    assert "install the edgesdk that built it" not in error.fix


def test_an_unknown_schema_written_by_this_edgesdk_s_version_does_not_offer_to_install_it(tmp_path):
    bundle = write_bundle(tmp_path / "b")
    edit_manifest(bundle, lambda m: m.update(schema_version=99, edgesdk_version=__version__))
    error = refusal(bundle)
    assert "has manifest schema version 99" in error.problem
    assert f"edgesdk {__version__})" not in error.fix
    assert "rebuild the bundle" in error.fix


def test_an_unknown_schema_of_another_edgesdk_still_names_it(tmp_path):
    bundle = write_bundle(tmp_path / "b")
    edit_manifest(bundle, lambda m: m.update(schema_version=99, edgesdk_version="9.1.0"))
    assert refusal(bundle).fix.endswith("install the edgesdk that built it (edgesdk 9.1.0)")


@pytest.mark.parametrize("leftover", ["dangling-link", "link-to-a-directory", "file"])
def test_a_left_over_staging_path_of_any_kind_is_replaced(tmp_path, leftover):
    """A dangling link at .NAME.partial failed the write with FileExistsError, a link to a directory with rmtree's
    OSError, a file with NotADirectoryError; a linked directory is never emptied."""
    staging = tmp_path / ".b.partial"
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "precious.txt").write_text("mine\n")
    if leftover == "dangling-link":
        os.symlink(tmp_path / "nowhere", staging)
    elif leftover == "link-to-a-directory":
        os.symlink(kept, staging)
    else:
        staging.write_text("left over\n")
    bundle = write_bundle(tmp_path / "b")
    assert verify_bundle(bundle).manifest["files"]["report.md"]["size"] == len("a small bundle\n")
    assert not os.path.lexists(staging)
    assert (kept / "precious.txt").read_text() == "mine\n"


def test_perplexity_text_of_another_type_is_shown_with_a_fix_of_its_own():
    with pytest.raises(RequestError) as caught:
        check_perplexity_arguments(12345, 512, 512, None)
    message = str(caught.value.problem)
    assert "expected the text to score (a string), got an int: 12345" in message
    assert "read_text()" in caught.value.fix
    assert GENERIC_HTTP_FIX not in caught.value.fix


def test_perplexity_context_is_shown_cut():
    long_text = "x" * 500
    with pytest.raises(RequestError) as caught:
        check_perplexity_arguments("text", long_text, long_text, None)
    assert long_text not in caught.value.problem
    assert "context is 'xxxx" in caught.value.problem


def test_detokenize_s_refusal_of_one_id_gives_its_own_fix():
    with pytest.raises(RequestError) as caught:
        detokenize_ids([1, -2])
    assert "tokens[1] is -2" in caught.value.problem
    assert "model.detokenize(model.tokenize(text))" in caught.value.fix
    assert GENERIC_HTTP_FIX not in caught.value.fix
