"""Per-target launch configurations (block sizes, num_warps, num_stages) from the GPU's SM count and shared memory.

Pure Python: no torch, no triton. The board profile passes ``sm_count`` and ``shared_memory_kb``; when it does not,
the documented defaults below are used.

The kernels are decode kernels: at batch 1 they are bound by memory bandwidth, not by arithmetic, so the rules
aim at (1) enough programs in flight per SM to hide DRAM latency, (2) tiles whose double-buffered copies fit in
shared memory, and (3) no software pipelining where the hardware has no asynchronous copy (``cp.async`` arrived
with sm_80, Ampere; see the CUDA C++ Programming Guide, "Asynchronous Data Copies"). The GEMV settings were swept
on an H200 (``tests/benchmarks/test_block_sparse_gpu.py``): 4 warps, 4 blocks a step and split-K to 8 programs
per SM was the best single setting of the split-K sweep (geometric mean within 7 % of each cell's best). The Jetson values follow the
same rules and are not measured on a board.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields

# sm -> (SM count, shared memory per SM in KB) assumed when the profile gives none.
# Shared memory per SM: CUDA C++ Programming Guide, "Technical Specifications per Compute Capability"
# (7.0/7.2: 96 KB, 7.5: 64 KB, 8.0: 164 KB, 8.6: 100 KB, 8.7: 164 KB, 8.9: 100 KB, 9.0: 228 KB, 5.3: 64 KB).
# SM counts of the Jetson parts: CUDA cores / cores per SM from the Jetson module data sheets:
#   87 Orin NX 16GB / Orin Nano 8GB: 1024 Ampere cores / 128 = 8 SMs (AGX Orin 64GB: 16, Orin Nano 4GB: 4);
#   72 Xavier NX: 384 Volta cores / 64 = 6 SMs (AGX Xavier: 8);
#   53 Nano: 128 Maxwell cores / 128 = 1 SM.
# Desktop/data-centre entries (80 A100: 108, 86 RTX 3090: 82, 89 RTX 4090: 128, 90 H100 SXM: 132) are typical parts
# for development hosts only.
SM_DEFAULTS: dict[int, tuple[int, int]] = {
    53: (1, 64),
    72: (6, 96),
    75: (40, 64),
    80: (108, 164),
    86: (82, 100),
    87: (8, 164),
    89: (128, 100),
    90: (132, 228),
}


@dataclass(frozen=True)
class KernelTuning:
    """Meta-parameters for one target. ``bsr_block`` is the tile the exporter should cut weights into."""

    sm: int
    sm_count: int
    shared_memory_kb: int
    bsr_block: tuple[int, int] = (32, 32)   # (block_n, block_k) of BlockSparseWeight
    gemv_num_warps: int = 2                 # M < 16: broadcast-multiply + reduce, one program per block row
    gemv_unroll: int = 4                    # M == 1: stored blocks loaded per loop step (loads in flight)
    gemv_programs_per_sm: int = 8           # M == 1: split-K until the GEMV has this many programs per SM
    gemm_block_m: int = 16                  # M >= 16: tl.dot tiles (16 is the tensor-core minimum)
    gemm_num_warps: int = 4
    attn_block_t: int = 32                  # cache positions per online-softmax step
    attn_num_warps: int = 4
    num_stages: int = 1                     # software pipelining depth (1 = none)

    def __post_init__(self) -> None:
        """Refuse a field set directly or through ``dataclasses.replace`` that the kernels cannot run with, by
        the rules and in the words :func:`parse_tuning_overrides` gives ``EDGESDK_KERNEL_TUNING``."""
        for name in sorted(_checked_fields()):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"KernelTuning: {name}={value!r} must be an integer")
            refusal = _field_refusal(name, value)
            if refusal is not None:
                raise ValueError(f"KernelTuning: {refusal}")

    def to_dict(self) -> dict:
        return asdict(self)


def tuning_for(sm: int, sm_count: int | None = None, shared_memory_kb: int | None = None) -> KernelTuning:
    """Launch configuration for compute capability ``sm`` (e.g. 87) with ``sm_count`` SMs of ``shared_memory_kb``.

    Rules (decode, memory-bound):

    * ``num_stages``: 1 before sm_80 (no ``cp.async``); else 2, or 3 when an SM has >= 160 KB of shared memory.
    * attention: 64 positions per step with 8 warps on sm_80+ parts with >= 128 KB shared memory per SM (two
      programs' 3-stage fp16 K and V tiles, 3 * 2 * 64 * 64 * 2 B = 48 KiB each, fit), else 32 positions with
      4 warps. The (G, T, D) broadcast product is G*T*D/(32*warps) fp32 registers per thread: 64 at G=4, D=64.
    * ``gemv_num_warps``: a 32x32 int8 tile is 1024 weights; 2 warps (16 per thread) with few SMs (<= 16) keep
      more programs resident per SM for the small N of SmolLM2 layers (576 / 32 = 18 programs), 4 warps otherwise.
    * ``bsr_block``: 32x32 (one 1 KiB int8 tile: 32 B per output row = one sector) everywhere; 16x64 before sm_80
      was not measured and is not used.
    * batch-1 GEMV: ``gemv_unroll`` 4 blocks per loop step and split-K until ``gemv_programs_per_sm`` 8 programs
      per SM (:func:`gemv_splits`); one block a step without split-K held an H200 under 21 % of its copy rate.
    """
    if sm_count is None or shared_memory_kb is None:
        if sm not in SM_DEFAULTS:
            raise ValueError(f"no defaults for sm_{sm} (known: {sorted(SM_DEFAULTS)}); pass sm_count and "
                             f"shared_memory_kb")
        default_count, default_smem = SM_DEFAULTS[sm]
        sm_count = default_count if sm_count is None else sm_count
        shared_memory_kb = default_smem if shared_memory_kb is None else shared_memory_kb
    if sm_count <= 0 or shared_memory_kb <= 0:
        raise ValueError(f"sm_count and shared_memory_kb must be positive, got {sm_count}, {shared_memory_kb}")
    if sm < 80:
        stages = 1
    elif shared_memory_kb >= 160:
        stages = 3
    else:
        stages = 2
    wide_attention = sm >= 80 and shared_memory_kb >= 128
    return KernelTuning(
        sm=sm, sm_count=sm_count, shared_memory_kb=shared_memory_kb,
        gemv_num_warps=2 if sm_count <= 16 else 4,
        gemm_num_warps=4,
        attn_block_t=64 if wide_attention else 32,
        attn_num_warps=8 if wide_attention else 4,
        num_stages=stages,
    )


def max_shared_per_block(tuning: KernelTuning) -> int:
    """Bytes of shared memory one block may use on the target (dynamic, with the opt-in attribute): CUDA C++
    Programming Guide, "Technical Specifications per Compute Capability": 48 KB before sm_70, the whole SM's on
    sm_7x (96 KB on 7.0 / 7.2, 64 KB on 7.5), the SM's less the 1 KB the hardware reserves per block from sm_80
    (163 KB on 8.0 / 8.7, 99 KB on 8.6 / 8.9, 227 KB on 9.0)."""
    kb = tuning.shared_memory_kb
    if tuning.sm < 70:
        kb = min(kb, 48)
    elif tuning.sm >= 80:
        kb -= 1
    return max(0, kb) * 1024


def gemv_splits(block_rows: int, stored_blocks: int, tuning: KernelTuning) -> int:
    """Programs per block row (split-K) for a batch-1 GEMV: enough for ``gemv_programs_per_sm`` programs on each
    SM, but never so many that a program gets fewer than two unrolled steps of its row's stored blocks."""
    if block_rows <= 0 or stored_blocks <= 0:
        return 1
    wanted = -(-tuning.sm_count * tuning.gemv_programs_per_sm // block_rows)
    most = stored_blocks // (block_rows * 2 * max(1, tuning.gemv_unroll))
    return max(1, min(wanted, most))


TUNING_ENV_VAR = "EDGESDK_KERNEL_TUNING"
# fields that are tile sizes, loop widths (tl.arange) or warp counts: the kernels only run with powers of two
POWER_OF_TWO_FIELDS = frozenset({"gemv_num_warps", "gemv_unroll", "gemm_block_m", "gemm_num_warps", "attn_block_t",
                                 "attn_num_warps"})
# warp counts: CUDA runs at most 1024 threads (32 warps) in a block on every GPU ("Technical Specifications per
# Compute Capability", maximum number of threads per block); Triton compiles more and the launch then fails
WARP_FIELDS = frozenset({"gemv_num_warps", "gemm_num_warps", "attn_num_warps"})
MAX_NUM_WARPS = 32
# fields read at launch time, not compiled into a kernel: the only ones that apply to a bundle's AOT cubins
RUNTIME_FIELDS = frozenset({"gemv_programs_per_sm", "sm_count"})


def parse_tuning_overrides(text: str) -> dict[str, int]:
    """``"gemv_unroll=2,gemv_programs_per_sm=32"`` -> ``{"gemv_unroll": 2, ...}``, checked: known integer
    fields of :class:`KernelTuning` (not ``sm``), every value positive, powers of two where the kernels need them
    (:data:`POWER_OF_TWO_FIELDS`), warp counts at most :data:`MAX_NUM_WARPS` (CUDA's 1024 threads per block),
    ``gemm_block_m >= 16`` (the ``tl.dot`` minimum). Raises ValueError naming
    ``EDGESDK_KERNEL_TUNING``, the item and what is allowed."""
    names = _checked_fields()
    changes: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        name = name.strip()
        if name not in names or not re.fullmatch(r"-?[0-9]+", value.strip()):  # ASCII digits only
            raise ValueError(f"{TUNING_ENV_VAR}: {item!r} is not NAME=INTEGER for a tuning field; fields: "
                             f"{', '.join(sorted(names))}")
        if name in changes:
            raise ValueError(f"{TUNING_ENV_VAR}: {name} is given twice ({name}={changes[name]} and {item.strip()}); "
                             "give each field once")
        number = int(value)
        refusal = _field_refusal(name, number)
        if refusal is not None:
            raise ValueError(f"{TUNING_ENV_VAR}: {refusal}")
        changes[name] = number
    return changes


def _checked_fields() -> set[str]:
    """The integer fields of :class:`KernelTuning` that ``EDGESDK_KERNEL_TUNING`` may set and that are checked
    (every one but ``sm``)."""
    return {f.name for f in fields(KernelTuning) if f.type in ("int", int)} - {"sm"}


def _field_refusal(name: str, number: int) -> str | None:
    """Why tuning field ``name`` cannot be ``number`` (``"NAME=VALUE must ..."``), or None when it can: positive,
    a power of two in :data:`POWER_OF_TWO_FIELDS`, a warp count at most :data:`MAX_NUM_WARPS`, ``gemm_block_m`` at
    least 16."""
    if number <= 0:
        return f"{name}={number} must be a positive integer"
    if name in POWER_OF_TWO_FIELDS and number & (number - 1):
        lower = 1 << (number.bit_length() - 1)
        return (f"{name}={number} must be a power of two (the kernels' tiles and warp counts are), e.g. {lower} or "
                f"{lower * 2}")
    if name in WARP_FIELDS and number > MAX_NUM_WARPS:
        return (f"{name}={number} is {32 * number} threads a block, and CUDA runs at most 1024 (32 warps) on every "
                f"GPU: give {name} at most {MAX_NUM_WARPS}")
    if name == "gemm_block_m" and number < 16:
        return f"gemm_block_m={number} must be at least 16 (the tl.dot minimum)"
    return None
