"""GPU-side leads, run here through stand-ins (no GPU, no cuda-python here): the kernel loader's CUDA context handling
on both driver paths (cuda-python's ``driver`` module, and libcuda through ctypes) over stand-ins that keep a context
stack as the driver does; the loader's kernel scratch growth; and the TensorRT backend's device-to-device rewind,
through the real ``CudaPythonDevice`` over a stand-in cuda-python runtime whose device memory is host memory (its
``cudaMemcpy2DAsync`` copies row by row and refuses what the CUDA runtime refuses) and the real ``TorchDevice`` copy
over CPU tensors. tests/gpu has the GPU checks."""

from __future__ import annotations

import ctypes
import json
import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgesdk.errors import RuntimeBackendError  # noqa: E402
from edgesdk.kernels import loader  # noqa: E402
from edgesdk.kernels.loader import KernelLoadError, load_compiled  # noqa: E402
from tests.unit.test_gpu_runtime46 import HostDevice, OrtTensorRT  # noqa: E402
from tests.unit.test_kernel_loader import write_kernel_dir  # noqa: E402
from tests.unit.test_triton_close59 import GEMV, RecordedCudaDriver  # noqa: E402
from tests.unit.test_trt59 import installed_as_cuda_python  # noqa: E402

CALLER = 0xCAFE0  # the context the caller (PyTorch, say) has current
PRIMARY = 0x2000  # the first handle RecordedCudaDriver makes: the primary context the loader retains


# ---------------------------------------------------------------------------------------------- the CUDA context
class StackedCudaDriver(RecordedCudaDriver):
    """:class:`RecordedCudaDriver` with the driver's per-thread context stack: ``cuCtxGetCurrent`` answers its top
    (0 when empty), ``cuCtxSetCurrent`` replaces the top, ``cuCtxPushCurrent`` / ``cuCtxPopCurrent`` push and pop.
    ``during`` records the context current at each other call."""

    def __init__(self, current: int = 0, refuse=()):
        super().__init__(refuse)
        self.stack = [current] if current else []
        self.during: dict[str, list[int]] = {}

    @property
    def current(self) -> int:
        return self.stack[-1] if self.stack else 0

    def __getattr__(self, name):
        recorded = super().__getattr__(name)

        def call(*args):
            answer = recorded(*args)
            if name == "cuCtxGetCurrent":
                return 0, self.current
            if name == "cuCtxSetCurrent":
                self.stack[-1:] = [int(args[0])]
            elif name == "cuCtxPushCurrent":
                self.stack.append(int(args[0]))
            elif name == "cuCtxPopCurrent":
                return 0, self.stack.pop()
            else:
                self.during.setdefault(name, []).append(self.current)
            return answer
        return call


def _kernel_dir(tmp_path, scratch: int = 0):
    kernel_dir = write_kernel_dir(tmp_path)
    if scratch:
        meta_path = kernel_dir / f"{GEMV}.json"
        meta = json.loads(meta_path.read_text())
        meta["global_scratch_size"] = scratch  # bytes per program: a launch allocates scratch
        meta_path.write_text(json.dumps(meta))
    return kernel_dir


def _params(kernel) -> list[int]:
    return [16 * (i + 1) if ty.startswith("*") else 1 for i, (_, ty) in enumerate(kernel.meta["params"])]


def _on_cuda_python(monkeypatch, cuda):
    monkeypatch.setattr(loader, "select_driver",
                        lambda backend=None, device=0: loader._CudaPythonDriver(cuda, device))


def test_the_loader_leaves_the_callers_context_current_and_runs_its_own_calls_in_its_context(monkeypatch, tmp_path):
    """The loader made its context current with cuCtxSetCurrent: loaded on a thread with none, it left the primary
    context it retained current there; a launch ran in whatever context the caller had current then (its module
    belongs to the loader's); and close replaced the caller's current context with the loader's for good."""
    cuda = StackedCudaDriver()
    _on_cuda_python(monkeypatch, cuda)
    compiled = load_compiled(_kernel_dir(tmp_path, scratch=64))
    assert compiled.driver.context == PRIMARY
    assert cuda.current == 0  # none, as before the load
    assert set(cuda.during["cuModuleLoadData"]) == set(cuda.during["cuModuleGetFunction"]) == {PRIMARY}
    cuda.stack.append(CALLER)  # the caller makes its own context current
    gemv = compiled[GEMV]
    gemv.launch((2, 1, 1), *_params(gemv))
    assert cuda.during["cuLaunchKernel"] == [PRIMARY]
    assert cuda.during["cuMemAlloc"] == [PRIMARY]
    assert cuda.current == CALLER
    compiled.close()
    assert cuda.current == CALLER
    assert cuda.stack == [CALLER]  # every push popped
    for name in ("cuCtxSynchronize", "cuModuleUnload", "cuMemFree"):
        assert set(cuda.during[name]) == {PRIMARY}, name
    assert cuda.count("cuCtxSetCurrent") == 0
    assert cuda.count("cuDevicePrimaryCtxRelease") == 1


def test_a_load_refused_midway_leaves_the_callers_context_current(monkeypatch, tmp_path):
    """A driver call that fails inside the loader's context pops it all the same."""
    cuda = StackedCudaDriver(current=CALLER, refuse={2})
    _on_cuda_python(monkeypatch, cuda)
    with pytest.raises(KernelLoadError, match="cuModuleGetFunction failed"):
        load_compiled(_kernel_dir(tmp_path))
    assert cuda.stack == [CALLER]
    assert cuda.count("cuModuleUnload") == cuda.count("cuModuleLoadData") == 2
    assert cuda.count("cuDevicePrimaryCtxRelease") == 0  # the caller's context was used: nothing retained


class FakeLibcuda:
    """``libcuda.so.1`` through ctypes, as far as the loader calls it: functions take ``argtypes``, write through
    ``byref`` pointers and answer CUDA_SUCCESS, with the context stack of :class:`StackedCudaDriver`. Every call is
    recorded by the exported name used: the unversioned names that cuda.h maps to a ``_v2`` entry point are exported
    too, with their pre-``_v2`` semantics for old binaries."""

    def __init__(self, current: int = 0):
        self.stack = [current] if current else []
        self.calls: list[str] = []
        self.during: dict[str, list[int]] = {}
        self._functions: dict[str, types.SimpleNamespace] = {}
        self._next = 0x1000

    @property
    def current(self) -> int:
        return self.stack[-1] if self.stack else 0

    def _handle(self) -> int:
        self._next += 0x1000
        return self._next

    def __getattr__(self, name):
        if not name.startswith("cu"):
            raise AttributeError(name)
        if name not in self._functions:
            function = type("Function", (), {"__call__": lambda _, *args: self._call(name, *args)})()
            self._functions[name] = function
        return self._functions[name]

    def _call(self, name, *args):
        self.calls.append(name)
        target = getattr(args[0], "_obj", None) if args else None  # what a byref() first argument points at
        if name in ("cuCtxGetCurrent", "cuCtxPopCurrent_v2", "cuCtxPopCurrent"):
            target.value = self.current if name == "cuCtxGetCurrent" else self.stack.pop()
        elif name in ("cuCtxPushCurrent_v2", "cuCtxPushCurrent"):
            self.stack.append(int(getattr(args[0], "value", args[0])))
        elif name == "cuCtxSetCurrent":
            self.stack[-1:] = [int(getattr(args[0], "value", args[0]))]
        elif name == "cuDeviceGet":
            target.value = args[1]
        elif name in ("cuDevicePrimaryCtxRetain", "cuModuleLoadData", "cuModuleGetFunction"):
            target.value = self._handle()
        if name not in ("cuCtxGetCurrent", "cuCtxSetCurrent") and "Push" not in name and "Pop" not in name:
            self.during.setdefault(name, []).append(self.current)
        return 0


def test_the_ctypes_path_calls_the_v2_entry_points_and_restores_the_callers_context(monkeypatch, tmp_path):
    """Through ctypes the loader called the unversioned cuDevicePrimaryCtxRelease, which keeps the semantics from
    before CUDA 11 (cuda.h defines the name as cuDevicePrimaryCtxRelease_v2), and made its context current with
    cuCtxSetCurrent, leaving it current on a thread that had none and replacing the caller's at close."""
    lib = FakeLibcuda()  # torch made no context current (the stand-in torch below does nothing)
    monkeypatch.setattr(loader, "_open_libcuda", lambda: lib)
    for name in ("init", "set_device", "current_stream", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, lambda *args, **kwargs: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 7))
    monkeypatch.setattr(loader, "select_driver", lambda backend=None, device=0: loader._LibcudaDriver(device))
    compiled = load_compiled(_kernel_dir(tmp_path))
    primary = compiled.driver.context.value
    assert primary
    assert lib.current == 0
    assert set(lib.during["cuModuleLoadData"]) == {primary}
    lib.stack.append(CALLER)
    gemv = compiled[GEMV]
    gemv.launch((2, 1, 1), *_params(gemv))
    assert lib.during["cuLaunchKernel"] == [primary]
    assert lib.current == CALLER
    compiled.close()
    assert lib.stack == [CALLER]
    assert set(lib.during["cuModuleUnload"]) == {primary}
    assert lib.calls.count("cuDevicePrimaryCtxRelease_v2") == 1
    legacy = {"cuDevicePrimaryCtxRelease", "cuCtxPushCurrent", "cuCtxPopCurrent", "cuCtxSetCurrent", "cuMemAlloc",
              "cuMemFree", "cuCtxDestroy"}
    assert legacy.isdisjoint(lib.calls)


# ---------------------------------------------------------------------------------------------- kernel scratch
def test_scratch_grows_by_doubling_so_a_slowly_growing_grid_allocates_a_few_buffers(monkeypatch, tmp_path):
    """Scratch a larger grid outgrew is kept to close (a captured CUDA graph may still use it), and each buffer was
    the exact size asked for: a grid growing by one program each launch allocated a buffer every launch."""
    cuda = StackedCudaDriver()
    _on_cuda_python(monkeypatch, cuda)
    compiled = load_compiled(_kernel_dir(tmp_path, scratch=64))
    gemv = compiled[GEMV]
    for programs in range(1, 33):
        gemv.launch((programs, 1, 1), *_params(gemv))
        held, _, _ = gemv._scratch["global"]
        assert held >= 64 * programs
    sizes = [call[1] for call in cuda.calls if call[0] == "cuMemAlloc"]
    assert sizes == [64, 128, 256, 512, 1024, 2048]  # log2(32) + 1 buffers, not 32
    compiled.close()
    assert cuda.count("cuMemFree") == len(sizes)  # the outgrown ones too


# ---------------------------------------------------------------------------------------------- TensorRT rewind
class HostCudaRuntime:
    """``cuda.bindings.runtime`` as far as CudaPythonDevice calls it, its device memory host memory. Copies check
    what the CUDA runtime checks: the direction of the copy against the pointers (device pointers are the ones
    cudaMalloc gave), a 2D copy's width against both pitches and its rows inside both allocations, and that the two
    regions of a 2D copy do not overlap. ``sizes`` is what the stand-in TensorRT checks its writes against."""

    class cudaError_t:  # noqa: N801  (cuda-python's names)
        cudaSuccess = 0

    class cudaMemcpyKind:  # noqa: N801
        cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice = 1, 2, 3

    def __init__(self):
        self.sizes: dict[int, int] = {}
        self._keep: list[np.ndarray] = []
        self.copies: list[tuple] = []  # (kind name, bytes)

    def _device(self, ptr: int, nbytes: int) -> bool:
        return any(base <= ptr and ptr + nbytes <= base + size for base, size in self.sizes.items())

    def cudaStreamCreate(self):  # noqa: N802
        return 0, 0x10

    def cudaStreamSynchronize(self, stream):  # noqa: N802
        return (0,)

    def cudaStreamDestroy(self, stream):  # noqa: N802
        return (0,)

    def cudaMalloc(self, nbytes):  # noqa: N802
        array = np.zeros(nbytes, np.uint8)
        self._keep.append(array)
        self.sizes[array.ctypes.data] = nbytes
        return 0, array.ctypes.data

    def cudaFree(self, ptr):  # noqa: N802
        return (0,)

    def cudaMemcpyAsync(self, dst, src, nbytes, kind, stream):  # noqa: N802
        to_device, from_device = {1: (True, False), 2: (False, True)}[kind]
        assert self._device(dst, nbytes) == to_device
        assert self._device(src, nbytes) == from_device
        self.copies.append(({1: "HtoD", 2: "DtoH"}[kind], nbytes))
        ctypes.memmove(dst, src, nbytes)
        return (0,)

    def cudaMemcpy2DAsync(self, dst, dpitch, src, spitch, width, height, kind, stream):  # noqa: N802
        assert kind == self.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        assert width <= min(dpitch, spitch), (width, dpitch, spitch)
        dst_end, src_end = dst + (height - 1) * dpitch + width, src + (height - 1) * spitch + width
        assert self._device(dst, dst_end - dst)
        assert self._device(src, src_end - src)
        assert dst_end <= src or src_end <= dst, "the regions overlap"
        self.copies.append(("2D", width * height))
        for row in range(height):
            ctypes.memmove(dst + row * dpitch, src + row * spitch, width)
        return (0,)


@pytest.fixture
def cudart(monkeypatch):
    return installed_as_cuda_python(HostCudaRuntime(), monkeypatch)


@pytest.fixture(scope="module")
def engine_graph(tmp_path_factory):
    from tests.unit.test_trt_rewind59 import _exported

    return _exported(tmp_path_factory.mktemp("trt-leads60"), seed=0)


def _tensorrt(engine_graph, device, sizes, monkeypatch, tmp_path):
    from edgesdk.runtime.tensorrt_backend import TensorRTBackend

    model, graph = engine_graph
    assert max(graph["kv_heads"]) > 1  # a past tensor whose layout depends on its length: the case here
    monkeypatch.setitem(sys.modules, "tensorrt", OrtTensorRT(model, graph, types.SimpleNamespace(sizes=sizes), 4))
    plan = tmp_path / "engine.plan"
    plan.write_bytes(b"plan")
    return TensorRTBackend(plan, graph, device=device)


def _ids(seed: int, count: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 300, count)]


def test_a_gpu_rewind_copies_device_to_device_and_continues_as_a_whole_prefill(engine_graph, cudart, monkeypatch,
                                                                              tmp_path):
    """rewind moved each head's kept entries through host memory (download, then upload) where a pitched copy on
    the device does it; rewound into a chunk, mid-chunk, to all of it and to nothing, and decoded on (the buffers
    that changed places are written next), the cache answers as a whole prefill on the host-path backend does."""
    from edgesdk.runtime.tensorrt_backend import CudaPythonDevice

    backend = _tensorrt(engine_graph, CudaPythonDevice(), cudart.sizes, monkeypatch, tmp_path)
    host = HostDevice()
    reference = _tensorrt(engine_graph, host, host.sizes, monkeypatch, tmp_path)
    assert not hasattr(host, "copy_2d")  # the reference rewinds through host memory
    ids, tail = _ids(1, 11), _ids(2, 3)
    itemsize = backend._dtype[backend.names["past"][0]].itemsize
    multi = sum(kv > 1 for kv in backend._kv_heads_per_tensor)
    for kept in (9, 5, 2, 11, 0):
        for each in (backend, reference):
            each.reset()
            each.prefill(np.array(ids))
        cudart.copies.clear()
        backend.rewind(kept)
        reference.rewind(kept)
        if 0 < kept < len(ids):
            rows = [kv for kv in backend._kv_heads_per_tensor if kv > 1]
            assert cudart.copies == [("2D", kept * backend.head_dim * itemsize * kv) for kv in rows]
            assert len(cudart.copies) == multi
        else:
            assert cudart.copies == []
        for ours, theirs in zip(backend.save_cache()[0], reference.save_cache()[0], strict=True):
            np.testing.assert_array_equal(ours, theirs)
        rest = np.array(tail)
        np.testing.assert_allclose(backend.prefill(rest, keep_logits=3), reference.prefill(rest, keep_logits=3),
                                   atol=1e-5, err_msg=f"rewound to {kept}")
        np.testing.assert_allclose(backend.decode(tail[0]), reference.decode(tail[0]), atol=1e-5)
    backend.reset()
    whole = backend.prefill(np.array(ids[:5] + tail), keep_logits=3)
    backend.reset()
    backend.prefill(np.array(ids))
    backend.rewind(5)
    np.testing.assert_allclose(backend.prefill(np.array(tail), keep_logits=3), whole, atol=1e-4)


def test_the_torch_device_copies_pitched_rows_and_refuses_a_copy_past_a_buffer():
    """TorchDevice.copy_2d, over CPU tensors here (the arithmetic of the views it copies between is the GPU's)."""
    from edgesdk.runtime.tensorrt_backend import TorchDevice, _Buffer

    device = object.__new__(TorchDevice)
    device.torch, device.stream = torch, None
    src_bytes = torch.arange(48, dtype=torch.uint8)
    dst_bytes = torch.full((40,), 255, dtype=torch.uint8)
    src, dst = _Buffer(0, 48, src_bytes), _Buffer(0, 40, dst_bytes)
    device.copy_2d(dst, 4, src, 16, 4, 3)  # 3 rows: the first 4 of every 16 bytes, packed
    assert dst_bytes[:12].tolist() == [0, 1, 2, 3, 16, 17, 18, 19, 32, 33, 34, 35]
    assert set(dst_bytes[12:].tolist()) == {255}
    with pytest.raises(RuntimeBackendError, match="pitched copy of 4 rows of 4 bytes from a pitch of 16"):
        device.copy_2d(dst, 4, src, 16, 4, 4)  # the fourth row starts past the source's 48 bytes
    with pytest.raises(RuntimeBackendError, match="rows wider than a pitch"):
        device.copy_2d(dst, 4, src, 16, 8, 2)
