"""Deploy's board side and fleets as a user meets them: the runtime install on a board whose Python already has a GPU
build of ONNX Runtime."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgesdk.deploy.remote import Board
from edgesdk.deploy.transport import LocalTransport


def _board_python() -> str:
    """The board's Python on JetPack 6 (Ubuntu 22.04: 3.10) where this machine has one that runs, else this one."""
    for candidate in (*sorted(Path.home().glob(".pyenv/versions/3.10*/bin/python3.10")), shutil.which("python3.10")):
        if candidate and subprocess.run([str(candidate), "-c", "import venv"], capture_output=True,
                                        timeout=60).returncode == 0:
            return str(candidate)
    return sys.executable


def _wheel(src: Path, out: Path, name: str, version: str, module: str, requires: list[str],
           extras: dict | None = None, script: str | None = None) -> None:
    """A real wheel built by pip from a one-module project (offline: this environment's setuptools)."""
    project = src / name
    (project / module).mkdir(parents=True)
    (project / module / "__init__.py").write_text(
        f"__version__ = {version!r}\nBUILD = {name!r}\n\n\ndef main():\n    print(__version__)\n")
    extra = "".join(f"{key} = {value!r}\n" for key, value in (extras or {}).items())
    scripts = f"[project.scripts]\n{script} = '{module}:main'\n" if script else ""
    (project / "pyproject.toml").write_text(
        "[build-system]\nrequires = ['setuptools']\nbuild-backend = 'setuptools.build_meta'\n\n"
        f"[project]\nname = {name!r}\nversion = {version!r}\ndependencies = {requires!r}\n\n"
        f"[project.optional-dependencies]\n{extra}\n{scripts}\n"
        f"[tool.setuptools]\npackages = [{module!r}]\n")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "-w", str(out), str(project)], check=True, capture_output=True, timeout=300)


@pytest.fixture
def offline_pip(tmp_path, monkeypatch):
    """pip on the 'board' reads no config and no index, only the wheels this test puts in its find-links folder."""
    for name in list(os.environ):
        if name.startswith("PIP_"):
            monkeypatch.delenv(name)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    return wheels


def test_a_runtime_seeing_the_boards_onnxruntime_gpu_does_not_get_the_cpu_build_over_it(tmp_path, offline_pip,
                                                                                         monkeypatch):
    """A Jetson's Python holds NVIDIA's onnxruntime-gpu (the Jetson Zoo / jetson-containers wheel), and deploy's
    runtime venv sees it (--runtime-venv-system-site-packages, the default on a Jetson, "pip then installs only
    what is missing"). pip matches requirements by distribution name, so 'pip install edgesdk.whl' took
    onnxruntime>=1.18 as missing: it installed the CPU onnxruntime into the venv, whose site-packages come first,
    and 'import onnxruntime' there had no CUDA or TensorRT provider (a board without a network failed the install
    instead, though the fix it printed had been followed). Other dependencies still install; extras do not."""
    src = tmp_path / "src"
    _wheel(src, offline_pip, "onnxruntime-gpu", "1.19.0", "onnxruntime", [])
    _wheel(src, offline_pip, "onnxruntime", "1.20.0", "onnxruntime", [])  # PyPI's CPU build, reachable
    _wheel(src, offline_pip, "tinydep", "1.0", "tinydep", [])
    sdk = tmp_path / "sdk"
    _wheel(src, sdk, "edgesdk", "0.1.0", "edgesdk", ["onnxruntime>=1.18,<1.33", "tinydep>=1.0"],
           extras={"host": ["torch>=2.1"]}, script="edgesdk")
    board_python = tmp_path / "board-python"  # the board's Python, itself a venv holding onnxruntime-gpu
    subprocess.run([_board_python(), "-m", "venv", str(board_python)], check=True, capture_output=True, timeout=300)
    python = str(board_python / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "-q", "onnxruntime-gpu"], check=True, capture_output=True,
                   timeout=300)
    monkeypatch.chdir(tmp_path)  # as ssh starts the helper in the home directory, not in this checkout
    root = str(tmp_path / "board")
    board = Board(LocalTransport(root), python, root)
    wheel = next(sdk.glob("edgesdk-*.whl"))
    reply = board.call("install", {"key": "k1", "system_site_packages": True, "pip_spec": str(wheel)}, timeout=600)
    assert reply["version"] == "0.1.0"
    venv_python = str(Path(root) / "runtime" / "k1" / "bin" / "python")
    ran = subprocess.run([venv_python, "-c", "import onnxruntime, tinydep; print(onnxruntime.BUILD, tinydep.BUILD)"],
                         capture_output=True, text=True, timeout=60)
    assert ran.stdout.split() == ["onnxruntime-gpu", "tinydep"], ran.stdout + ran.stderr
    own = {d.name.split("-")[0].lower()
           for d in Path(root, "runtime", "k1", "lib").glob("python3*/site-packages/*.dist-info")}
    assert "onnxruntime" not in own  # the venv's own site-packages: nothing over the board's build
    assert {"edgesdk", "tinydep"} <= own
    assert "torch" not in own  # an extra's requirement
    assert reply["provided"] == [{"requirement": "onnxruntime<1.33,>=1.18", "by": "onnxruntime-gpu 1.19.0"}]
