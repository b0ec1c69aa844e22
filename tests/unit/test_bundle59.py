"""A bundle refused before anything runs, by name and with its fix: a weights file linked out of the graph's directory
(verification took it, then ONNX Runtime refused it as the backend opened, its fix saying to run 'edgesdk verify',
which passed); and 'edgesdk engine build' given an archive (click's "Directory ... is a file." came before the
bundle's own refusal) or a verified bundle without graph.max_context (a KeyError traceback)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgesdk.bundle import verify_bundle
from edgesdk.cli import main
from edgesdk.errors import BundleError
from edgesdk.runtime.backend import close_backend
from tests.unit.test_bundle57 import rewrite_manifest


def _copy(bundle, where: Path) -> Path:
    return Path(shutil.copytree(bundle.path, where))


def _link_out(path: Path, name: str, outside: Path) -> Path:
    """Move ``name`` out of the bundle to ``outside`` and leave a link to it in its place."""
    outside.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(path / name, outside)
    (path / name).symlink_to(outside)
    return outside


def test_a_weights_file_linked_out_of_the_bundle_is_refused_before_the_backend_opens(tiny_bundle, tmp_path):
    from edgesdk.runtime.session import open_runtime

    path = _copy(tiny_bundle, tmp_path / "bundle")
    target = _link_out(path, "model.onnx.data", tmp_path / "shared" / "weights.data")
    verify_bundle(path)  # a listed file may be a link: pack stores the file it names
    with pytest.raises(BundleError) as caught:
        open_runtime(path, threads=1)
    error = caught.value
    assert f"model.onnx.data is a link to {target.resolve()}" in error.problem
    assert "outside the directory of its graph model.onnx" in error.problem
    assert "ONNXRuntimeError" not in error.problem
    assert error.fix.endswith(f"cp --remove-destination {shlex.quote(str(target.resolve()))} "
                              f"{shlex.quote(str(path / 'model.onnx.data'))}")
    subprocess.run(error.fix[error.fix.index("cp --remove-destination"):], shell=True, check=True)  # the fix, as given, makes it run
    assert not (path / "model.onnx.data").is_symlink()
    close_backend(open_runtime(path, threads=1).backend)


def test_links_onnx_runtime_reads_still_run(tiny_bundle, tmp_path):
    """A link to a file inside the bundle, a graph linked out beside its weights (the graph's own directory is where
    ONNX Runtime reads them), and a tokenizer linked out (read by edgesdk, not ONNX Runtime) all still run."""
    from edgesdk.runtime.session import open_runtime

    inside = _copy(tiny_bundle, tmp_path / "inside")
    (inside / "sub").mkdir()
    shutil.move(inside / "model.onnx.data", inside / "sub" / "weights.data")
    (inside / "model.onnx.data").symlink_to("sub/weights.data")
    rewrite_manifest(inside, lambda manifest: manifest["files"].__setitem__("sub/weights.data",
                                                                 manifest["files"]["model.onnx.data"]))
    together = _copy(tiny_bundle, tmp_path / "together")
    for name in ("model.onnx", "model.onnx.data"):
        _link_out(together, name, tmp_path / "elsewhere" / name)
    tokenizer = _copy(tiny_bundle, tmp_path / "tokenizer")
    _link_out(tokenizer, "tokenizer.json", tmp_path / "shared-tokenizer.json")
    for path in (inside, together, tokenizer):
        close_backend(open_runtime(path, threads=1).backend)


def test_engine_build_names_an_archive_as_run_does(tiny_bundle, tmp_path):
    archive = tmp_path / "bundle.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(tiny_bundle.path, arcname="bundle")
    result = CliRunner().invoke(main, ["engine", "build", str(archive)])
    assert result.exit_code != 0
    assert "is a file." not in result.output
    assert f"edgesdk unpack {archive} DIR" in result.output


def test_engine_build_refuses_a_bundle_without_max_context_by_name(tiny_bundle, tmp_path):
    path = _copy(tiny_bundle, tmp_path / "bundle")

    def standard_without_context(manifest) -> None:
        manifest["graph"]["form"] = "standard"
        del manifest["graph"]["max_context"]

    rewrite_manifest(path, standard_without_context)
    verify_bundle(path)  # deploy and pack need no max_context
    result = CliRunner().invoke(main, ["engine", "build", str(path)])
    assert not isinstance(result.exception, KeyError), result.output
    assert result.exit_code != 0
    assert "'graph.max_context' must be a whole number" in result.output
