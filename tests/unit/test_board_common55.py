"""Review 55 of board_common: the board's bundle check (verify_dir) refuses what the host's verify_bundle refuses
in the manifest records it reads ('files' and 'graph.weights'), naming the record, instead of crashing, passing a
release the host refuses or removing an intact file; the deploy lock tells a file system that cannot lock from a
deploy that holds it."""

from __future__ import annotations

import errno
import hashlib
import json
import os

import pytest

from edgesdk.bundle import BundleError, BundleWriter, verify_bundle
from edgesdk.deploy.board_common import DIGEST, MANIFEST, Lock, Refused, verify_dir
from edgesdk.deploy.board_ops import op_commit

WEIGHTS = {"file": "model.onnx.data.zlib", "codec": "zlib", "external_name": "model.onnx.data", "bytes": 6,
           "sha256": hashlib.sha256(b"weight").hexdigest()}


def write_bundle(destination) -> str:
    """A bundle the host's verify_bundle accepts, written by BundleWriter. Returns its directory."""
    writer = BundleWriter(destination)
    writer.write_text("model.onnx", "graph")
    writer.write_text("model.onnx.data.zlib", "packed")
    writer.write_text("tokenizer.json", "{}")
    writer.commit({"target": {"name": "host"}, "model": {}, "tokenizer": {"file": "tokenizer.json"},
                   "graph": {"file": "model.onnx", "weights": dict(WEIGHTS)},
                   "runtime": {"backend": "onnxruntime", "fallbacks": [], "threads": 1}, "stages": []})
    return str(destination)


def rewrite_manifest(folder, change=None, raw=None) -> str:
    """The bundle's manifest changed by ``change`` (or replaced by ``raw``), with its digest made to match, as a
    hand edit on the board would. Returns the new manifest's sha256."""
    if raw is None:
        with open(os.path.join(folder, MANIFEST), "rb") as handle:
            manifest = json.loads(handle.read())
        change(manifest)
        raw = json.dumps(manifest).encode()
    with open(os.path.join(folder, MANIFEST), "wb") as handle:
        handle.write(raw)
    digest = hashlib.sha256(raw).hexdigest()
    with open(os.path.join(folder, DIGEST), "w") as handle:
        handle.write(digest + "\n")
    return digest


def upper_sha(manifest):
    manifest["files"]["tokenizer.json"]["sha256"] = manifest["files"]["tokenizer.json"]["sha256"].upper()


def no_size(manifest):
    del manifest["files"]["model.onnx"]["size"]


def record_not_a_mapping(manifest):
    manifest["files"]["model.onnx"] = "5 bytes"


def files_a_list(manifest):
    manifest["files"] = sorted(manifest["files"])


def weights_sha_upper(manifest):
    manifest["graph"]["weights"]["sha256"] = WEIGHTS["sha256"].upper()


def weights_codec_none(manifest):
    manifest["graph"]["weights"]["codec"] = "none"


def weights_external_path(manifest):
    manifest["graph"]["weights"]["external_name"] = "../../model.onnx.data"


def weights_bytes_negative(manifest):
    manifest["graph"]["weights"]["bytes"] = -1


def weights_without_codec(manifest):
    del manifest["graph"]["weights"]["codec"]


CASES = {
    upper_sha: "files['tokenizer.json'] must be {size: int, sha256: str}",
    no_size: "files['model.onnx'] must be {size: int, sha256: str}",
    record_not_a_mapping: "files['model.onnx'] must be {size: int, sha256: str}",
    files_a_list: "'files' must map file names to {size, sha256}, got list",
    weights_sha_upper: "'graph.weights.sha256' must be 64 lowercase hex digits",
    weights_codec_none: "'graph.weights.codec' is 'none'",
    weights_external_path: "'graph.weights.external_name' must be a bare file name",
    weights_bytes_negative: "'graph.weights.bytes' must be a whole number >= 0",
    weights_without_codec: "'graph.weights' must be a mapping with file, codec",
}


@pytest.mark.parametrize("change", list(CASES), ids=[change.__name__ for change in CASES])
def test_the_board_refuses_each_manifest_record_the_host_refuses_and_names_it(tmp_path, change):
    bundle = write_bundle(tmp_path / "b")
    assert verify_dir(bundle) == ([], [])
    rewrite_manifest(bundle, change)
    with pytest.raises(BundleError, match="is malformed"):
        verify_bundle(bundle)  # the host refuses it: so must the board, before it switches to it
    problems, bad = verify_dir(bundle)
    assert len(problems) == 1
    assert problems[0].startswith(f"{MANIFEST}: ")
    assert CASES[change] in problems[0]
    assert bad == [MANIFEST, DIGEST]


def test_a_size_of_true_is_no_byte_count_on_the_board_either(tmp_path):
    writer = BundleWriter(tmp_path / "b")
    writer.write_text("model.onnx", "g")  # one byte: true == 1 compared as it is
    writer.commit({"target": {"name": "host"}, "model": {}, "tokenizer": {"file": "model.onnx"},
                   "graph": {"file": "model.onnx"},
                   "runtime": {"backend": "onnxruntime", "fallbacks": [], "threads": 1}, "stages": []})
    bundle = str(tmp_path / "b")
    rewrite_manifest(bundle, lambda manifest: manifest["files"]["model.onnx"].update(size=True))
    with pytest.raises(BundleError, match="is malformed"):
        verify_bundle(bundle)
    problems, _bad = verify_dir(bundle)
    assert len(problems) == 1
    assert problems[0].startswith(f"{MANIFEST}: files['model.onnx'] must be {{size: int, sha256: str}}: the size a "
                                  "whole number of bytes >= 0")
    assert "'size': True" in problems[0]


def test_a_key_given_twice_is_refused_as_the_host_refuses_it(tmp_path):
    bundle = write_bundle(tmp_path / "b")
    with open(os.path.join(bundle, MANIFEST), "rb") as handle:
        raw = handle.read()
    # a first "files" that lists a file the bundle lacks: json keeps the last, which lists what is there
    doubled = raw.replace(b"{", b'{"files": {"gone.bin": {"size": 1, "sha256": "' + b"0" * 64 + b'"}}, ', 1)
    rewrite_manifest(bundle, raw=doubled)
    with pytest.raises(BundleError, match="more than once"):
        verify_bundle(bundle)
    assert verify_dir(bundle)[0] == [f"{MANIFEST} gives the key 'files' more than once in one object, so readers "
                                     "could take either value"]


def test_a_deeply_nested_manifest_is_no_bundle_manifest_not_a_crash(tmp_path):
    bundle = write_bundle(tmp_path / "b")
    rewrite_manifest(bundle, raw=b"[" * 100_000 + b"]" * 100_000)
    assert verify_dir(bundle) == ([f"{MANIFEST} is not a bundle manifest"], [MANIFEST, DIGEST])


def test_commit_keeps_an_intact_file_whose_sha256_the_manifest_gives_in_capitals(tmp_path):
    root = tmp_path / "deploy"
    staging = root / "staging" / "bundle-1"
    os.makedirs(root / "staging")
    write_bundle(staging)
    manifest_sha = rewrite_manifest(str(staging), upper_sha)
    result = op_commit({"root": str(root), "bundle_id": "bundle-1", "manifest_sha256": manifest_sha})
    assert len(result["problems"]) == 1
    assert "files['tokenizer.json'] must be" in result["problems"][0]
    assert (staging / "tokenizer.json").read_text() == "{}"  # named as corrupted, it was removed and sent again
    assert not (root / "releases" / "bundle-1").exists()


def test_a_file_system_that_cannot_lock_is_named_not_blamed_on_another_deploy(tmp_path, monkeypatch):
    def no_locks(handle, operation):  # what flock(2) returns on an NFS mount without lockd
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    import fcntl

    monkeypatch.setattr(fcntl, "flock", no_locks)  # the module the lock imports when it takes it
    with pytest.raises(Refused) as refused:
        Lock(str(tmp_path / "root"), timeout=0)
    assert "another deploy" not in refused.value.problem
    assert f"cannot lock {tmp_path / 'root' / '.deploy.lock'} ({os.strerror(errno.ENOLCK)})" in refused.value.problem
    assert "local disk" in refused.value.fix


def test_a_lock_another_deploy_holds_is_still_named_as_held(tmp_path):
    with Lock(str(tmp_path / "root")):
        with pytest.raises(Refused, match="another deploy holds"):
            Lock(str(tmp_path / "root"), timeout=0)
