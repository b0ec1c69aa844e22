"""The runtime wheel a deploy installs is built only for a board that lacks it, and the engine step's fix fits
the runtime that answered."""

from __future__ import annotations

import sys

import pytest

from edgesdk.deploy import engine, install
from edgesdk.deploy.remote import Board
from edgesdk.deploy.transport import LocalTransport
from tests._utils.deploy import tiny_checkout


def test_no_wheel_is_built_for_a_runtime_the_board_has(tmp_path, monkeypatch):
    """runtime_source built the wheel (pip wheel, up to 600 s) on every deploy, even when the probe had found the
    runtime of that key on the board, where nothing is installed. A board without it still gets the wheel."""
    root = tiny_checkout(tmp_path / "checkout")
    monkeypatch.setattr(install, "checkout_root", lambda: root)  # a small checkout of its own: a stable digest
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    digest = install.source_digest(root)
    key = f"{install.__version__}-{digest[:12]}-py310-site"
    held = install.runtime_source((3, 10, 12), True, installed=[f"{install.__version__}-old-py310", key])
    assert held.key == key
    assert held.wheel is None
    assert not (tmp_path / "cache").exists()  # no build was started
    assert held.describe() == f"runtime/{key} already on the board"
    lacking = install.runtime_source((3, 10, 12), False, installed=[key])
    assert lacking.key == key.removesuffix("-site")
    assert lacking.wheel is not None
    assert lacking.wheel.is_file()
    assert lacking.wheel.parent == install.cache_dir() / digest[:24]


def _status(tmp_path, stderr: str, runtime_key: str | None) -> engine.BuilderStatus:
    board = Board(LocalTransport(str(tmp_path)), sys.executable, str(tmp_path))
    return engine.builder_status(board, [sys.executable, "-c", f"import sys; sys.stderr.write({stderr!r}); "
                                                               "sys.exit(1)"], runtime_key)


NO_LIBNVINFER = ("error: TensorRT's Python module 'tensorrt' cannot be imported by Python 3.10 (/r/bin/python): "
                 "libnvinfer.so.10: cannot open shared object file\n"
                 "  fix: on a Jetson: sudo apt install python3-libnvinfer\n")
TOO_OLD = ("error: TensorRT 8.2.1 on Python 3.8 (/r/bin/python) is older than 8.5 (the name-based tensor API)\n"
           "  fix: use JetPack 6 (TensorRT 10) on the Jetson\n")


def test_a_runtime_with_system_site_packages_is_not_told_to_get_them(tmp_path):
    """builder_status always said 'deploy with --runtime-venv-system-site-packages', also to a runtime made with
    them (key ending in -site), where that flag changes nothing: the board's own fix names what does."""
    status = _status(tmp_path, NO_LIBNVINFER, "0.1.0-abc-py310-site")
    assert not status.available
    assert "--runtime-venv-system-site-packages" not in status.reason
    assert status.reason.startswith("the board's edgesdk cannot use it (TensorRT's Python module 'tensorrt' "
                                    "cannot be imported")
    assert ("runtime/0.1.0-abc-py310-site sees the board's system site-packages already, so the cause is on the "
            "board: on a Jetson: sudo apt install python3-libnvinfer)") in status.reason
    bare = _status(tmp_path, NO_LIBNVINFER, "0.1.0-abc-py310")  # a venv without them: the flag is the fix
    assert "deploy with --runtime-venv-system-site-packages" in bare.reason


@pytest.mark.parametrize("runtime_key", ["0.1.0-abc-py38", "0.1.0-abc-py38-site", None])
def test_a_tensorrt_too_old_is_not_a_site_packages_problem(tmp_path, runtime_key):
    status = _status(tmp_path, TOO_OLD, runtime_key)
    assert "--runtime-venv-system-site-packages" not in status.reason
    assert status.reason.endswith("is older than 8.5 (the name-based tensor API); use JetPack 6 (TensorRT 10) on "
                                  "the Jetson)")


def test_a_site_runtime_that_gives_no_fix_is_told_what_to_check(tmp_path):
    said = "Traceback (most recent call last):\nImportError: libnvinfer.so.10: cannot open shared object file\n"
    status = _status(tmp_path, said, "0.1.0-abc-py310-site")
    assert "--runtime-venv-system-site-packages" not in status.reason
    assert "python3 -c 'import tensorrt; print(tensorrt.__version__)'" in status.reason


def test_an_edgesdk_that_is_no_runtime_of_the_root_is_told_the_boards_fix(tmp_path):
    """--no-install or --to DIR: the answering edgesdk is none of the deploy root's runtimes (runtime_key None),
    which --runtime-venv-system-site-packages does not make; the board's own fix says what does."""
    status = _status(tmp_path, NO_LIBNVINFER, None)
    assert "--runtime-venv-system-site-packages" not in status.reason
    assert status.reason.endswith("on a Jetson: sudo apt install python3-libnvinfer)")
