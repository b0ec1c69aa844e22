"""TensorRT backend on a stand-in TensorRT that runs the bundle's real ONNX graph with ONNX Runtime.

TensorRT is not installed here. The stand-in keeps the parts of TensorRT 10's execution API the backend
relies on: shapes outside the optimization profile are refused by ``set_input_shape``, ``execute_async_v3``
fails while any I/O tensor has no address ("Neither address or allocator is set for output tensor ..."),
and the engine reads and writes the addresses it was given (host memory here, bounds-checked).
Real engines: tests/gpu/test_tensorrt.py.
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np
import pytest

from edgesdk.runtime import tensorrt_engine as te
from tests._utils.tensorrt_standin import TensorRTModule

ORT_TYPES = {"tensor(float)": "float32", "tensor(int64)": "int64", "tensor(float16)": "float16"}


def _memory(ptr: int, nbytes: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))


class HostDevice:
    """Device buffers in host memory, with the sizes allocated so that an engine's writes are checked."""

    handle = 0
    label = "host"

    def __init__(self):
        self.sizes: dict[int, int] = {}
        self._keep = []

    def alloc(self, nbytes):
        from edgesdk.runtime.tensorrt_backend import _Buffer

        array = np.zeros(max(int(nbytes), 1), np.uint8)
        self._keep.append(array)
        self.sizes[array.ctypes.data] = int(nbytes)
        return _Buffer(array.ctypes.data, nbytes, array)

    def upload(self, buffer, array):
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        assert data.nbytes <= buffer.nbytes
        buffer.owner[: data.nbytes] = data

    def download(self, buffer, out):
        out.reshape(-1).view(np.uint8)[:] = buffer.owner[: out.nbytes]
        return out

    def synchronize(self):
        pass

    def close(self):
        pass


class OrtTensorRT(TensorRTModule):
    """``tensorrt`` for one engine: the ONNX graph at ``model`` with the profile edgesdk builds for it."""

    def __init__(self, model, graph: dict, device: HostDevice, max_seq: int):
        import onnxruntime as ort

        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        profile = te.profile_shapes(graph, max_seq)
        keep_name = te.io_names(graph)["keep"]
        mode = self.TensorIOMode
        tensors = {t.name: (mode.INPUT, t) for t in session.get_inputs()}
        tensors.update({t.name: (mode.OUTPUT, t) for t in session.get_outputs()})

        class Context:
            def __init__(self):
                self.shapes, self.addresses = {}, {}

            def set_input_shape(self, name, shape):
                low, _, high = profile.shapes[name]
                if not all(lo <= s <= hi for lo, s, hi in zip(low, shape, high, strict=True)):
                    return False
                self.shapes[name] = tuple(shape)
                return True

            def set_tensor_address(self, name, ptr):
                self.addresses[name] = int(ptr)

            def execute_async_v3(self, stream):
                if set(tensors) - set(self.addresses):
                    return False  # TensorRT: "Neither address or allocator is set for output tensor ..."
                feeds = {}
                for name, (kind, info) in tensors.items():
                    if kind != mode.INPUT:
                        continue
                    dtype = np.dtype(ORT_TYPES[info.type])
                    shape = (1,) if name == keep_name else self.shapes[name]
                    count = int(np.prod(shape))
                    feeds[name] = _memory(self.addresses[name], count * dtype.itemsize).view(dtype).reshape(shape)
                    feeds[name] = feeds[name].copy()
                for output, value in zip(session.get_outputs(), session.run(None, feeds), strict=True):
                    name = output.name
                    data = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
                    ptr = self.addresses[name]
                    assert data.nbytes <= device.sizes[ptr], f"{name}: {data.nbytes} bytes into {device.sizes[ptr]}"
                    _memory(ptr, data.nbytes)[:] = data
                return True

        class Engine:
            num_io_tensors = len(tensors)

            def create_execution_context(self):
                return Context()

            def get_tensor_name(self, index):
                return list(tensors)[index]

            def get_tensor_mode(self, name):
                return tensors[name][0]

            def get_tensor_profile_shape(self, name, index):
                return profile.shapes[name]

            def get_tensor_dtype(self, name):
                return ORT_TYPES[tensors[name][1].type]

            def get_tensor_shape(self, name):
                return [d if isinstance(d, int) else -1 for d in tensors[name][1].shape]

            def is_shape_inference_io(self, name):
                return name == keep_name

        class Runtime:
            def __init__(self, logger):
                pass

            def deserialize_cuda_engine(self, plan: bytes):
                return Engine()

        self.Runtime = Runtime


@pytest.fixture(scope="module")
def standard_bundle(tiny_model_dir, tmp_path_factory):
    """An fp32-standard bundle (the graph form 'TensorRT-ready' per its recipe) of the tiny model."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    out = tmp_path_factory.mktemp("standard") / "tiny-standard"
    return build(BuildConfig(target="orin-nano-8gb", model=str(tiny_model_dir), out=out, recipe="fp32-standard",
                             export=ExportConfig(max_context=64), progress=False))


def _tensorrt_backend(bundle, monkeypatch, tmp_path, max_seq):
    from edgesdk.runtime.tensorrt_backend import TensorRTBackend

    graph = bundle.manifest["graph"]
    device = HostDevice()
    monkeypatch.setitem(sys.modules, "tensorrt", OrtTensorRT(bundle.file(graph["file"]), graph, device, max_seq))
    plan = tmp_path / "engine.plan"
    plan.write_bytes(b"plan")
    return TensorRTBackend(plan, graph, device=device)


def test_an_engine_of_an_fp32_standard_bundle_runs_and_matches_onnx_runtime(standard_bundle, monkeypatch, tmp_path):
    """The standard graph also outputs hidden_states; the backend bound only logits and the present cache, so
    TensorRT refused every step of such an engine ("TensorRT failed to run the engine at position 0")."""
    from edgesdk.runtime.session import open_backend

    graph = standard_bundle.manifest["graph"]
    assert "hidden" in graph["outputs"]  # the case this test is about
    backend = _tensorrt_backend(standard_bundle, monkeypatch, tmp_path, max_seq=4)
    reference = open_backend(standard_bundle, ["ort-cpu"], threads=1)[0]
    prompt = np.arange(3, 14, dtype=np.int64)  # 11 tokens: chunks of 4, 4 and 3
    expected = reference.prefill(prompt, keep_logits=len(prompt))
    np.testing.assert_allclose(backend.prefill(prompt, keep_logits=len(prompt)), expected, atol=1e-4)
    for token in (5, 9):
        np.testing.assert_allclose(backend.decode(token), reference.decode(token), atol=1e-4)
    assert backend.position == len(prompt) + 2
    backend.reset()
    reference.reset()
    np.testing.assert_allclose(backend.prefill(prompt, keep_logits=6), reference.prefill(prompt, keep_logits=6),
                               atol=1e-4)


# --- the triton backend on the kernels' PyTorch twins -------------------------------------------


@pytest.fixture(scope="module")
def triton_backend(tmp_path_factory):
    pytest.importorskip("torch")
    from edgesdk.runtime.sparse_decoder import SparseDecoder
    from edgesdk.runtime.triton_backend import TritonBackend
    from tests._utils.tiny import export_tiny_sparse

    _, tensors, record = export_tiny_sparse(tmp_path_factory.mktemp("sparse46"), max_context=64)
    return TritonBackend(SparseDecoder(tensors, record, mode="reference"), "reference")


def test_a_triton_prefill_of_no_tokens_is_refused_as_the_other_backends_refuse_it(triton_backend):
    """It returned an empty (0, vocab) array: a caller taking the next token's logits from its last row got an
    IndexError, where ort-cpu and tensorrt say what is wrong."""
    from edgesdk.errors import RuntimeBackendError

    triton_backend.reset()
    with pytest.raises(RuntimeBackendError, match="prefill of 0 tokens"):
        triton_backend.prefill(np.array([], np.int64))
    assert triton_backend.position == 0
    logits = triton_backend.prefill(np.arange(1, 4), keep_logits=5)  # keep beyond T: every position's row
    assert logits.shape == (3, triton_backend.vocab_size)


@pytest.mark.parametrize("bad", [-1, "vocab"])
def test_token_ids_outside_the_vocabulary_are_refused_by_the_gpu_backends_too(triton_backend, standard_bundle,
                                                                             monkeypatch, tmp_path, bad):
    """A GPU embedding lookup past its table reads memory it should not (the triton twin raised torch's
    IndexError, a negative id read the last row); the ONNX Runtime backends refuse these ids by name, and now
    TensorRT's and Triton's do too, leaving the cache as it was."""
    from edgesdk.errors import RuntimeBackendError

    tensorrt = _tensorrt_backend(standard_bundle, monkeypatch, tmp_path, max_seq=4)
    for backend in (triton_backend, tensorrt):
        token = backend.vocab_size if bad == "vocab" else bad
        backend.reset()
        backend.prefill(np.array([5, 6]))
        with pytest.raises(RuntimeBackendError, match=rf"prefill with token id {token} at position 1"):
            backend.prefill(np.array([7, token]))
        with pytest.raises(RuntimeBackendError, match=rf"decode with token id {token} at position 0"):
            backend.decode(token)
        with pytest.raises(RuntimeBackendError, match="expected whole numbers"):
            backend.prefill(np.array([1.0, 7.9]))
        assert backend.position == 2
    with pytest.raises(RuntimeBackendError, match=rf"hidden states with token id {token} at position 0"):
        triton_backend.hidden_states(np.array([token]))
