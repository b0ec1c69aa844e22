"""The board's verify_dir reports a listed file it cannot read, and one that is no regular file, as problems
naming the file and what it is (as the host's verify_bundle does), so probe and commit go on and a deploy can
repair that release."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os

import pytest

from edgesdk.deploy.board_common import DIGEST, MANIFEST, verify_dir
from edgesdk.deploy.board_ops import op_commit

FILES = {"model.onnx": b"weights" * 10, "tokenizer.json": b'{"vocab": {}}', "config.json": b"{}"}


def write_bundle(folder, files=FILES) -> str:
    """A bundle directory as the builder writes it: the files, manifest.json and its sha256. Returns that sha256."""
    os.makedirs(folder)
    for name, data in files.items():
        with open(os.path.join(folder, name), "wb") as handle:
            handle.write(data)
    listed = {name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()}
    raw = json.dumps({"files": listed}).encode()
    with open(os.path.join(folder, MANIFEST), "wb") as handle:
        handle.write(raw)
    digest = hashlib.sha256(raw).hexdigest()
    with open(os.path.join(folder, DIGEST), "w") as handle:
        handle.write(digest + "\n")
    return digest


def replace_with(folder, name, make) -> None:
    """The listed file ``name`` in ``folder`` replaced by what ``make`` creates at its path (a directory, a FIFO)."""
    os.unlink(os.path.join(folder, name))
    make(os.path.join(folder, name))


@contextlib.contextmanager
def as_a_user_without_read_permission():
    """Run the block as a user that permissions apply to: root (CI) reads any file, so it runs as nobody."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


def test_a_directory_at_a_listed_name_is_named_as_one_not_missing(tmp_path):
    bundle = str(tmp_path / "b")
    write_bundle(bundle)
    replace_with(bundle, "model.onnx", os.mkdir)
    problems, bad = verify_dir(bundle)
    assert problems == ["model.onnx: a directory, not a file"]
    assert bad == ["model.onnx"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_fifo_at_a_listed_name_is_a_problem_and_not_opened(tmp_path):
    bundle = str(tmp_path / "b")
    write_bundle(bundle)
    replace_with(bundle, "tokenizer.json", os.mkfifo)
    problems, bad = verify_dir(bundle)  # a read of the FIFO would wait for a writer forever
    assert problems == ["tokenizer.json: not a regular file (a link to nothing, a device or a pipe)"]
    assert bad == ["tokenizer.json"]


def test_a_missing_file_is_still_missing_and_nothing_to_remove(tmp_path):
    bundle = str(tmp_path / "b")
    write_bundle(bundle)
    os.unlink(os.path.join(bundle, "config.json"))
    assert verify_dir(bundle) == (["config.json: missing"], [])


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="file permissions are POSIX")
def test_a_listed_file_that_cannot_be_read_is_a_problem_not_an_error(tmp_path, monkeypatch):
    parent = tmp_path / "open"
    parent.mkdir()
    bundle = str(parent / "b")
    write_bundle(bundle)
    os.chmod(os.path.join(bundle, "model.onnx"), 0)
    for folder in (tmp_path, parent, bundle):
        os.chmod(folder, 0o755)
    monkeypatch.chdir(tmp_path)  # a relative path: the folders above tmp_path (its user's only) need not be walked
    with as_a_user_without_read_permission():
        problems, bad = verify_dir(os.path.join("open", "b"))
    assert problems == ["model.onnx: cannot be read (Permission denied)"]
    assert bad == ["model.onnx"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_commit_of_a_staging_with_a_fifo_reports_it_and_removes_it_for_the_next_deploy(tmp_path):
    root = tmp_path / "deploy"
    staging = str(root / "staging" / "bundle-1")
    os.makedirs(root / "staging")
    manifest_sha = write_bundle(staging)
    replace_with(staging, "tokenizer.json", os.mkfifo)
    result = op_commit({"root": str(root), "bundle_id": "bundle-1", "manifest_sha256": manifest_sha})
    assert result == {"problems": ["tokenizer.json: not a regular file (a link to nothing, a device or a pipe)"]}
    assert not os.path.lexists(os.path.join(staging, "tokenizer.json"))
    assert not (root / "releases" / "bundle-1").exists()
