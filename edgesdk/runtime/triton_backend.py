"""Backend ``triton``: the bundle's block-sparse INT8 weights on the Triton decode kernels.

Needs PyTorch (on Jetson: jetson-containers' l4t-pytorch or NVIDIA's JetPack wheel) and a CUDA
device. Without a GPU it runs only when asked for explicitly with ``EDGESDK_KERNELS=reference``
(the kernels' PyTorch twins) or ``emulated`` (Triton's interpreter), which is how it is tested on
a host: the CPU fallback chain should reach ``ort-cpu``, which is much faster there. A machine that shows no GPU
(:func:`cuda_device_seen`) is refused before PyTorch is imported.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import sys

import numpy as np

from edgesdk.bundle import Bundle, capped_context, context_fix, held_setting
from edgesdk.errors import RuntimeBackendError
from edgesdk.runtime.backend import (
    checked_cache_state,
    checked_decode_id,
    checked_keep_logits,
    checked_rewind,
    checked_token_ids,
)

KERNELS_ENV = "EDGESDK_KERNELS"
# what a machine without a CUDA device is told: what is missing and how to run the backend all the same (the kernels'
# PyTorch twins on the CPU); a word for the CPU backends would answer nothing to an explicit --backend triton
NO_CUDA_FIX = (f"run it where an NVIDIA GPU and its driver are, or set {KERNELS_ENV}=reference to run the kernels' "
               "PyTorch reference twin on the CPU")


def cuda_device_seen(root: str = "/") -> bool:
    """Whether this machine shows a GPU that CUDA could run on, found without importing PyTorch (seconds and a few
    hundred MB): a driver device node as ``edgesdk env`` looks for them (edgesdk/envinfo.py GPU_DEVICE_NODES; any
    /dev/nvidiaN, as a container given one GPU has only its own), WSL's /dev/dxg, ROCm's /dev/kfd (PyTorch's cuda
    there), the NVIDIA driver's /proc entry, or nvidia-smi on PATH. False only where none is: a yes is checked by
    PyTorch, which sees what CUDA_VISIBLE_DEVICES hides."""
    from edgesdk.envinfo import GPU_DEVICE_NODES

    nodes = (*GPU_DEVICE_NODES, "dev/dxg", "dev/kfd", "proc/driver/nvidia/gpus")
    if any(os.path.exists(os.path.join(root, node)) for node in nodes):
        return True
    return bool(glob.glob(os.path.join(glob.escape(root), "dev", "nvidia[0-9]*"))) or (
        root == "/" and shutil.which("nvidia-smi") is not None)


class TritonBackend:
    """DecoderBackend over :class:`edgesdk.runtime.sparse_decoder.SparseDecoder`."""

    name = "triton"
    # the context the bundle was built with where the run holds less (llama.cpp's -c N: Runtime.cap_context sets it
    # as it lowers max_context), which a refusal past max_context names, with raising -c as its fix; None: uncapped
    built_context: int | None = None
    # what held the run there (Runtime.cap_context's ``source``: -c, LLAMA_ARG_CTX_SIZE, load()'s n_ctx), which that
    # refusal names, and whose setting its fix raises
    context_source: str = "-c"

    def __init__(self, decoder, mode: str):
        self.decoder, self.mode = decoder, mode
        self._model_positions: int | None = None
        self.max_context = decoder.max_context
        # embedding rows: the ids the model reads (generate and serve refuse others before a prefill; the draft
        # of --draft is checked against them), as the ONNX Runtime and TensorRT backends tell theirs
        self.vocab_size = int(decoder.embed.shape[0])
        self._closed = False

    @property
    def model_positions(self) -> int | None:
        """The model's max_position_embeddings its bundle's manifest records (edgesdk.runtime.session.open_backend),
        which a refusal of a sequence past max_context names as the most a rebuild gives; None: not recorded, or not
        opened from one. Set, it is the decoder's too, whose own refusal names it."""
        return self._model_positions

    @model_positions.setter
    def model_positions(self, positions: int | None) -> None:
        self._model_positions = positions
        if self.decoder is not None:  # a closed backend has no decoder
            self.decoder.model_positions = positions

    @property
    def position(self) -> int:
        return 0 if self._closed else self.decoder.position

    def reset(self) -> None:
        if not self._closed:  # a closed backend's cache is gone already
            self.decoder.reset()

    def close(self) -> None:
        """Give back the block-sparse weights, the KV cache and a captured CUDA graph (the decoder), the bundle's
        compiled kernels (their modules and scratch; :meth:`SparseDecoder.close`), then torch's cached GPU blocks
        now, as the ONNX Runtime and TensorRT backends' close does, rather than when the last reference to this
        backend goes (the loaded modules and scratch not even then). Every later step, rewind or cache copy is a
        RuntimeBackendError naming the closed backend; ``reset`` does nothing, and closing again does nothing, also
        after a close whose kernels raised (the error is raised once, and the rest is let go all the same)."""
        if self._closed:
            return
        self._closed = True
        decoder, self.decoder = self.decoder, None
        try:
            decoder.close()
        finally:
            del decoder  # the weights go with the decoder, before torch's cached blocks are given back
            _give_back_cached_gpu_memory()

    def _check_open(self, call: str) -> None:
        """Refuse ``call`` on a backend :meth:`close` gave back."""
        if self._closed:
            raise RuntimeBackendError(f"{call} on the closed triton backend: close() gave back its block-sparse "
                                      "weights, KV cache and kernels",
                                      "open the bundle again (edgesdk.load, or open_runtime) to run it; a closed "
                                      "backend stays closed")

    def rewind(self, length: int) -> None:
        """Keep the first ``length`` cached tokens (entries past the position are never read). A length that is no
        whole number from 0 to the position is refused by name (:func:`checked_rewind`), as the ONNX Runtime backends
        refuse it: 2.5 became the decoder's position, and the next step failed in torch's words."""
        self._check_open("rewind")
        self.decoder.position = checked_rewind(length, self.decoder.position)

    def save_cache(self) -> tuple[list, int]:
        """A host copy of the cache's first ``position`` entries, (B, Hkv, position, hd) per layer and kind."""
        self._check_open("save_cache")
        length = self.decoder.position
        state = [tensor[:, :, :length].to("cpu", copy=True) for pair in self.decoder.cache for tensor in pair]
        return state, sum(tensor.numel() * tensor.element_size() for tensor in state)

    def load_cache(self, state: list) -> None:
        """Copy a :meth:`save_cache` state into the decoder's cache (grown to hold it), once it is checked to fit
        (:meth:`_checked_state`)."""
        self._check_open("load_cache")
        decoder = self.decoder
        length = self._checked_state(state)
        decoder.position = 0  # nothing of the old cache is kept through a reallocation
        if length > decoder.capacity:
            decoder._grow(min(decoder.max_context, max(2 * decoder.capacity, length)))
        tensors = [tensor for pair in decoder.cache for tensor in pair]
        for tensor, saved in zip(tensors, state, strict=True):
            tensor[:, :, :length].copy_(saved)
        decoder.position = length

    def _checked_state(self, state: object) -> int:
        """The length of a :meth:`save_cache` ``state`` this backend's cache can take (:func:`checked_cache_state`)."""
        return checked_cache_state(state, [kv for _, kv in self.decoder.layer_heads], self.decoder.head_dim, self.decoder.cache_dtype,
                                   self.max_context)

    def _run(self, ids: np.ndarray, keep: int) -> np.ndarray:
        import torch

        total = self.decoder.position + len(ids)
        if total > self.max_context:
            exceeded = capped_context(self.max_context, self.built_context, self.context_source) or \
                f"the bundle's max_context {self.max_context}"
            raise RuntimeBackendError(
                f"sequence of {total} tokens exceeds {exceeded}",
                context_fix("shorten the prompt or --max-new-tokens", self.max_context, self.model_positions, total,
                            built=self.built_context, source=self.context_source),
            )
        logits = self.decoder.step(torch.as_tensor(np.asarray(ids, np.int64)), keep)
        return logits.float().cpu().numpy()

    def prefill(self, token_ids: np.ndarray, keep_logits: int = 1) -> np.ndarray:
        """Run ``token_ids`` (T,) after the cache; the logits of the last ``min(keep_logits, T)`` positions
        (the DecoderBackend contract, edgesdk/runtime/backend.py). 0 tokens is refused, as the ONNX Runtime and
        TensorRT backends refuse it: the decoder returned an empty (0, vocab) array, with no row for the
        next token. It is checked before the ids' dtype, so an empty list (float64 to numpy) is named as 0 tokens
        too, not as ids that are no whole numbers."""
        self._check_open("prefill")
        keep = checked_keep_logits(keep_logits)
        if np.asarray(token_ids).size == 0:  # before the dtype check: np.asarray([]) is float64, not "no ids"
            raise RuntimeBackendError("prefill of 0 tokens: there is no position whose logits it could return",
                                      "pass at least one token id (the prompt's last token gives the next "
                                      "token's logits)")
        ids = checked_token_ids(token_ids, self.vocab_size, "prefill")[0]  # (T,)
        return self._run(ids, min(keep, ids.shape[0]))

    def hidden_states(self, token_ids: np.ndarray) -> np.ndarray:
        """Final-norm hidden states (T, hidden) of ``token_ids`` run beside the KV cache, which stays as it was.
        No ids (an empty list too, which numpy reads as float64) is refused as 0 tokens, as the ONNX Runtime
        backends refuse it, not as ids of the wrong dtype."""
        import torch

        self._check_open("hidden_states")
        if np.asarray(token_ids).size == 0:
            raise RuntimeBackendError("hidden states of 0 tokens: there is no position to return",
                                      "pass at least one token id")
        ids = checked_token_ids(token_ids, self.vocab_size, "hidden states")[0]  # (T,)
        if not 0 < len(ids) <= self.max_context:
            capped = capped_context(self.max_context, self.built_context, self.context_source)
            held = capped or f"the bundle's max_context {self.max_context}"
            raise RuntimeBackendError(f"hidden states of {len(ids)} tokens: expected 1 to {held}",
                                      "pass a shorter, non-empty sequence"
                                      + (f", or raise {held_setting(self.context_source)[0]} up to the bundle's "
                                         f"{self.built_context}" if capped else ""))
        return self.decoder.hidden_states(torch.as_tensor(ids)).cpu().numpy()

    def decode(self, token_id: int) -> np.ndarray:
        """Append one token; its next-token logits (vocab,). Several ids are refused (:func:`checked_decode_id`):
        they ran as one step, the logits of the last returned."""
        self._check_open("decode")
        return self._run(checked_decode_id(token_id, self.vocab_size)[0], 1)[0]


def open_triton_backend(bundle: Bundle, threads: int) -> TritonBackend:
    """Load the bundle's sparse weights onto the kernels, or say why not (RuntimeBackendError)."""
    record = bundle.manifest.get("sparse")
    if not record:
        raise RuntimeBackendError("the bundle has no block-sparse weights",
                                  "build with a recipe whose export has sparse: true (e.g. --recipe jetson)")
    explicit = os.environ.get(KERNELS_ENV, "").strip()  # blank counts as unset, as in kernel_mode()
    # no GPU to be seen: refused before PyTorch is imported (a CPU host's chain goes on to ort-cpu without its seconds
    # and memory); a torch already loaded answers for itself below. The modes EDGESDK_KERNELS sets need no GPU
    if not explicit and "torch" not in sys.modules and not cuda_device_seen():
        raise RuntimeBackendError("no CUDA device: no NVIDIA GPU device node (/dev/nvidia*, /dev/nvhost-ctrl-gpu) "
                                  "or nvidia-smi here, and the Triton kernels run on one", NO_CUDA_FIX)
    try:
        import torch
        from safetensors.torch import load_file
    except Exception as exc:  # a torch whose CUDA libraries do not load raises OSError or ValueError, not ImportError
        raise RuntimeBackendError(
            f"PyTorch is not importable here ({type(exc).__name__}: {exc})",
            "install the PyTorch build for this board's CUDA (on Jetson: jetson-containers l4t-pytorch or NVIDIA's "
            "JetPack wheel); a pip wheel for another CUDA fails to load its libraries") from exc
    from edgesdk.kernels.ops import kernel_mode, triton_available
    from edgesdk.kernels.tuning import RUNTIME_FIELDS, TUNING_ENV_VAR, parse_tuning_overrides
    from edgesdk.runtime.sparse_decoder import SparseDecoder

    try:  # a bad value is this backend's reason not to open, not an error that ends the backend chain
        mode = kernel_mode()
        overrides = parse_tuning_overrides(os.environ.get(TUNING_ENV_VAR, ""))
    except ValueError as exc:
        raise RuntimeBackendError(str(exc), f"correct or unset {KERNELS_ENV} / {TUNING_ENV_VAR}") from exc
    cuda = torch.cuda.is_available()
    if not explicit and not cuda:
        raise RuntimeBackendError("no CUDA device that PyTorch can use (torch.cuda.is_available() is False: "
                                  "a CPU-only PyTorch build, CUDA_VISIBLE_DEVICES hiding the GPU, or a driver older "
                                  "than PyTorch's CUDA), and the Triton kernels run on one", NO_CUDA_FIX)
    if mode == "triton" and not cuda:
        raise RuntimeBackendError("no CUDA device for the Triton kernels",
                                  f"set {KERNELS_ENV}=reference to run their PyTorch twins on the CPU")
    aot = cuda and not explicit and not triton_available()  # no JIT on this board: the bundle's cubins
    if mode in ("triton", "emulated") and not triton_available():
        cubins = "unset it to run the bundle's compiled kernels, or " if cuda and record.get("kernels") else ""
        raise RuntimeBackendError(f"{KERNELS_ENV}={explicit} needs the triton package, which is not installed",
                                  f"{cubins}pip install 'edgesdk[kernels]', or set {KERNELS_ENV}=reference")
    compiled_in = sorted(set(overrides) - RUNTIME_FIELDS)
    if aot and compiled_in:
        raise RuntimeBackendError(
            f"{TUNING_ENV_VAR} sets {', '.join(compiled_in)}, which the bundle's compiled kernels have built in; "
            f"only {', '.join(sorted(RUNTIME_FIELDS))} apply to them",
            f"drop those from {TUNING_ENV_VAR}, or pip install 'edgesdk[kernels]' to compile the kernels here")
    torch.set_num_threads(max(1, threads))
    device = "cuda" if aot or mode == "triton" else "cpu"
    try:  # a load that fails (GPU memory held by another process, weights torch cannot read) is this backend's
        # reason not to open, as the ONNX Runtime openers report a session that fails: the chain tries the next
        tensors = load_file(str(bundle.file(record["weights"])))
        if aot:
            compiled = load_aot_kernels(bundle, record)
            try:
                return TritonBackend(SparseDecoder(tensors, record, device="cuda", compiled=compiled), "aot")
            except BaseException:  # the loaded modules go with the backend that was not built
                with contextlib.suppress(Exception):  # the failed build is the error to report
                    compiled.close()
                raise
        return TritonBackend(SparseDecoder(tensors, record, device=device, mode=mode), mode)
    except RuntimeBackendError:
        raise
    except Exception as exc:  # noqa: BLE001 - torch.cuda.OutOfMemoryError, SafetensorsError, a record torch refuses
        raise RuntimeBackendError(
            f"the block-sparse weights did not load onto {device} ({type(exc).__name__}: {str(exc)[:300]})",
            _load_failure_fix(exc)) from exc


def _give_back_cached_gpu_memory() -> None:
    """Return the blocks torch's caching allocator keeps after a closed backend's tensors went to the driver
    (``torch.cuda.empty_cache``), so nvidia-smi or tegrastats (a Jetson's GPU shares the board's memory) shows them
    free; only where torch has started CUDA."""
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _load_failure_fix(exc: Exception) -> str:
    """The fix for a failed load, by its cause: GPU memory only when the GPU ran out of it (a weights file torch
    cannot read, or kernels that do not fit, are fixed by the bundle, not by freeing memory)."""
    other_backends = "pass --backend ort-cuda or ort-cpu"
    said = str(exc).lower()  # torch.cuda.OutOfMemoryError's "out of memory"; the CPU allocator's "can't allocate memory"
    if isinstance(exc, MemoryError) or "out of memory" in said or "allocate memory" in said:
        return (f"free the memory another process holds (nvidia-smi, or tegrastats on a Jetson), or "
                f"{other_backends}")
    return (f"run 'edgesdk verify BUNDLE', which checks the bundle's files, and rebuild the bundle if it was "
            f"written by another edgesdk; or {other_backends}")


def load_aot_kernels(bundle: Bundle, record: dict):
    """The kernels compiled at build time for this board's SM (bundle ``kernels/sm_XX``). Raises
    RuntimeBackendError when they do not load or when a variant the model needs (its block and layout, head_dim,
    query heads per KV head, each sliding window) is absent, e.g. compiled for defaults that do not fit the model,
    refused by the compiler, or compiled without the model's windows."""
    from edgesdk.kernels.loader import KernelLoadError, load_compiled

    kernels = record.get("kernels")
    if not kernels:
        raise RuntimeBackendError("triton is not installed and the bundle carries no compiled kernels",
                                  "pip install 'edgesdk[kernels]', or build the bundle for a GPU target")
    try:
        compiled = load_compiled(bundle.file(kernels["dir"]))
    except KernelLoadError as exc:
        raise RuntimeBackendError(f"the bundle's sm_{kernels['sm']} kernels do not load here: {exc}",
                                  "pip install 'edgesdk[kernels]' to compile for this GPU at run time") from exc
    block = int(record["block"])
    groups = [int(layer["heads"]) // max(1, int(layer["kv_heads"])) for layer in record["layers"]]
    windows = [layer.get("window") or None for layer in record["layers"]]  # Gemma 3's sliding layers
    lacking = compiled.missing((block, block), record.get("layout", "plain"), int(record["head_dim"]), groups,
                               windows)
    if lacking:  # found here, not as a KernelLoadError at the first token; the loaded modules go now
        with contextlib.suppress(Exception):  # what is lacking is the error to report
            compiled.close()
        refused = "".join(f"; {name} was refused: {error}" for name, error in sorted(compiled.failed.items()))
        raise RuntimeBackendError(
            f"the bundle's sm_{kernels['sm']} kernels lack what this model needs: {'; '.join(lacking)}{refused}",
            "rebuild the bundle with this edgesdk (it compiles the variants the model needs), or pip install "
            "'edgesdk[kernels]' to compile for this GPU at run time")
    return compiled
