"""The switch: one entry point per kernel, dispatching to Triton on the GPU, the PyTorch twin, or the interpreter.

``EDGESDK_KERNELS`` (or the ``mode`` argument) picks:

* ``"triton"``: the Triton kernel JIT-compiled for the current CUDA device (CUDA tensors);
* ``"reference"``: the plain PyTorch twin in :mod:`.reference` (any device, no triton needed);
* ``"emulated"``: the same Triton kernel run by Triton's CPU interpreter (``TRITON_INTERPRET`` semantics,
  without setting the variable; CPU tensors). This is how the kernels are tested on hosts without a GPU.

``EDGESDK_KERNEL_TUNING="gemv_unroll=2,gemv_programs_per_sm=32"`` overrides the launch settings that
:func:`.tuning.tuning_for` picks for the current GPU (Triton mode). The bundle's AOT cubins (:mod:`.loader`) have
every other setting compiled in and take only :data:`.tuning.RUNTIME_FIELDS` from it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os

import torch

from .block_sparse import BlockSparseWeight
from .reference import block_sparse_matmul_reference, gqa_decode_attention_reference
from .tuning import SM_DEFAULTS, TUNING_ENV_VAR, KernelTuning, parse_tuning_overrides, tuning_for

ENV_VAR = "EDGESDK_KERNELS"
MODES = ("triton", "reference", "emulated")


def triton_available() -> bool:
    """True when ``triton`` can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


def _check_mode(value: str, source: str) -> str:
    mode = value.strip().lower()
    if mode not in MODES:
        raise ValueError(f"{source}={value!r} is not a kernel mode; allowed: {', '.join(MODES)}")
    return mode


def kernel_mode() -> str:
    """The mode from ``EDGESDK_KERNELS``; unset or empty: ``triton`` on a CUDA machine with triton, else ``reference``."""
    value = os.environ.get(ENV_VAR, "")
    if value.strip():
        return _check_mode(value, ENV_VAR)
    return "triton" if torch.cuda.is_available() and triton_available() else "reference"


def _resolve(mode: str | None) -> str:
    if mode is None:
        return kernel_mode()
    return _check_mode(mode, "mode")


def _require_triton(mode: str) -> None:
    if not triton_available():
        raise RuntimeError(f"kernel mode {mode!r} needs triton (pip install 'edgesdk[kernels]'); "
                           f"use mode 'reference' or set {ENV_VAR}=reference")
    if mode == "triton" and not torch.cuda.is_available():
        raise RuntimeError(f"kernel mode 'triton' needs a CUDA GPU and torch built with CUDA; use 'emulated' on "
                           f"CPU or set {ENV_VAR}=reference")


def tuning_overrides(tuning: KernelTuning, text: str) -> KernelTuning:
    """``tuning`` with fields from ``"gemv_unroll=2,gemv_programs_per_sm=32"`` (checked by
    :func:`.tuning.parse_tuning_overrides`: positive, powers of two where the kernels need them), for tuning on a
    board."""
    return dataclasses.replace(tuning, **parse_tuning_overrides(text))


def _device_tuning(device_index: int) -> KernelTuning:
    """The tuning for CUDA device ``device_index`` with the current ``EDGESDK_KERNEL_TUNING`` applied."""
    return _device_tuning_for(device_index, os.environ.get(TUNING_ENV_VAR, ""))


@functools.cache
def _device_tuning_for(device_index: int, overrides: str) -> KernelTuning:
    """Cached per device and override text: a changed ``EDGESDK_KERNEL_TUNING`` is a new entry, not the old one."""
    props = torch.cuda.get_device_properties(device_index)
    sm = props.major * 10 + props.minor
    smem = getattr(props, "shared_memory_per_multiprocessor", None)
    smem_kb = smem // 1024 if smem else SM_DEFAULTS.get(sm, (0, 100))[1]  # 100 KB: the smallest sm_8x value
    return tuning_overrides(tuning_for(sm, props.multi_processor_count, smem_kb), overrides)


def _tuning(mode: str, tensor: torch.Tensor, tuning: KernelTuning | None) -> KernelTuning | None:
    if tuning is not None or mode != "triton":
        return tuning
    return _device_tuning(tensor.device.index if tensor.device.index is not None else torch.cuda.current_device())


def block_sparse_matmul(x: torch.Tensor, weight: BlockSparseWeight, mode: str | None = None, *,
                        tuning: KernelTuning | None = None) -> torch.Tensor:
    """``x @ (scales[:, None] * q).T`` for a BSR int8 weight: x ``(M, K)`` -> ``(M, N)``."""
    mode = _resolve(mode)
    if mode == "reference":
        return block_sparse_matmul_reference(x, weight)
    _require_triton(mode)
    from .triton_kernels import block_sparse_matmul_triton

    return block_sparse_matmul_triton(x, weight, emulated=mode == "emulated", tuning=_tuning(mode, x, tuning))


def gqa_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor,
                         scale: float, mode: str | None = None, *,
                         tuning: KernelTuning | None = None, window: int | None = None) -> torch.Tensor:
    """Decode-step GQA: q ``(B, Hq, D)``, caches ``(B, Hkv, T_max, D)``, lengths ``(B,)`` -> ``(B, Hq, D)``;
    ``window``: each query reads its last ``window`` positions, itself included (a sliding-window layer; None:
    every position up to its length)."""
    mode = _resolve(mode)
    if mode == "reference":
        return gqa_decode_attention_reference(q, k_cache, v_cache, lengths, scale, window)
    _require_triton(mode)
    from .triton_kernels import gqa_decode_attention_triton

    return gqa_decode_attention_triton(q, k_cache, v_cache, lengths, scale, emulated=mode == "emulated",
                                       tuning=_tuning(mode, q, tuning), window=window)
