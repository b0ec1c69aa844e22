"""TensorRT backend review: device memory given back with the backend, on the stand-in TensorRT of
tests/unit/test_gpu_runtime46.py (which runs the bundle's ONNX graph) and a stand-in cuda-python runtime."""

from __future__ import annotations

import gc
import sys
import types

import pytest

from tests.unit.test_gpu_runtime46 import HostDevice, OrtTensorRT, standard_bundle  # noqa: F401 - fixture: a tiny fp32-standard bundle


class CudaRuntime:
    """``cuda.bindings.runtime`` as far as CudaPythonDevice calls it, keeping the live allocations and streams."""

    class cudaError_t:  # noqa: N801  (cuda-python's names)
        cudaSuccess = 0

    def __init__(self):
        self.live: dict[int, int] = {}
        self.streams: set[int] = set()
        self._next = 0x1000

    def cudaStreamCreate(self):  # noqa: N802
        self._next += 0x10
        self.streams.add(self._next)
        return 0, self._next

    def cudaStreamSynchronize(self, stream):  # noqa: N802
        return (0,)

    def cudaStreamDestroy(self, stream):  # noqa: N802
        self.streams.discard(stream)
        return (0,)

    def cudaMalloc(self, nbytes):  # noqa: N802
        self._next += 0x1000 + nbytes
        self.live[self._next] = nbytes
        return 0, self._next

    def cudaFree(self, ptr):  # noqa: N802
        self.live.pop(ptr)
        return (0,)


@pytest.fixture
def cudart(monkeypatch):
    """A stand-in cuda-python, the device open_device falls back to where torch sees no CUDA device."""
    return installed_as_cuda_python(CudaRuntime(), monkeypatch)


def installed_as_cuda_python(runtime, monkeypatch):
    """``runtime`` importable as ``cuda.bindings.runtime`` for the test; returned."""
    bindings = types.ModuleType("cuda.bindings")
    bindings.runtime = runtime
    package = types.ModuleType("cuda")
    package.bindings = bindings
    monkeypatch.setitem(sys.modules, "cuda", package)
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", runtime)
    return runtime


def _backend_on_cuda_python(bundle, monkeypatch, tmp_path):
    from edgesdk.runtime.tensorrt_backend import CudaPythonDevice, TensorRTBackend

    graph = bundle.manifest["graph"]
    # the stand-in keeps the device it is given (for its bounds checks) as long as it is the imported tensorrt
    monkeypatch.setitem(sys.modules, "tensorrt", OrtTensorRT(bundle.file(graph["file"]), graph, HostDevice(), 8))
    device = CudaPythonDevice()
    plan = tmp_path / "engine.plan"
    plan.write_bytes(b"plan")
    return TensorRTBackend(plan, graph, device=device)


def test_a_tensorrt_backend_let_go_without_close_gives_its_cuda_python_memory_back(standard_bundle, cudart,  # noqa: F811
                                                                                  monkeypatch, tmp_path):
    """cudaMalloc'd buffers (the KV cache, twice over) and the stream stayed allocated until the process ended when
    the backend's last reference went without close(), as a model reloaded at a Python prompt or in a notebook lets
    the previous one go; torch's tensors and an ONNX Runtime session are freed then."""
    backend = _backend_on_cuda_python(standard_bundle, monkeypatch, tmp_path)
    assert cudart.live
    assert cudart.streams
    del backend
    gc.collect()
    assert cudart.live == {}
    assert cudart.streams == set()


def test_a_closed_cuda_python_device_frees_once_also_when_it_is_collected(standard_bundle, cudart, monkeypatch,  # noqa: F811
                                                                          tmp_path):
    backend = _backend_on_cuda_python(standard_bundle, monkeypatch, tmp_path)
    backend.close()
    assert cudart.live == {}
    assert cudart.streams == set()
    backend.close()
    del backend
    gc.collect()  # a second cudaFree of a pointer would raise KeyError in the stand-in (printed, not raised, by gc)
    assert cudart.live == {}
    assert cudart.streams == set()
