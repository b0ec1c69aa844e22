"""Leads 60b: a Ctrl-C while a deploy switches away from a release whose directory was removed from the board (real
sshd, the real board helper), and what a Ctrl-C after that switch says; the kernel loader's driver backends release
the primary context they retained when their set-up fails after the retain (through the recording stand-ins)."""

from __future__ import annotations

import pytest

from tests._utils.deploy import current_id, edgesdk


# ---------------------------------------------------------------------------------------------- deploy: Ctrl-C
def test_ctrl_c_while_switching_away_from_a_removed_release_names_no_rollback_to_it(ssh_server, tiny_bundle,
                                                                                   tmp_path):
    """current pointed to a release whose directory was removed (by hand); a Ctrl-C while the deploy switched said
    current may still be on it and that 'edgesdk deploy --rollback' goes back, though no rollback can go to it. It
    says that release is no longer on the board, and that the same deploy again finishes the switch."""
    from tests.e2e.test_deploy_interrupt38 import interrupt_when_held
    from tests.unit.test_deploy_leads60 import board_with_current_removed

    board, newer, deploy = board_with_current_removed(ssh_server, tiny_bundle, tmp_path)
    root = board.root

    cut = interrupt_when_held(tmp_path, deploy, "switch", 0)

    assert cut.returncode == 130, cut.stderr
    assert "Traceback" not in cut.stderr
    assert current_id(root) == tiny_bundle.bundle_id  # held before the switch ran on the board
    assert "--rollback" not in cut.stderr, cut.stderr
    assert (f"while switching current on {ssh_server.destination}: current may already point to "
            f"releases/{newer.bundle_id} (smoke-tested) or still to releases/{tiny_bundle.bundle_id}, which is no "
            "longer on the board (its directory was removed), so there is no release to go back to") in cut.stderr
    assert "the same deploy again finishes the switch" in cut.stderr
    again = edgesdk(*deploy)  # what it says
    assert again.returncode == 0, again.stderr
    assert current_id(root) == newer.bundle_id


@pytest.mark.parametrize("stage", ["switched", "service"])
def test_ctrl_c_after_switching_away_from_a_removed_release_names_no_rollback(stage):
    """After the switch the deploy reports that the release current pointed to is gone and there is no previous
    release to roll back to; a Ctrl-C then still named 'edgesdk deploy --rollback' as the way back."""
    from edgesdk.deploy.orchestrate import interrupted

    progress = {"where": "pi@board", "bundle_id": "new", "current": "old", "current_removed": True, "stage": stage}
    cut = interrupted(progress)
    assert "--rollback" not in cut.fix, cut.fix
    assert ("releases/old, which current pointed to, is no longer on the board (its directory was removed), so there "
            "is no previous release to roll back to") in cut.problem
    held = interrupted({**progress, "current_removed": False})  # a release still on the board: as before
    assert "'edgesdk deploy --rollback'" in held.fix
    assert "no longer on the board" not in held.problem


# ---------------------------------------------------------------------------------------------- kernel loader
def _refusing(base, name: str, err: int = 201):
    """``base`` (a stand-in driver class) with its ``name`` call refused with CUDA error ``err``."""

    class Refusing(base):
        def __getattr__(self, attr):
            call = super().__getattr__(attr)
            if attr != name:
                return call

            def refused(*args):
                call(*args)
                return (err,)
            return refused
    return Refusing


def test_a_cuda_python_driver_failing_after_the_retain_releases_the_primary_context(monkeypatch, tmp_path):
    """cuCtxGetDevice refused after the driver retained the device's primary context: the retention was never
    released (no driver came back to close). It is released once, the error raised is the refusal, and the
    caller's context stack is as before."""
    pytest.importorskip("torch")
    from edgesdk.kernels.loader import KernelLoadError, load_compiled
    from tests.unit.test_gpu_leads60 import StackedCudaDriver, _kernel_dir, _on_cuda_python

    cuda = _refusing(StackedCudaDriver, "cuCtxGetDevice")()
    _on_cuda_python(monkeypatch, cuda)
    with pytest.raises(KernelLoadError, match="cuCtxGetDevice failed"):
        load_compiled(_kernel_dir(tmp_path))
    assert cuda.count("cuDevicePrimaryCtxRetain") == 1
    released = [call for call in cuda.calls if call[0] == "cuDevicePrimaryCtxRelease"]
    assert released == [("cuDevicePrimaryCtxRelease", 0)]  # the device retained (cuDeviceGet answered 0)
    assert cuda.stack == []

    both = _refusing(_refusing(StackedCudaDriver, "cuCtxGetDevice"), "cuDevicePrimaryCtxRelease")()
    _on_cuda_python(monkeypatch, both)
    with pytest.raises(KernelLoadError, match="cuCtxGetDevice failed"):  # not the release's error over it
        load_compiled(_kernel_dir(tmp_path / "again"))
    assert both.count("cuDevicePrimaryCtxRelease") == 1

    caller = _refusing(StackedCudaDriver, "cuCtxGetDevice")(current=0xCAFE0)
    _on_cuda_python(monkeypatch, caller)
    with pytest.raises(KernelLoadError, match="cuCtxGetDevice failed"):
        load_compiled(_kernel_dir(tmp_path / "caller"))
    assert caller.count("cuDevicePrimaryCtxRetain") == caller.count("cuDevicePrimaryCtxRelease") == 0
    assert caller.stack == [0xCAFE0]


def test_a_ctypes_driver_failing_after_the_retain_releases_the_primary_context(monkeypatch, tmp_path):
    """The libcuda (ctypes) driver asks torch for the capability after the retain: a failure there left the primary
    context retained. It is released once, and torch's error is the one raised."""
    torch = pytest.importorskip("torch")
    from edgesdk.kernels import loader
    from tests.unit.test_gpu_leads60 import FakeLibcuda, _kernel_dir

    lib = FakeLibcuda()
    monkeypatch.setattr(loader, "_open_libcuda", lambda: lib)
    for name in ("init", "set_device", "current_stream", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, lambda *args, **kwargs: None)

    def capability(device=None):
        raise RuntimeError("CUDA error: device-side assert triggered")
    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    monkeypatch.setattr(loader, "select_driver", lambda backend=None, device=0: loader._LibcudaDriver(device))
    with pytest.raises(RuntimeError, match="device-side assert triggered"):
        loader.load_compiled(_kernel_dir(tmp_path))
    assert lib.calls.count("cuDevicePrimaryCtxRetain") == 1
    assert lib.calls.count("cuDevicePrimaryCtxRelease_v2") == 1
    assert lib.stack == []
