"""The Python API's engine build refuses what 'edgesdk engine build' refuses: a verified bundle without
graph.max_context (verification takes one; deploy and pack need none) was a KeyError in profile_shapes, not the
refusal that names the field and the fix. And a bundle whose staging directory cannot be made (a file where a
directory above it must be, a directory not writable, a full disk) is refused by name, not an OSError traceback.

TensorRT is not installed here: the build runs against tests/unit/test_trt48.py's stand-in of TensorRT 10's build API;
everything around it is the product's own code."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest

from edgesdk.bundle import BundleWriter, verify_bundle
from edgesdk.errors import BundleError
from edgesdk.runtime import tensorrt_engine as te
from tests.unit.test_bundle57 import rewrite_manifest
from tests.unit.test_trt48 import standard_bundle, tensorrt  # noqa: F401 - fixtures: the bundle, the stand-in


def test_build_engine_refuses_a_bundle_without_max_context_by_name(standard_bundle, tensorrt, tmp_path):  # noqa: F811
    path = Path(shutil.copytree(standard_bundle.path, tmp_path / "bundle"))
    rewrite_manifest(path, lambda manifest: manifest["graph"].pop("max_context"))
    verify_bundle(path)  # deploy and pack need no max_context
    with pytest.raises(BundleError) as caught:
        te.build_engine(path, out=tmp_path / "engine")
    assert "'graph.max_context' must be a whole number" in caught.value.problem
    assert "edgesdk build" in caught.value.fix
    assert tensorrt.builds == 0
    assert not (tmp_path / "engine").exists()


def test_build_engine_still_builds_a_runnable_bundle(standard_bundle, tensorrt, tmp_path):  # noqa: F811
    info = te.build_engine(standard_bundle.path, out=tmp_path / "engine")
    assert tensorrt.builds == 1
    assert Path(info["path"]).read_bytes() == b"engine 1"


@pytest.mark.parametrize(("terms", "option"), [("cli", "--out"), ("python", "out")])
def test_a_bundle_under_a_file_is_refused_by_name(tmp_path, terms, option):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    destination = blocked / "deeper" / "bundle"
    with pytest.raises(BundleError) as caught:
        BundleWriter(destination, terms)
    assert caught.value.problem == (f"the bundle {destination} cannot be written: {blocked} is a file, so no "
                                    "directory can be made under it")
    assert caught.value.fix.startswith(f"pass {option} a path whose parent is a directory")
    assert blocked.read_text() == "not a directory"


@pytest.mark.parametrize(("code", "said", "fix"), [
    (errno.ENOSPC, "the disk of {parent} is full", "free space there, or pass --out a path on another disk"),
    (errno.EACCES, "its staging directory {staging} cannot be made (Permission denied)",
     "pass --out a path in a directory you may write, or make {parent} writable"),
])
def test_a_staging_directory_the_system_refuses_is_named(tmp_path, monkeypatch, code, said, fix):
    """The operating system's refusal, which a test cannot cause for every uid (root writes any directory): mkdir
    raises what it raises on a full disk or a directory not writable."""
    import os

    def refused(self, *args, **kwargs):
        raise OSError(code, os.strerror(code), str(self))

    monkeypatch.setattr(Path, "mkdir", refused)
    destination = tmp_path / "bundle"
    with pytest.raises(BundleError) as caught:
        BundleWriter(destination)
    staging = tmp_path / ".bundle.partial"
    assert caught.value.problem == (f"the bundle {destination} cannot be written: "
                                    + said.format(parent=tmp_path, staging=staging))
    assert caught.value.fix == fix.format(parent=tmp_path)
