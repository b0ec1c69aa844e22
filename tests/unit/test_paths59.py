"""Paths refused by name rather than a traceback or a wrong message: $EDGESDK_CACHE starting with ``~/`` where the
home directory cannot be found (it was named the home directory of a user '' this machine lacks), a directory above
the output or the model that may not be searched (Path.exists()/is_dir() raise PermissionError there before Python
3.13), and a weights file linked out of the graph's directory, refused only where the installed ONNX Runtime (1.30
on) refuses it."""

from __future__ import annotations

import errno
import os
import pwd
import shutil
import sys
from pathlib import Path

import pytest

from edgesdk.bundle import BundleWriter, check_runnable, verify_bundle
from edgesdk.errors import BundleError, ModelSourceError
from edgesdk.models.sources import cache_dir, resolve_model


@pytest.fixture
def homeless(monkeypatch):
    """No $HOME, and a uid the password database lacks (a container run with --user): posixpath.expanduser then
    leaves ``~`` as it is, and pathlib raises RuntimeError("Could not determine home directory.")."""
    monkeypatch.delenv("HOME", raising=False)

    def no_entry(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    with pytest.raises(RuntimeError):
        Path("~").expanduser()


@pytest.mark.parametrize("setting", ["~/cache", "~//cache", "~"])
def test_a_cache_under_a_home_that_cannot_be_found_is_named_so(homeless, monkeypatch, setting):
    monkeypatch.setenv("EDGESDK_CACHE", setting)
    with pytest.raises(ModelSourceError) as caught:
        cache_dir()
    error = caught.value
    assert f"$EDGESDK_CACHE is '{setting}'" in error.problem
    assert "home directory cannot be found ($HOME is not set" in error.problem
    assert "a user ''" not in error.problem
    assert "set HOME" in error.fix
    assert "EDGESDK_CACHE=/var/tmp/edgesdk" in error.fix
    assert "EDGESDK_CACHE=~/" not in error.fix  # the fix that failed the same way


def test_a_cache_under_an_unknown_user_still_names_the_user(homeless, monkeypatch):
    monkeypatch.setenv("EDGESDK_CACHE", "~nosuchuser59/cache")
    with pytest.raises(ModelSourceError) as caught:
        cache_dir()
    assert "a user 'nosuchuser59' this machine does not have" in caught.value.problem


@pytest.fixture
def unsearchable(monkeypatch):
    """Make Path.stat refuse every path strictly inside a directory, as the kernel does (EACCES) for a user who may
    not search it (root may search every directory, so the refusal is made here)."""
    real_stat = Path.stat

    def refuse_inside(directory: Path):
        def stat(self, *args, **kwargs):
            if directory in self.absolute().parents:
                raise PermissionError(errno.EACCES, "Permission denied", str(self))
            return real_stat(self, *args, **kwargs)

        monkeypatch.setattr(Path, "stat", stat)  # Path.lstat, exists, is_dir, is_symlink and is_file call it

    return refuse_inside


def test_a_bundle_under_a_directory_that_may_not_be_searched_is_refused_by_name(tmp_path, unsearchable):
    locked = tmp_path / "locked"
    locked.mkdir()
    unsearchable(locked)
    destination = locked / "sub" / "bundle"
    with pytest.raises(BundleError) as caught:
        BundleWriter(destination, terms="cli")
    error = caught.value
    assert f"the bundle {destination} cannot be written" in error.problem
    assert "Permission denied" in error.problem
    assert "--out" in error.fix
    assert not os.path.exists(locked / "sub")


def test_an_output_path_that_cannot_be_looked_at_is_refused_by_name(tmp_path, unsearchable):
    from edgesdk.bundle import check_replaceable

    locked = tmp_path / "locked"
    locked.mkdir()
    unsearchable(locked)
    with pytest.raises(BundleError) as caught:
        check_replaceable(locked / "bundle", terms="python")
    assert f"the output path {locked / 'bundle'} cannot be looked at (Permission denied)" in caught.value.problem
    assert "pass out a path" in caught.value.fix


def test_an_unknown_model_beside_a_cache_that_may_not_be_searched_stays_unknown(tmp_path, unsearchable):
    """A .cache another user made 0700 in a directory above the model: 'hf download --local-dir' could not have
    written there, so the model is unknown, as where no .cache is."""
    (tmp_path / ".cache" / "huggingface" / "download").mkdir(parents=True)
    unsearchable(tmp_path / ".cache")
    with pytest.raises(ModelSourceError) as caught:
        resolve_model(str(tmp_path / "models" / "missing.gguf"), fetch=False)
    assert "unknown model" in caught.value.problem


def _linked_out(tiny_bundle, tmp_path: Path):
    path = Path(shutil.copytree(tiny_bundle.path, tmp_path / "bundle"))
    outside = tmp_path / "shared" / "weights.data"
    outside.parent.mkdir()
    shutil.move(path / "model.onnx.data", outside)
    (path / "model.onnx.data").symlink_to(outside)
    return verify_bundle(path)


@pytest.mark.parametrize("version", ["1.30.0", "1.32.1", "2.0.0"])
def test_weights_linked_out_are_refused_where_onnx_runtime_refuses_them(tiny_bundle, tmp_path, monkeypatch,
                                                                         version):
    import onnxruntime

    bundle = _linked_out(tiny_bundle, tmp_path)
    monkeypatch.setattr(onnxruntime, "__version__", version)
    with pytest.raises(BundleError) as caught:
        check_runnable(bundle)
    assert "model.onnx.data is a link to" in caught.value.problem


@pytest.mark.parametrize("version", ["1.18.0", "1.29.9", "1.16.3"])
def test_weights_linked_out_run_where_onnx_runtime_reads_them(tiny_bundle, tmp_path, monkeypatch, version):
    """ONNX Runtime before 1.30 (pyproject takes 1.18 on; a board's wheel is often older) reads the link."""
    import onnxruntime

    bundle = _linked_out(tiny_bundle, tmp_path)
    monkeypatch.setattr(onnxruntime, "__version__", version)
    check_runnable(bundle)


def test_weights_linked_out_are_not_refused_without_onnx_runtime(tiny_bundle, tmp_path, monkeypatch):
    """The tensorrt backend reads no weights through ONNX Runtime, which a board may lack."""
    bundle = _linked_out(tiny_bundle, tmp_path)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime raises ImportError
    check_runnable(bundle)
