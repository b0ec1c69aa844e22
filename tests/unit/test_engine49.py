"""``edgesdk engine check`` asks for a usable CUDA device as well as TensorRT.

It imported TensorRT only, so a board whose TensorRT imports but whose GPU does not answer (a driver older than
the CUDA runtime, CUDA_VISIBLE_DEVICES hiding it) passed the check, and deploy's engine build then failed on
"no CUDA device is usable". The GPU's absence is stood in for here (this machine has none); TensorRT is the
tests' stand-in module.
"""

from __future__ import annotations

import sys

from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.runtime import tensorrt_engine as te
from tests._utils.tensorrt_standin import TensorRTModule

NO_DRIVER = ("the CUDA runtime libcudart.so.12 reports: CUDA driver version is insufficient for CUDA runtime "
             "version (error 35)")


def _check(monkeypatch, sm):
    monkeypatch.setitem(sys.modules, "tensorrt", TensorRTModule())
    monkeypatch.setattr(te, "cuda_device_sm", lambda device=0: (sm, "libcudart" if sm else NO_DRIVER))
    return CliRunner().invoke(main, ["engine", "check"])


def test_engine_check_fails_where_tensorrt_imports_but_no_cuda_device_is_usable(monkeypatch):
    result = _check(monkeypatch, None)
    assert result.exit_code != 0
    assert "no CUDA device is usable" in result.output
    assert "CUDA driver version is insufficient" in result.output


def test_engine_check_prints_tensorrt_and_the_sm_where_both_are_there(monkeypatch):
    result = _check(monkeypatch, 87)
    assert result.exit_code == 0, result.output
    assert result.output.split() == [TensorRTModule.__version__, "sm87"]


def test_deploy_says_the_boards_gpu_cannot_be_used_not_to_reinstall_tensorrt(tmp_path):
    from edgesdk.deploy import engine
    from edgesdk.deploy.remote import Board
    from edgesdk.deploy.transport import LocalTransport

    said = f"error: no CUDA device is usable here ({NO_DRIVER})\n  fix: check CUDA_VISIBLE_DEVICES\n"
    board = Board(LocalTransport(str(tmp_path)), sys.executable, str(tmp_path))
    status = engine.builder_status(board, [sys.executable, "-c", f"import sys; sys.stderr.write({said!r}); "
                                                                 "sys.exit(1)"])
    assert not status.available
    assert status.reason.startswith("the board's GPU cannot be used (no CUDA device is usable here")
    assert "site-packages" not in status.reason
