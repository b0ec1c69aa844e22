"""TensorRT backend: runs the engine ``edgesdk engine build`` made for this bundle, KV cache on the GPU.

Per step (TensorRT developer guide, "The Python API: Performing Inference" and "Working with
Dynamic Shapes"): ``set_input_shape`` for ``input_ids`` (1, T) and every ``past_key_values.*``
(1, kv, P, hd); ``set_tensor_address`` for every I/O tensor; the ``num_logits_to_keep`` value
in host memory when the engine reports it as a shape-inference input (``is_shape_inference_io``,
"Execution Tensors vs. Shape Tensors"); then ``execute_async_v3`` on our CUDA stream.

The cache never leaves the device: each past/present tensor has two buffers of capacity
(1, kv, max_context, hd). A step reads the past from one and writes the present, (1, kv, P+T,
hd) contiguous, into the other; the next step swaps them, so present becomes past with no copy.
Only ``input_ids`` go up and the kept logits come down. A prefill longer than the profile's
max ``seq`` (``engine.json`` / the engine's profile) runs in chunks against the growing cache.

The engine reads a past tensor as a contiguous (1, kv, P, hd) array from its address, P being the
past length its input shape gives, so the length is part of the layout: head h's entries start at
h * P * hd. ``rewind`` to n < P therefore moves each head's first n entries to where a past of n
has them: on the GPU one pitched device-to-device copy per tensor (the device's ``copy_2d``:
``cudaMemcpy2DAsync``, rows of n * hd entries from a pitch of P * hd into one of n * hd) into that
tensor's buffer of the idle set, which then changes places with the one it was copied from; on a
device without ``copy_2d`` a round trip through host memory (``download`` then ``upload``). A tensor
of one KV head holds them in place already. ``save_cache`` downloads the (1, kv, P, hd) arrays,
``load_cache`` uploads such arrays back (``edgesdk.runtime.prompt_cache``, ``cache_store``).

Device memory comes from torch CUDA tensors when torch with CUDA is importable, else from
cuda-python (``cuda.bindings.runtime``, or ``cuda.cudart`` before cuda-python 12.6).
"""

from __future__ import annotations

import weakref
from pathlib import Path

import numpy as np

from edgesdk.bundle import capped_context, context_fix
from edgesdk.errors import RuntimeBackendError
from edgesdk.runtime import tensorrt_engine as te
from edgesdk.runtime.backend import (
    checked_cache_state,
    checked_decode_id,
    checked_keep_logits,
    checked_rewind,
    checked_token_ids,
    prefill_passes,
)


class _Buffer:
    """A device allocation: its address, and whatever keeps it alive."""

    def __init__(self, ptr: int, nbytes: int, owner=None):
        self.ptr, self.nbytes, self.owner = int(ptr), int(nbytes), owner


class TorchDevice:
    """Device buffers as torch CUDA tensors, copies on one torch stream."""

    label = "torch"

    def __init__(self):
        import torch

        if not torch.cuda.is_available():
            raise RuntimeBackendError("torch here has no CUDA device", "install a CUDA build of torch or cuda-python")
        self.torch = torch
        self.stream = torch.cuda.Stream()
        self.handle = int(self.stream.cuda_stream)

    def alloc(self, nbytes: int) -> _Buffer:
        tensor = self.torch.empty(max(int(nbytes), 1), dtype=self.torch.uint8, device="cuda")
        return _Buffer(tensor.data_ptr(), nbytes, tensor)

    def upload(self, buffer: _Buffer, array: np.ndarray) -> None:
        host = self.torch.from_numpy(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
        with self.torch.cuda.stream(self.stream):
            buffer.owner[: host.numel()].copy_(host)

    def download(self, buffer: _Buffer, out: np.ndarray) -> np.ndarray:
        """Copy the first ``out.nbytes`` of ``buffer`` into ``out`` after the stream's work is done."""
        with self.torch.cuda.stream(self.stream):
            data = buffer.owner[: out.nbytes].cpu()  # a blocking copy on this stream
        out.reshape(-1).view(np.uint8)[:] = data.numpy()
        return out

    def copy_2d(self, dst: _Buffer, dst_pitch: int, src: _Buffer, src_pitch: int, width: int, rows: int) -> None:
        """Copy ``rows`` rows of ``width`` bytes from ``src`` (one every ``src_pitch`` bytes) to ``dst`` (one every
        ``dst_pitch``) on the stream, device to device, as ``cudaMemcpy2DAsync`` does; the two must not overlap."""
        _check_2d(dst, dst_pitch, src, src_pitch, width, rows)
        with self.torch.cuda.stream(self.stream):
            dst.owner.as_strided((rows, width), (dst_pitch, 1)).copy_(src.owner.as_strided((rows, width),
                                                                                          (src_pitch, 1)))

    def synchronize(self) -> None:
        self.stream.synchronize()

    def close(self) -> None:
        self.synchronize()


class CudaPythonDevice:
    """Device buffers from cudaMalloc through cuda-python, copies with cudaMemcpyAsync on one stream."""

    label = "cuda-python"

    def __init__(self):
        try:
            from cuda.bindings import runtime as cudart
        except ImportError:
            try:
                from cuda import cudart
            except ImportError as exc:
                raise RuntimeBackendError(f"neither torch with CUDA nor cuda-python is importable ({exc})",
                                          "pip install cuda-python (matching the board's CUDA major version)") from exc
        self.cudart = cudart
        self.stream = self._call(cudart.cudaStreamCreate(), "cudaStreamCreate")
        self.handle = int(self.stream)
        self._buffers: list[_Buffer] = []
        # cudaMalloc'd memory has no owner Python frees: a device (and the backend holding it) let go without
        # close() kept its KV cache on the GPU until the process ended, where torch's tensors and an ONNX Runtime
        # session are given back with their last reference. Not at interpreter exit: the process's end frees them.
        self._release = weakref.finalize(self, _release_cuda, cudart, self._buffers, self.stream)
        self._release.atexit = False

    def _call(self, result, what: str):
        err, *rest = result if isinstance(result, tuple) else (result,)
        if err != self.cudart.cudaError_t.cudaSuccess:
            raise RuntimeBackendError(f"CUDA call {what} failed: {err}", "check the GPU with 'edgesdk env'")
        return rest[0] if len(rest) == 1 else rest

    def alloc(self, nbytes: int) -> _Buffer:
        ptr = self._call(self.cudart.cudaMalloc(max(int(nbytes), 1)), "cudaMalloc")
        buffer = _Buffer(int(ptr), nbytes)
        self._buffers.append(buffer)
        return buffer

    def upload(self, buffer: _Buffer, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        self._call(self.cudart.cudaMemcpyAsync(buffer.ptr, array.ctypes.data, array.nbytes,
                                               self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, self.stream),
                   "cudaMemcpyAsync")
        self.synchronize()  # the host array is pageable and temporary

    def download(self, buffer: _Buffer, out: np.ndarray) -> np.ndarray:
        self._call(self.cudart.cudaMemcpyAsync(out.ctypes.data, buffer.ptr, out.nbytes,
                                               self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost, self.stream),
                   "cudaMemcpyAsync")
        self.synchronize()
        return out

    def copy_2d(self, dst: _Buffer, dst_pitch: int, src: _Buffer, src_pitch: int, width: int, rows: int) -> None:
        """Copy ``rows`` rows of ``width`` bytes from ``src`` (one every ``src_pitch`` bytes) to ``dst`` (one every
        ``dst_pitch``) on the stream, device to device (``cudaMemcpy2DAsync``); the two must not overlap."""
        _check_2d(dst, dst_pitch, src, src_pitch, width, rows)
        self._call(self.cudart.cudaMemcpy2DAsync(dst.ptr, dst_pitch, src.ptr, src_pitch, width, rows,
                                                 self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice, self.stream),
                   "cudaMemcpy2DAsync")

    def synchronize(self) -> None:
        self._call(self.cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")

    def close(self) -> None:
        """Free the buffers and the stream (once: a second call does nothing, nor does the collection of the device)."""
        if self.stream is None:
            return
        self.synchronize()
        self._release()
        self.stream = None


def _check_2d(dst: _Buffer, dst_pitch: int, src: _Buffer, src_pitch: int, width: int, rows: int) -> None:
    """Refuse a pitched copy that would read or write past either buffer, or whose rows are wider than a pitch."""
    if width > min(dst_pitch, src_pitch) or (rows - 1) * src_pitch + width > src.nbytes \
            or (rows - 1) * dst_pitch + width > dst.nbytes:
        raise RuntimeBackendError(f"a pitched copy of {rows} rows of {width} bytes from a pitch of {src_pitch} "
                                  f"({src.nbytes} bytes) to one of {dst_pitch} ({dst.nbytes} bytes) does not fit: "
                                  "rows wider than a pitch, or past a buffer's end",
                                  "report this as a bug in edgesdk's TensorRT backend")


def _release_cuda(cudart, buffers: list[_Buffer], stream) -> None:
    """Free a :class:`CudaPythonDevice`'s ``buffers`` and destroy its ``stream``: at its close, or when it is collected
    unclosed (cudaFree waits for the device's work first; cudaStreamDestroy lets the stream's work finish)."""
    for buffer in buffers:
        cudart.cudaFree(buffer.ptr)
    buffers.clear()
    cudart.cudaStreamDestroy(stream)


def open_device():
    """torch CUDA if importable with a device, else cuda-python; RuntimeBackendError naming both."""
    try:
        return TorchDevice()
    except ImportError as torch_exc:
        reason = f"torch is not importable ({torch_exc})"
    except RuntimeBackendError as exc:
        reason = exc.problem
    except Exception as exc:  # a torch whose CUDA libraries do not load (OSError, ValueError), a failing CUDA init
        reason = f"torch cannot be used ({type(exc).__name__}: {exc})"
    try:
        return CudaPythonDevice()
    except RuntimeBackendError as exc:
        raise RuntimeBackendError(f"no way to allocate CUDA memory from Python: {reason}; {exc.problem}",
                                  exc.fix) from exc


class TensorRTBackend:
    """Drives a TensorRT engine of the standard decoder graph (export/llama_graph.py interface)."""

    name = "tensorrt"
    # the model's max_position_embeddings its bundle's manifest records (edgesdk.runtime.session.open_backend), which
    # a refusal of a sequence past max_context names as the most a rebuild gives; None: not recorded, or not opened
    # from one
    model_positions: int | None = None
    # the context the bundle was built with where the run holds less (llama.cpp's -c N: Runtime.cap_context sets it
    # as it lowers max_context), which a refusal past max_context names, with raising -c as its fix; None: uncapped
    built_context: int | None = None
    # what held the run there (Runtime.cap_context's ``source``: -c, LLAMA_ARG_CTX_SIZE, load()'s n_ctx), which that
    # refusal names, and whose setting its fix raises
    context_source: str = "-c"

    def __init__(self, engine_path: Path, graph: dict, info: dict | None = None, device=None):
        trt = te.import_tensorrt()
        self._trt = trt
        self.info = info or {}
        self.kv_heads = [int(kv) for kv in graph["kv_heads"]]
        self.head_dim = int(graph["head_dim"])
        self.max_context = int(graph["max_context"])
        self.vocab_size = int(graph["vocab_size"])
        self.names = te.io_names(graph)
        self._closed = False
        self.device = device or open_device()
        try:
            self._load(Path(engine_path))
        except BaseException:  # the chain may open another GPU backend next: free what this one took
            try:
                self.device.close()
            except Exception:  # the error that stopped the load is the one to report
                pass
            raise

    def _load(self, engine_path: Path) -> None:
        """Deserialize the engine, check its I/O, allocate the device buffers (the device frees them on failure)."""
        trt = self._trt
        self._logger = te.stderr_logger(trt)  # not trt.Logger: it writes to stdout, where the answer goes
        self._runtime = trt.Runtime(self._logger)
        self.engine = self._runtime.deserialize_cuda_engine(engine_path.read_bytes())
        if self.engine is None:
            raise RuntimeBackendError(f"TensorRT {trt.__version__} could not deserialize {engine_path}",
                                      "rebuild it: edgesdk engine build BUNDLE --force (engines are tied to the "
                                      "TensorRT version and GPU that built them)")
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise RuntimeBackendError(f"TensorRT could not create an execution context for {engine_path}",
                                      "free GPU memory (stop other engines or services) and try again")
        self._check_io(engine_path)
        ids, keep, logits = self.names["ids"], self.names["keep"], self.names["logits"]
        self.max_seq = int(self.engine.get_tensor_profile_shape(ids, 0)[2][1])
        self._dtype = {name: np.dtype(trt.nptype(self.engine.get_tensor_dtype(name)))
                       for name in [ids, keep, logits, *self.names["past"], *self.names["present"]]}
        for past, present in zip(self.names["past"], self.names["present"], strict=True):
            if self._dtype[past] != self._dtype[present]:
                raise RuntimeBackendError(f"engine {engine_path} has {past} as {self._dtype[past]} but {present} as "
                                          f"{self._dtype[present]}; the cache swap needs one type",
                                          "rebuild it with this edgesdk: edgesdk engine build BUNDLE --force")
        self._keep_on_host = bool(self.engine.is_shape_inference_io(keep))
        self._keep_host = np.ones(1, self._dtype[keep])  # stays alive: TensorRT reads it at enqueue
        self._ids = self.device.alloc(self.max_seq * self._dtype[ids].itemsize)
        self._keep = None if self._keep_on_host else self.device.alloc(self._dtype[keep].itemsize)
        self._logits = self.device.alloc(self.max_seq * self.vocab_size * self._dtype[logits].itemsize)
        kv_per_tensor = [kv for kv in self.kv_heads for _ in range(2)]
        self._kv = [[self.device.alloc(kv * self.max_context * self.head_dim * self._dtype[past].itemsize)
                     for kv, past in zip(kv_per_tensor, self.names["past"], strict=True)] for _ in range(2)]
        self._kv_heads_per_tensor = kv_per_tensor
        self._extra = self._extra_outputs()
        self.reset()

    def _extra_outputs(self) -> dict[str, _Buffer]:
        """A scratch buffer for every engine output the backend does not read.

        ``execute_async_v3`` refuses to run while any output tensor has neither an address nor an output
        allocator (TensorRT 8.x -> 10.x migration guide: call setTensorAddress for each I/O tensor before
        enqueueV3; TensorRT logs "Neither address or allocator is set for output tensor ..."). The standard
        graph of an fp32-standard bundle also outputs ``hidden_states`` (batch, seq, hidden) for embeddings
        (export/llama_graph.py), so its engine has one more output than logits and the present cache. Each
        dynamic dimension of such an output is batch (1) or a count of tokens (at most max_context), which
        bounds the buffer."""
        known = {self.names["logits"], *self.names["present"]}
        extra = {}
        for index in range(self.engine.num_io_tensors):
            name = self.engine.get_tensor_name(index)
            if name in known or self.engine.get_tensor_mode(name) != self._trt.TensorIOMode.OUTPUT:
                continue
            dims = [int(d) for d in self.engine.get_tensor_shape(name)]
            count = 1
            for axis, dim in enumerate(dims):
                count *= dim if dim >= 0 else (1 if axis == 0 else self.max_context)
            itemsize = np.dtype(self._trt.nptype(self.engine.get_tensor_dtype(name))).itemsize
            extra[name] = self.device.alloc(count * itemsize)
        return extra

    def _check_io(self, engine_path: Path) -> None:
        trt = self._trt
        tensors = {self.engine.get_tensor_name(i): self.engine.get_tensor_mode(self.engine.get_tensor_name(i))
                   for i in range(self.engine.num_io_tensors)}
        wanted = {name: trt.TensorIOMode.INPUT for name in [self.names["ids"], self.names["keep"], *self.names["past"]]}
        wanted.update({name: trt.TensorIOMode.OUTPUT for name in [self.names["logits"], *self.names["present"]]})
        missing = [name for name, mode in wanted.items() if tensors.get(name) != mode]
        if missing:
            raise RuntimeBackendError(f"engine {engine_path} lacks the decoder I/O {missing[:4]}",
                                      "rebuild it from this bundle: edgesdk engine build BUNDLE --force")

    @property
    def position(self) -> int:
        """Tokens currently in the KV cache."""
        return self._position

    def reset(self) -> None:
        self._position = 0
        self._current = 0  # which of the two KV buffer sets holds the past

    def rewind(self, length: int) -> None:
        """Keep the first ``length`` cached tokens, so the next prefill continues after them. A past tensor of more
        than one KV head is laid out by its length (module docstring): its kept entries are copied contiguous as
        (1, kv, length, hd), on the GPU device to device into the tensor's idle buffer (which then holds the past),
        on a device without ``copy_2d`` through host memory; one of a single KV head holds them in place. A length
        that is no whole number from 0 to the position is refused by name (:func:`checked_rewind`), as the other
        backends refuse it. A copy that fails halfway leaves an empty cache, never one whose entries no longer
        match its tokens."""
        self._check_open("rewind")
        length = checked_rewind(length, self._position)
        if length == 0:
            self.reset()
            return
        if length == self._position:
            return
        copy_2d = getattr(self.device, "copy_2d", None)
        try:
            for index, buffer in enumerate(self._kv[self._current]):
                if self._kv_heads_per_tensor[index] <= 1:
                    continue
                if copy_2d is None:
                    self.device.upload(buffer, np.ascontiguousarray(self._download_past(index)[:, :, :length]))
                    continue
                entry = self.head_dim * self._dtype[self.names["past"][index]].itemsize  # bytes per position
                idle = self._kv[1 - self._current][index]  # written by the next step only: free until then
                copy_2d(idle, length * entry, buffer, self._position * entry, length * entry,
                        self._kv_heads_per_tensor[index])
                self._kv[self._current][index], self._kv[1 - self._current][index] = idle, buffer
        except BaseException:
            self.reset()
            raise
        self._position = length

    def save_cache(self) -> tuple[list[np.ndarray], int]:
        """A host copy of the cache, (1, kv, position, hd) per past tensor in the engine's cache type, and its
        bytes."""
        self._check_open("save_cache")
        state = [self._download_past(index) for index in range(len(self.names["past"]))]
        return state, sum(array.nbytes for array in state)

    def load_cache(self, state: list[np.ndarray]) -> None:
        """Upload a :meth:`save_cache` copy into the cache (the copy is only read). One that does not fit this
        engine's cache (another bundle's, another cache type, past max_context) is refused by name before the
        cache changes (:func:`checked_cache_state`); an upload that fails leaves an empty cache."""
        self._check_open("load_cache")
        length = checked_cache_state(state, self.kv_heads, self.head_dim, self._dtype[self.names["past"][0]],
                                     self.max_context)
        self.reset()
        if length:
            for buffer, array in zip(self._kv[self._current], state, strict=True):
                self.device.upload(buffer, array)
        self._position = length

    def _download_past(self, index: int) -> np.ndarray:
        """Past tensor ``index`` as the engine reads it now: (1, kv, position, hd) from the current buffer set."""
        shape = (1, self._kv_heads_per_tensor[index], self._position, self.head_dim)
        out = np.empty(shape, self._dtype[self.names["past"][index]])
        if out.size == 0:  # nothing to copy (an empty cache)
            return out
        return self.device.download(self._kv[self._current][index], out)

    def close(self) -> None:
        """Give back the engine (the model's weights on the GPU), its execution context and the device buffers (the
        KV cache) now, as the ONNX Runtime backends' close does, rather than when the last reference to this backend
        goes. Every later prefill or decode is a RuntimeBackendError naming the closed backend (the device buffers
        the engine would write are gone); closing again does nothing, also after a device close that raised (its
        error is raised once, and the engine, context and buffers are let go all the same)."""
        if self._closed:
            return
        self._closed = True
        self._position = 0
        try:
            self.device.close()  # waits for the stream's work before the buffers go
        finally:
            self.context = self.engine = self._runtime = None
            self._ids = self._keep = self._logits = None
            self._kv, self._extra = [], {}

    def _check_open(self, call: str) -> None:
        if self._closed:
            raise RuntimeBackendError(f"{call} on the closed tensorrt backend: close() gave back its TensorRT engine "
                                      "and the GPU buffers of its KV cache",
                                      "open the bundle again (edgesdk.load, or open_runtime) to run it; a closed "
                                      "backend stays closed")

    def _check_length(self, total: int) -> None:
        if total > self.max_context:
            exceeded = capped_context(self.max_context, self.built_context, self.context_source) or \
                f"the bundle's max_context {self.max_context}"
            raise RuntimeBackendError(
                f"sequence of {total} tokens exceeds {exceeded}",
                context_fix("shorten the prompt or --max-new-tokens", self.max_context, self.model_positions, total,
                            built=self.built_context, source=self.context_source),
            )

    def _set_shape(self, name: str, shape: tuple[int, ...]) -> None:
        if not self.context.set_input_shape(name, shape):
            raise RuntimeBackendError(f"TensorRT refused shape {shape} for {name} (outside the engine's profile: "
                                      f"seq <= {self.max_seq}, past < {self.max_context})",
                                      "rebuild the engine for this bundle: edgesdk engine build BUNDLE --force")

    def _step(self, ids: np.ndarray, keep: int) -> np.ndarray:
        """One engine run over ``ids`` (T <= max_seq) after the cache; logits (keep, vocab)."""
        steps, past_len = ids.shape[0], self._position
        names, context = self.names, self.context
        self.device.upload(self._ids, ids.astype(self._dtype[names["ids"]]))
        self._set_shape(names["ids"], (1, steps))
        context.set_tensor_address(names["ids"], self._ids.ptr)
        self._keep_host[0] = keep
        if self._keep_on_host:
            context.set_tensor_address(names["keep"], self._keep_host.ctypes.data)
        else:
            self.device.upload(self._keep, self._keep_host)
            context.set_tensor_address(names["keep"], self._keep.ptr)
        past, present = self._kv[self._current], self._kv[1 - self._current]
        for index, (past_name, present_name) in enumerate(zip(names["past"], names["present"], strict=True)):
            self._set_shape(past_name, (1, self._kv_heads_per_tensor[index], past_len, self.head_dim))
            context.set_tensor_address(past_name, past[index].ptr)
            context.set_tensor_address(present_name, present[index].ptr)
        context.set_tensor_address(names["logits"], self._logits.ptr)
        for name, buffer in self._extra.items():  # written, never read (hidden_states)
            context.set_tensor_address(name, buffer.ptr)
        if not context.execute_async_v3(self.device.handle):
            raise RuntimeBackendError(f"TensorRT failed to run the engine at position {past_len} (+{steps} tokens)",
                                      "see TensorRT's log above; rebuild the engine with --force if it persists")
        logits = self.device.download(self._logits, np.empty((keep, self.vocab_size), self._dtype[names["logits"]]))
        self._current = 1 - self._current  # present -> next past, no copy
        self._position += steps
        return logits.astype(np.float32, copy=False)

    def prefill(self, token_ids: np.ndarray, keep_logits: int = 1) -> np.ndarray:
        """Run ``token_ids`` (T,) after the cache in chunks of max_seq; logits of the last ``keep_logits``. 0 tokens
        is refused as the other backends refuse it, before the ids' dtype: an empty list is float64 to numpy, and was
        named as ids that are no whole numbers."""
        self._check_open("prefill")
        keep_logits = checked_keep_logits(keep_logits)
        if np.asarray(token_ids).size == 0:
            raise RuntimeBackendError("prefill of 0 tokens: there is no position whose logits it could return",
                                      "pass at least one token id (the prompt's last token gives the next "
                                      "token's logits)")
        ids = checked_token_ids(token_ids, self.vocab_size, "prefill")[0]  # (T,): a GPU Gather past the table reads stray memory
        total = ids.shape[0]
        keep = min(keep_logits, total)
        self._check_length(self._position + total)
        kept = []
        for start, end, rows in prefill_passes(total, keep, self.max_seq):
            logits = self._step(ids[start:end], max(rows, 1))
            if rows:
                kept.append(logits[-rows:])
        return np.concatenate(kept, axis=0)

    def decode(self, token_id: int) -> np.ndarray:
        self._check_open("decode")
        self._check_length(self._position + 1)
        return self._step(checked_decode_id(token_id, self.vocab_size)[0], 1)[0]  # one id: several are refused


def open_tensorrt_backend(bundle, threads: int | None = None) -> TensorRTBackend:
    """The ``tensorrt`` backend for a bundle, or RuntimeBackendError with the reason it cannot run here."""
    del threads  # the GPU does the work; kept for the opener signature
    graph = bundle.manifest["graph"]
    te.check_graph_form(graph)
    # the bundle's target picks the fix: JetPack's python3-libnvinfer on a Jetson's, pip's tensorrt on an x86 GPU's
    target = bundle.manifest.get("target")
    trt = te.import_tensorrt(target, bundle.path)
    sm = te.require_sm(target, bundle.path)
    directory, info = te.find_engine(bundle.path, bundle.bundle_id, trt.__version__, sm, te.board_jetpack())
    try:
        return TensorRTBackend(directory / te.ENGINE_FILE, graph, info)
    except RuntimeBackendError:
        raise
    except Exception as exc:  # TensorRT and CUDA raise their own exception types
        raise RuntimeBackendError(f"loading {directory / te.ENGINE_FILE} failed: {type(exc).__name__}: {exc}",
                                  "rebuild it with 'edgesdk engine build BUNDLE --force'") from exc
