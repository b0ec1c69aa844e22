"""The triton backend gives back what it holds when it is closed, as the ONNX Runtime and TensorRT backends do: its
decoder (the block-sparse weights, the KV cache, a captured CUDA graph) and the bundle's compiled kernels, whose
modules (``cuModuleLoadData``) and scratch (``cuMemAlloc``) were never unloaded or freed. The backend runs here on
the kernels' PyTorch twins (``reference``) and Triton's interpreter (``emulated``); the CUDA driver path of the loader
runs the real ``_CudaPythonDriver`` over a stand-in of cuda-python's ``driver`` module that records each call (no
cuda-python or GPU here); tests/gpu has the GPU check."""

from __future__ import annotations

import gc
import importlib.util
import json
import weakref
from types import SimpleNamespace

import numpy as np
import pytest

from edgesdk.errors import RuntimeBackendError

torch = pytest.importorskip("torch")

from edgesdk.kernels import loader  # noqa: E402
from edgesdk.kernels.loader import KernelLoadError, load_compiled  # noqa: E402
from edgesdk.runtime.backend import close_backend  # noqa: E402
from edgesdk.runtime.sparse_decoder import SparseDecoder  # noqa: E402
from edgesdk.runtime.triton_backend import TritonBackend, load_aot_kernels  # noqa: E402
from tests.unit.test_kernel_loader import write_kernel_dir  # noqa: E402

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="the interpreted kernel needs triton (pip install edgesdk[kernels])")
GEMV = "bsr_gemv_plain_32x32_fp16"


@pytest.fixture(scope="module")
def tiny_sparse(tmp_path_factory):
    from tests._utils.tiny import export_tiny_sparse

    _, tensors, record = export_tiny_sparse(tmp_path_factory.mktemp("sparse59"), max_context=64)
    return tensors, record


# ---------------------------------------------------------------------------------------------- the backend
@pytest.mark.parametrize("mode", ["reference", pytest.param("emulated", marks=needs_triton)])
def test_close_gives_back_the_decoder_and_refuses_every_later_step_by_name(tiny_sparse, mode):
    """close_backend did nothing for the triton backend: its weights and KV cache lived as long as the backend, and a
    step after the server closed it ran on as if open."""
    tensors, record = tiny_sparse
    backend = TritonBackend(SparseDecoder(tensors, record, mode=mode), mode)
    backend.prefill(np.array([3, 5, 7]), keep_logits=1)
    state, _ = backend.save_cache()
    decoder, cache = weakref.ref(backend.decoder), weakref.ref(backend.decoder.cache[0][0])
    close_backend(backend)
    gc.collect()
    assert decoder() is None  # the weights are given back
    assert cache() is None  # and the KV cache
    calls = {"decode": lambda: backend.decode(3), "prefill": lambda: backend.prefill(np.array([3])),
             "hidden_states": lambda: backend.hidden_states(np.array([3])), "rewind": lambda: backend.rewind(0),
             "save_cache": backend.save_cache, "load_cache": lambda: backend.load_cache(state)}
    for call, run in calls.items():
        with pytest.raises(RuntimeBackendError) as refused:
            run()
        assert refused.value.problem.startswith(f"{call} on the closed triton backend"), call
        assert "open the bundle again" in refused.value.fix
    assert backend.position == 0
    backend.reset()  # nothing to empty
    backend.close()  # closing again does nothing
    with pytest.raises(RuntimeBackendError, match="decode on the closed triton backend"):
        backend.decode(3)


# ---------------------------------------------------------------------------------------------- the CUDA driver path
class RecordedCudaDriver:
    """Stands in for cuda-python's ``driver`` module: each call the loader makes is recorded as (name, *args) and
    answers CUDA_SUCCESS (0) with made-up handles, except the ``cuModuleGetFunction`` calls numbered in ``refuse``."""

    class CUdevice_attribute:  # noqa: N801 - cuda-python's name
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = "major"
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = "minor"

    def __init__(self, refuse=()):
        self.calls: list[tuple] = []
        self.refuse, self._next = set(refuse), 0x1000

    def _handle(self) -> int:
        self._next += 0x1000
        return self._next

    def __getattr__(self, name):
        if not name.startswith("cu"):
            raise AttributeError(name)

        def call(*args):
            self.calls.append((name, *args))
            if name == "cuGetErrorName":
                return 0, b"CUDA_ERROR_NOT_FOUND"
            if name == "cuDeviceGetAttribute":
                return 0, {"major": 8, "minor": 7}[args[0]]
            if name == "cuCtxGetCurrent":
                return 0, 0  # no current context: the driver retains the primary one
            if name == "cuModuleGetFunction" and self.count(name) in self.refuse:
                return 500,  # CUDA_ERROR_NOT_FOUND
            if name in ("cuDeviceGet", "cuCtxGetDevice"):
                return 0, 0
            if name in ("cuDevicePrimaryCtxRetain", "cuModuleLoadData", "cuModuleGetFunction", "cuMemAlloc"):
                return 0, self._handle()
            return (0,)
        return call

    def count(self, name: str) -> int:
        return sum(1 for call in self.calls if call[0] == name)


def _loaded(monkeypatch, tmp_path, driver_module):
    kernel_dir = write_kernel_dir(tmp_path)
    meta_path = kernel_dir / f"{GEMV}.json"
    meta = json.loads(meta_path.read_text())
    meta["global_scratch_size"] = 64  # bytes per program: the launch allocates scratch (cuMemAlloc)
    meta_path.write_text(json.dumps(meta))
    monkeypatch.setattr(loader, "select_driver",
                        lambda backend=None, device=0: loader._CudaPythonDriver(driver_module, device))
    return kernel_dir


def _modules(driver_module) -> list[int]:
    """The module handles cuModuleGetFunction was asked about: each one cuModuleLoadData returned."""
    return [call[1] for call in driver_module.calls if call[0] == "cuModuleGetFunction"]


def test_closing_the_compiled_kernels_unloads_every_module_and_frees_every_scratch(monkeypatch, tmp_path):
    """Each load_compiled kept its modules loaded and its scratch allocated for the life of the process (a server
    that loads a bundle again, or a bench that opens several, held every earlier one's), and scratch a larger grid
    outgrew was dropped without cuMemFree."""
    cuda = RecordedCudaDriver()
    compiled = load_compiled(_loaded(monkeypatch, tmp_path, cuda))
    gemv = compiled[GEMV]
    params = [16 * (i + 1) if ty.startswith("*") else 1 for i, (_, ty) in enumerate(gemv.meta["params"])]
    gemv.launch((2, 1, 1), *params)
    gemv.launch((8, 1, 1), *params)  # outgrows the first scratch
    allocated = [call for call in cuda.calls if call[0] == "cuMemAlloc"]
    assert len(allocated) == 2
    modules = _modules(cuda)
    assert len(modules) == len(compiled)
    before = len(cuda.calls)
    compiled.close()
    closing = cuda.calls[before:]
    names = [call[0] for call in closing if call[0] not in ("cuCtxSetCurrent", "cuCtxPushCurrent", "cuCtxPopCurrent")]
    assert names[0] == "cuCtxSynchronize"  # the work in flight ends before its modules go
    assert sorted(call[1] for call in closing if call[0] == "cuModuleUnload") == sorted(modules)
    assert len([call for call in closing if call[0] == "cuMemFree"]) == 2
    assert names[-1] == "cuDevicePrimaryCtxRelease"  # the context the driver retained
    with pytest.raises(KernelLoadError, match=f"launch of kernel {GEMV} after close"):
        gemv.launch((2, 1, 1), *params)
    closed = len(cuda.calls)
    compiled.close()  # closing again does nothing
    gemv.close()
    assert len(cuda.calls) == closed


def test_a_load_that_fails_midway_unloads_what_it_had_loaded(monkeypatch, tmp_path):
    """A variant refused after others loaded (here cuModuleGetFunction of the third) left the loaded modules, and
    the refused variant's own, loaded for good: the error reached the caller with no handle to give them back."""
    cuda = RecordedCudaDriver(refuse={3})
    with pytest.raises(KernelLoadError, match="cuModuleGetFunction failed: CUDA_ERROR_NOT_FOUND"):
        load_compiled(_loaded(monkeypatch, tmp_path, cuda))
    modules = _modules(cuda)
    assert len(modules) == 3
    assert sorted(call[1] for call in cuda.calls if call[0] == "cuModuleUnload") == sorted(modules)
    assert cuda.count("cuDevicePrimaryCtxRelease") == 1


def test_closing_the_aot_backend_closes_its_compiled_kernels(monkeypatch, tmp_path, tiny_sparse):
    """TritonBackend.close (close_backend, the server's Completer.close) gives the bundle's kernels back too."""
    cuda = RecordedCudaDriver()
    compiled = load_compiled(_loaded(monkeypatch, tmp_path, cuda))
    tensors, record = tiny_sparse
    backend = TritonBackend(SparseDecoder(tensors, record, compiled=compiled), "aot")
    close_backend(backend)
    assert compiled.closed
    assert cuda.count("cuModuleUnload") == len(compiled)


def test_kernels_that_do_not_fit_the_model_are_unloaded_when_the_open_refuses_them(monkeypatch, tmp_path):
    """load_aot_kernels refused kernels lacking a variant the model needs, and left every one it loaded loaded."""
    cuda = RecordedCudaDriver()
    _loaded(monkeypatch, tmp_path / "kernels", cuda)
    record = {"block": 64, "layout": "plain", "head_dim": 64, "kernels": {"sm": 87, "dir": "kernels/sm_87"},
              "layers": [{"heads": 4, "kv_heads": 2, "ffn": 64}]}
    with pytest.raises(RuntimeBackendError, match="lack what this model needs"):
        load_aot_kernels(SimpleNamespace(file=lambda name: tmp_path / name), record)
    assert cuda.count("cuModuleUnload") == cuda.count("cuModuleLoadData") > 0


# ---------------------------------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_close_gives_the_gpu_memory_back(tiny_sparse):
    """On a GPU the decoder's KV cache (and weights, and captured graph) go back when the backend closes."""
    pytest.importorskip("triton")
    tensors, record = tiny_sparse
    backend = TritonBackend(SparseDecoder(tensors, record, device="cuda", mode="triton"), "triton")
    first = int(np.argmax(backend.prefill(np.array([3, 5, 7]))[-1]))
    backend.decode(first)
    backend.decode(first)  # replays the captured graph
    torch.cuda.synchronize()
    cache_bytes = sum(t.numel() * t.element_size() for pair in backend.decoder.cache for t in pair)
    during = torch.cuda.memory_allocated()
    close_backend(backend)
    gc.collect()
    assert torch.cuda.memory_allocated() <= during - cache_bytes
    with pytest.raises(RuntimeBackendError, match="decode on the closed triton backend"):
        backend.decode(first)
