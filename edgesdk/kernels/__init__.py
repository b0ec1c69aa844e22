"""GPU decode kernels (Triton) with PyTorch reference twins, and their ahead-of-time compilation per SM.

* :mod:`.block_sparse`: :class:`BlockSparseWeight`, INT8 weights in block-compressed rows (BSR); :mod:`.layouts`:
  the row layouts it writes (no torch, so the exporter can check a setting without it).
* :mod:`.reference`: the plain PyTorch twins (float32), the definition of what each kernel computes.
* :mod:`.triton_kernels`: the Triton kernels (block-sparse INT8 GEMV/GEMM with fused per-channel dequantisation;
  GQA decode attention with online softmax). Needs triton.
* :mod:`.ops`: the switch (``EDGESDK_KERNELS`` = ``triton`` | ``reference`` | ``emulated``).
* :mod:`.tuning`: launch configurations per target SM; :mod:`.aot`: cubin + PTX + JSON per SM (needs triton, no
  GPU); :mod:`.loader`: launches those cubins on a board (cuda-python or a CUDA torch; no triton).

Nothing here imports triton at package import time, and only the torch-based modules import torch, so
``import edgesdk.kernels`` works on any install; names below are loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BlockSparseWeight": "block_sparse",
    "block_sparse_matmul_reference": "reference",
    "gqa_decode_attention_reference": "reference",
    "kernel_mode": "ops",
    "block_sparse_matmul": "ops",
    "gqa_decode_attention": "ops",
    "KernelTuning": "tuning",
    "tuning_for": "tuning",
    "CompiledKernel": "aot",
    "compile_for_target": "aot",
    "load_compiled": "loader",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
