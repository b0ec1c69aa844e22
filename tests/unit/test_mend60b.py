"""Mends 60b: kernel scratch that doubles past what the GPU has left falls back to the size the launch needs (through
the recording cuda-python stand-in, whose cuMemAlloc refuses past a limit as the driver does); and a board's
``--status`` result names ``current_problem`` and ``last_switch`` always, null where the board has none, so a
fleet's ``--json`` carries the same keys whichever boards finished (real local boards, real sshd)."""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")

from edgesdk.kernels import loader  # noqa: E402
from edgesdk.kernels.loader import KernelLoadError, load_compiled  # noqa: E402
from tests.unit.test_gpu_leads60 import StackedCudaDriver, _kernel_dir, _on_cuda_python, _params  # noqa: E402
from tests.unit.test_triton_close59 import GEMV  # noqa: E402

SCRATCH = 64  # bytes per program
CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY = 1, 2
ERROR_NAMES = {CUDA_ERROR_INVALID_VALUE: b"CUDA_ERROR_INVALID_VALUE", CUDA_ERROR_OUT_OF_MEMORY: b"CUDA_ERROR_OUT_OF_MEMORY"}


# ---------------------------------------------------------------------------------------------- kernel scratch
class LimitedCudaDriver(StackedCudaDriver):
    """:class:`StackedCudaDriver` with ``limit`` bytes of device memory: a ``cuMemAlloc`` past what is left answers
    ``refusal`` (CUDA_ERROR_OUT_OF_MEMORY, as the driver does) and allocates nothing; ``cuMemFree`` gives back."""

    def __init__(self, limit: int, refusal: int = CUDA_ERROR_OUT_OF_MEMORY):
        super().__init__()
        self.limit, self.refusal = limit, refusal
        self.allocated: dict[int, int] = {}  # handle -> bytes

    def __getattr__(self, name):
        recorded = super().__getattr__(name)

        def call(*args):
            if name == "cuGetErrorName":
                return 0, ERROR_NAMES.get(int(args[0]), b"CUDA_ERROR_UNKNOWN")
            if name == "cuMemAlloc" and sum(self.allocated.values()) + int(args[0]) > self.limit:
                self.calls.append((name, *args))
                return (self.refusal,)
            answer = recorded(*args)
            if name == "cuMemAlloc":
                self.allocated[answer[1]] = int(args[0])
            elif name == "cuMemFree":
                del self.allocated[args[0]]
            return answer
        return call

    def asked(self) -> list[int]:
        return [call[1] for call in self.calls if call[0] == "cuMemAlloc"]


def _gemv(monkeypatch, tmp_path, cuda):
    _on_cuda_python(monkeypatch, cuda)
    compiled = load_compiled(_kernel_dir(tmp_path, scratch=SCRATCH))
    return compiled, compiled[GEMV]


def test_scratch_whose_doubling_does_not_fit_is_allocated_at_the_size_the_launch_needs(monkeypatch, tmp_path):
    """Growing from 96 programs' scratch to 100's asked for twice the held buffer (192 programs' worth) and nothing
    else: where that did not fit beside the held one, the launch failed although the 100 programs' would have."""
    cuda = LimitedCudaDriver(limit=SCRATCH * 200)  # 96 held + 192 doubled do not fit; 96 + 100 do
    compiled, gemv = _gemv(monkeypatch, tmp_path, cuda)
    gemv.launch((96, 1, 1), *_params(gemv))
    gemv.launch((100, 1, 1), *_params(gemv))
    assert cuda.asked() == [SCRATCH * 96, SCRATCH * 192, SCRATCH * 100]
    held, pointer, _ = gemv._scratch["global"]
    assert held == SCRATCH * 100
    assert pointer in cuda.allocated
    assert cuda.count("cuLaunchKernel") == 2
    gemv.launch((100, 1, 1), *_params(gemv))  # fits what is held: nothing more is asked for
    assert len(cuda.asked()) == 3
    compiled.close()
    assert cuda.allocated == {}  # the outgrown buffer and the one that replaced it


def test_scratch_that_fits_doubled_still_doubles(monkeypatch, tmp_path):
    cuda = LimitedCudaDriver(limit=SCRATCH * 300)
    compiled, gemv = _gemv(monkeypatch, tmp_path, cuda)
    gemv.launch((96, 1, 1), *_params(gemv))
    gemv.launch((100, 1, 1), *_params(gemv))
    assert cuda.asked() == [SCRATCH * 96, SCRATCH * 192]
    compiled.close()


def test_scratch_that_does_not_fit_at_its_own_size_is_refused_and_the_held_one_kept(monkeypatch, tmp_path):
    cuda = LimitedCudaDriver(limit=SCRATCH * 150)
    compiled, gemv = _gemv(monkeypatch, tmp_path, cuda)
    gemv.launch((96, 1, 1), *_params(gemv))
    with pytest.raises(KernelLoadError, match="cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY"):
        gemv.launch((100, 1, 1), *_params(gemv))
    assert cuda.asked() == [SCRATCH * 96, SCRATCH * 192, SCRATCH * 100]
    assert gemv._scratch["global"][0] == SCRATCH * 96
    assert cuda.count("cuLaunchKernel") == 1
    compiled.close()
    assert cuda.allocated == {}


def test_a_first_scratch_or_another_error_is_not_asked_for_again(monkeypatch, tmp_path):
    """Only a doubled size refused for want of memory is retried: a first allocation is already the exact size,
    and another driver error says nothing about the size."""
    cuda = LimitedCudaDriver(limit=SCRATCH * 10)
    compiled, gemv = _gemv(monkeypatch, tmp_path, cuda)
    with pytest.raises(KernelLoadError, match="CUDA_ERROR_OUT_OF_MEMORY"):
        gemv.launch((11, 1, 1), *_params(gemv))
    assert cuda.asked() == [SCRATCH * 11]
    compiled.close()

    cuda = LimitedCudaDriver(limit=SCRATCH * 200, refusal=CUDA_ERROR_INVALID_VALUE)
    compiled, gemv = _gemv(monkeypatch, tmp_path / "second", cuda)
    gemv.launch((96, 1, 1), *_params(gemv))
    with pytest.raises(KernelLoadError, match="cuMemAlloc failed: CUDA_ERROR_INVALID_VALUE"):
        gemv.launch((100, 1, 1), *_params(gemv))
    assert cuda.asked() == [SCRATCH * 96, SCRATCH * 192]
    compiled.close()


def test_torchs_out_of_memory_counts_as_out_of_memory():
    """The libcuda path allocates scratch through torch, whose refusal is torch.cuda.OutOfMemoryError."""
    assert loader._out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 GiB"))
    assert not loader._out_of_memory(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not loader._out_of_memory(KernelLoadError("cuMemAlloc failed: CUDA_ERROR_INVALID_VALUE"))


# ---------------------------------------------------------------------------------------------- status keys
def test_a_status_names_current_problem_and_last_switch_whether_or_not_the_board_has_them(tiny_bundle, tmp_path):
    """A board's state named current_problem and last_switch only where it had one: a fleet's --status --json
    carried them only when some board that finished had them, and cli_deploy's copied key list had neither."""
    from edgesdk.deploy.releases import STATUS_KEYS, status
    from edgesdk.deploy.report import Reporter
    from edgesdk.deploy.session import DeployOptions
    from tests._utils.deploy import bundle_variant, edgesdk

    root = tmp_path / "root"
    fresh = status(DeployOptions(to=root))
    assert list(fresh) == list(STATUS_KEYS)
    assert {"current_problem", "last_switch"} <= set(STATUS_KEYS)
    assert (fresh["current_problem"], fresh["last_switch"]) == (None, None)

    from edgesdk.deploy.releases import rollback

    second = bundle_variant(tiny_bundle.path, tmp_path / "second", "second")
    for path in (tiny_bundle.path, second.path):
        deployed = edgesdk("deploy", path, "--to", root)
        assert deployed.returncode == 0, deployed.stderr
    rollback(DeployOptions(to=root), report=Reporter(total=4, prefix="rollback", write=lambda line: None))
    os.remove(root / "current")
    os.symlink("releases/gone", root / "current")
    broken = status(DeployOptions(to=root))
    assert list(broken) == list(STATUS_KEYS)
    assert "releases/gone, which does not exist" in broken["current_problem"]
    assert broken["last_switch"]["action"] == "rollback"


def test_a_fleet_status_json_names_the_conditional_keys_where_no_board_has_them(ssh_server, tmp_path):
    """A live board on a fresh root and one that is off: neither has a current problem or a last switch, and both
    objects name them, null."""
    from tests.unit.test_small_leads60 import fleet_status_of_a_live_and_an_off_board

    result, _ = fleet_status_of_a_live_and_an_off_board(ssh_server, tmp_path / "root")
    assert result.exit_code == 1, result.output
    live, off = json.loads(result.stdout)
    assert list(live) == list(off)
    for entry in (live, off):
        assert (entry["current_problem"], entry["last_switch"]) == (None, None)
    assert (live["ok"], off["ok"]) == (True, False)
