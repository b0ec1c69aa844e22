"""The Triton kernels and their launchers. Importing this module needs triton; everything else in the package does not.

The kernel bodies are plain (undecorated) Python functions. :func:`get_kernel` wraps the same body two ways:

* GPU: ``triton.runtime.jit.JITFunction(fn)``: what ``@triton.jit`` returns when the interpreter is off. It is
  also what :mod:`.aot` hands to ``triton.compile`` through ``ASTSource``.
* emulated: ``triton.runtime.interpreter.InterpretedFunction(fn)``: what ``@triton.jit`` returns under
  ``TRITON_INTERPRET=1`` (triton 3.9 ``runtime/jit.py::jit`` reads ``knobs.runtime.interpret`` once, at decoration
  time). Building it directly runs the kernel on CPU tensors with numpy, program by program, without touching the
  environment, so one process can hold both.

References: Triton language docs (https://triton-lang.org/main/python-api/triton.language.html), the Triton
matmul tutorial (tiles + ``tl.dot``), and for attention the online softmax of Milakov & Gimelshein 2018
("Online normalizer calculation for softmax", arXiv:1805.02867) as used by FlashAttention (Dao et al. 2022) and
Flash-Decoding (Dao et al. 2023).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from .block_sparse import ARRAYS, BlockSparseWeight
from .reference import check_decode_attention_args, check_window
from .tuning import KernelTuning, gemv_splits, tuning_for


def _bsr_matmul_kernel(
    x_ptr, values_ptr, col_ptr, rowoff_ptr, scales_ptr, out_ptr,
    M, N, K,
    stride_xm, stride_xk, stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    TRANSPOSED: tl.constexpr, USE_DOT: tl.constexpr, UNROLL: tl.constexpr, ATOMIC: tl.constexpr,
):
    """out[m, n] = scales[n] * sum_k x[m, k] * q[n, k] over the stored blocks of block row ``program_id(0)``.

    Grid: ``(ceil(N / BLOCK_N), ceil(M / BLOCK_M), splits)``. Each program owns ``BLOCK_M x BLOCK_N`` outputs and
    walks its share of its block row's stored blocks (CSR ``row_offsets[r] .. row_offsets[r+1]``, cut into
    ``splits`` contiguous shares), loads the activation slice that each block's ``col_index`` selects plus the
    int8 tile, accumulates in fp32 and applies the per-channel scale once at the end (fused dequantisation: the
    scale is constant along K so it factors out of the sum). Dropped blocks are never read.

    * ``USE_DOT`` (``BLOCK_M >= 16``, GEMM, blocks of at least 16 x 16) uses ``tl.dot``; otherwise a broadcast
      multiply and a reduction along K, which needs no tensor-core tile minimum.
    * ``UNROLL > 1`` (batch-1 GEMV, ``BLOCK_M == 1``): ``UNROLL`` stored blocks per step, their loads issued
      together. A block is 1 KiB and each step's loads depend on the column index just read, so one block per
      step leaves a program waiting a full memory latency per KiB; measured on an H200 that held the dense
      kernel under 20 % of the copy bandwidth.
    * ``ATOMIC`` (split-K, ``splits > 1``): shares of one block row run in parallel programs and add their
      scaled partial sums into a zeroed float32 output with ``tl.atomic_add``. Without it a small N (SmolLM2:
      576 / 32 = 18 block rows) gives fewer programs than the GPU has SMs.
    """
    rb = tl.program_id(0)
    pm = tl.program_id(1)
    r_n = tl.arange(0, BLOCK_N)
    r_k = tl.arange(0, BLOCK_K)
    offs_m = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = rb * BLOCK_N + r_n
    m_mask = offs_m < M
    if TRANSPOSED:
        tile_offs = r_k[:, None] * BLOCK_N + r_n[None, :]  # (BLOCK_K, BLOCK_N), contiguous along N
    else:
        tile_offs = r_n[:, None] * BLOCK_K + r_k[None, :]  # (BLOCK_N, BLOCK_K), contiguous along K
    start = tl.load(rowoff_ptr + rb)
    end = tl.load(rowoff_ptr + rb + 1)
    share = (end - start + tl.num_programs(2) - 1) // tl.num_programs(2)
    lo = start + tl.program_id(2) * share
    hi = tl.minimum(end, lo + share)
    if UNROLL > 1:
        r_u = tl.arange(0, UNROLL)
        acc_n = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for i in range(lo, hi, UNROLL):
            offs_i = i + r_u  # (U,) stored blocks of this step
            valid = offs_i < hi
            kb = tl.load(col_ptr + offs_i, mask=valid, other=0)
            offs_k = kb[:, None] * BLOCK_K + r_k[None, :]  # (U, BLOCK_K)
            x = tl.load(x_ptr + pm * stride_xm + offs_k * stride_xk, mask=valid[:, None] & (offs_k < K),
                        other=0.0).to(tl.float32)  # (U, BLOCK_K)
            w = tl.load(values_ptr + offs_i[:, None, None] * (BLOCK_N * BLOCK_K) + tile_offs[None, :, :],
                        mask=valid[:, None, None], other=0).to(tl.float32)
            if TRANSPOSED:
                part = tl.sum(w * x[:, :, None], axis=1)  # (U, BK, BN) * (U, BK, 1) -> (U, BN)
            else:
                part = tl.sum(w * x[:, None, :], axis=2)  # (U, BN, BK) * (U, 1, BK) -> (U, BN)
            acc_n += tl.sum(part, axis=0)
        acc = acc_n[None, :]  # (1, BLOCK_N)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for i in range(lo, hi):
            kb = tl.load(col_ptr + i)
            offs_k = kb * BLOCK_K + r_k
            x_mask = m_mask[:, None] & (offs_k[None, :] < K)
            x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk, mask=x_mask, other=0.0)
            # stored tiles are whole (zero padded), so the weight load needs no mask; int32 offsets: values < 2 GiB
            w = tl.load(values_ptr + i * (BLOCK_N * BLOCK_K) + tile_offs)
            if USE_DOT:
                if TRANSPOSED:
                    w_kn = w  # (BLOCK_K, BLOCK_N)
                else:
                    w_kn = tl.trans(w)  # (BLOCK_N, BLOCK_K) -> (BLOCK_K, BLOCK_N)
                # int8 -> activation dtype is exact (|q| <= 128); fp32 inputs use exact fp32 ("ieee"), not tf32
                acc += tl.dot(x, w_kn.to(x.dtype), input_precision="ieee")
            else:
                xf = x.to(tl.float32)  # (BLOCK_M, BLOCK_K)
                wf = w.to(tl.float32)
                if TRANSPOSED:
                    acc += tl.sum(xf[:, :, None] * wf[None, :, :], axis=1)  # (BM, BK, 1)*(1, BK, BN) -> (BM, BN)
                else:
                    acc += tl.sum(xf[:, None, :] * wf[None, :, :], axis=2)  # (BM, 1, BK)*(1, BN, BK) -> (BM, BN)
    n_mask = offs_n < N
    scale = tl.load(scales_ptr + offs_n, mask=n_mask, other=0.0)
    out = acc * scale[None, :]
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    if ATOMIC:
        tl.atomic_add(out_ptrs, out, mask=m_mask[:, None] & n_mask[None, :])
    else:
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def _gqa_decode_kernel(
    q_ptr, k_ptr, v_ptr, len_ptr, out_ptr,
    scale, GROUP, D,
    stride_qb, stride_qh, stride_qd,
    stride_kb, stride_kh, stride_kt, stride_kd,
    stride_vb, stride_vh, stride_vt, stride_vd,
    stride_ob, stride_oh, stride_od,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr, WINDOW: tl.constexpr,
):
    """Decode attention for one (batch row, kv head): its ``GROUP`` query heads against ``lengths[b]`` cache rows.

    Grid: ``(B, Hkv)``. The K/V tiles of one kv head are read once for the whole query group (the GQA saving);
    ``GROUP`` and ``D`` are runtime values padded to the ``BLOCK_G`` / ``BLOCK_D`` powers of two and masked, so
    pruned head counts need no recompilation. The softmax is streamed over ``BLOCK_T`` tiles with the online
    normaliser (running max ``m``, running sum ``l``, rescale by ``exp(m_old - m_new)``; Milakov & Gimelshein
    2018). Positions ``>= lengths[b]`` are masked; a row of length 0 stores zeros. ``WINDOW``: the query (at
    position ``lengths[b] - 1``) reads the last ``WINDOW`` positions only, itself included (a sliding-window layer,
    transformers' ``sliding_window_overlay``); the loop starts there, so positions before it are never read.
    ``WINDOW`` 0: full attention, the loop starts at 0 and the kernel is the one compiled before windows. A
    compile-time constant (one compile per window a model has; its AOT variants name it), read from no tensor, so
    a captured CUDA graph replays it as it replays ``scale``; only the length is a device value.
    """
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    offs_t = tl.arange(0, BLOCK_T)
    g_mask = offs_g < GROUP
    d_mask = offs_d < D
    heads = h * GROUP + offs_g  # query heads h*G .. h*G+G-1 share kv head h
    q_ptrs = q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=g_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32) * scale  # (BG, BD)
    length = tl.load(len_ptr + b)
    if WINDOW > 0:
        first = tl.maximum(length - WINDOW, 0)
    else:
        first = 0
    m_i = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_G,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), dtype=tl.float32)
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh
    for t0 in range(first, length, BLOCK_T):
        t = t0 + offs_t
        t_mask = t < length
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k = tl.load(k_base + t[:, None] * stride_kt + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)  # (BG,1,BD)*(1,BT,BD) -> (BG, BT)
        s = tl.where(t_mask[None, :], s, float("-inf"))
        # every tile holds at least one valid position (first <= t0 < length), so m_new is finite
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)  # 0 on the first tile (m_i = -inf)
        p = tl.exp(s - m_new[:, None])  # (BG, BT); masked positions -> 0
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + t[:, None] * stride_vt + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)  # (BG, BD)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_ptrs = out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :] * stride_od
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :])


KERNEL_BODIES = {"bsr_matmul": _bsr_matmul_kernel, "gqa_decode": _gqa_decode_kernel}

# triton.language's own helpers (tl.sum, tl.max, tl.zeros, ...) are ``@jit`` functions too. Decorated at import
# without TRITON_INTERPRET they are JITFunctions, which refuse to be called from Python, so an interpreted kernel
# that calls them fails. While an emulated kernel runs, every such helper is swapped for the InterpretedFunction
# that ``@jit`` would have built under TRITON_INTERPRET=1, and put back afterwards.
_PATCH_LOCK = threading.RLock()


# Where triton.language keeps its jit helpers: swapped for the interpreter and back for a compile alike
HELPER_OWNERS = (tl, tl.core, tl.standard, tl.math, tl.tensor)


@functools.cache
def _interpreted_helpers() -> tuple[tuple[object, str, object, object], ...]:
    """(owner, attribute, JITFunction, InterpretedFunction) for every jit helper of triton.language."""
    # modules that triton imports lazily while launching must be imported before the swap: gluon asserts at
    # import time that the helpers are JITFunctions (reached via triton.runtime.jit.mangle_type)
    with contextlib.suppress(ImportError):
        import triton.experimental.gluon  # noqa: F401
    wrapped: dict[int, InterpretedFunction] = {}
    rows = []
    for owner in HELPER_OWNERS:
        for name, value in list(vars(owner).items()):
            if isinstance(value, JITFunction):
                if id(value) not in wrapped:  # a helper under several owners is wrapped once
                    wrapped[id(value)] = InterpretedFunction(value.fn)
                interp = wrapped[id(value)]
                # a tensor method must be a plain function so that ``x.sum()`` binds ``x`` (what
                # core._tensor_member_fn installs under TRITON_INTERPRET)
                rows.append((owner, name, value, _as_method(interp) if owner is tl.tensor else interp))
    return tuple(rows)


def _as_method(fn):
    def method(*args, **kwargs):
        return fn(*args, **kwargs)

    return method


_ABSENT = object()  # an attribute the namespace did not have before the interpreter ran


# Triton 3.9's interpreter also patches triton.language for every device-function call it makes
# (``InterpretedFunction.__call__`` -> ``_patch_lang``) and never restores that scope: after one emulated kernel,
# 64 builtins of ``tl.core`` stay interpreter lambdas, and a later GPU or AOT compile in the same process fails
# ("'value' object has no attribute 'dtype'"). What was there before the run is put back on these namespaces.
# Names it adds to a module (its rewriter's globals) are left: they shadow nothing and cached rewrites use them;
# names it adds to a tensor class are removed.
def _language_namespaces() -> tuple[object, ...]:
    return (tl, tl.core, tl.standard, tl.math, tl.tensor, tl.core.tensor_descriptor_base)


@contextlib.contextmanager
def _interpreter_scope() -> Iterator[None]:
    with _PATCH_LOCK:
        rows = _interpreted_helpers()
        saved = [(space, dict(vars(space))) for space in _language_namespaces()]
        try:
            for owner, name, _jit, interp in rows:
                setattr(owner, name, interp)
            yield
        finally:
            for space, before in saved:
                for name, value in before.items():
                    if vars(space).get(name, _ABSENT) is not value:
                        setattr(space, name, value)
                if isinstance(space, type):  # a tensor class: no interpreter __repr__, __str__ ... left on it
                    for name in set(vars(space)) - set(before):
                        delattr(space, name)


@functools.cache
def _compiled_helpers() -> tuple[tuple[object, str, JITFunction], ...]:
    """(owner, attribute, JITFunction) for every helper of triton.language that ``@jit`` made an
    InterpretedFunction, as it does for all of them when TRITON_INTERPRET=1 is set at import: the JITFunction that
    ``@jit`` builds without the interpreter, from the same function and keyword arguments (``noinline`` ...).
    Empty without the interpreter."""
    wrapped: dict[int, JITFunction] = {}
    rows = []
    for owner in HELPER_OWNERS:
        for name, value in list(vars(owner).items()):
            if isinstance(value, InterpretedFunction):
                if id(value) not in wrapped:  # a helper under several owners is wrapped once
                    wrapped[id(value)] = JITFunction(value.fn, **value.kwargs)
                rows.append((owner, name, wrapped[id(value)]))
    return tuple(rows)


@contextlib.contextmanager
def compiler_scope() -> Iterator[None]:
    """triton.language as Triton's compiler needs it, for one compile (:func:`.aot.compile_variant`). Under
    TRITON_INTERPRET=1 (how Triton users run kernels on a CPU) its helpers (``tl.sum``, ``tl.max`` ...) are
    InterpretedFunctions, which the compiler cannot call, so every AOT compile failed ("'value' object has no
    attribute 'dtype'"); while the compile runs they are the JITFunctions they are without the interpreter (the
    PTX is byte for byte the one compiled without it), then put back. Without the interpreter nothing is swapped."""
    with _PATCH_LOCK:
        rows = _compiled_helpers()
        saved = [(owner, name, vars(owner)[name]) for owner, name, _jit in rows]
        try:
            for owner, name, jit_fn in rows:
                setattr(owner, name, jit_fn)
            yield
        finally:
            for owner, name, before in saved:
                setattr(owner, name, before)


class _EmulatedKernel(InterpretedFunction):
    """A kernel run by Triton's CPU interpreter without TRITON_INTERPRET set globally."""

    def run(self, *args, grid, warmup, **kwargs):
        with _interpreter_scope():
            return super().run(*args, grid=grid, warmup=warmup, **kwargs)


@functools.cache
def get_kernel(name: str, emulated: bool):
    """``JITFunction`` (GPU, AOT) or an interpreted kernel (CPU) around the same kernel body."""
    fn = KERNEL_BODIES[name]
    return _EmulatedKernel(fn) if emulated else JITFunction(fn)


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _check_device(emulated: bool, tensors: dict[str, torch.Tensor]) -> None:
    """Every tensor on the CPU (emulated: Triton's interpreter reads host memory) or on a CUDA device (triton).
    Raises ValueError naming the tensor (``weight.scales`` for one of a :class:`BlockSparseWeight`'s arrays), its
    device, the device the mode takes and the fix (``weight.to(...)`` moves a weight's four arrays together)."""
    mode, want = ("emulated", "cpu") if emulated else ("triton", "cuda")
    for name, t in tensors.items():
        if t.device.type != want:
            owner = name.split(".")[0]
            raise ValueError(f"{mode} mode takes {want.upper()} tensors, but {name} is on {t.device}: move it with "
                             f"{owner}.to({want!r}), or use mode 'reference', which runs on any device")


def _default_tuning() -> KernelTuning:
    return tuning_for(87)  # Orin: the target the kernels are written for


DOT_MIN = 16  # tl.dot refuses operands with a dimension under 16 (Triton's dot shape check)


def bsr_uses_dot(block: tuple[int, int]) -> bool:
    """Whether the GEMM (>= 16 rows) of weights in ``block`` tiles can use ``tl.dot``: both block edges must be at
    least :data:`DOT_MIN`; smaller blocks (a profile's ``sparsity_block`` of 8, say) take the broadcast-multiply
    path, which has no tile minimum."""
    return min(int(block[0]), int(block[1])) >= DOT_MIN


def bsr_launch_params(m: int, tuning: KernelTuning, block: tuple[int, int] | None = None) -> tuple[int, bool, int]:
    """(BLOCK_M, USE_DOT, num_warps) for ``m`` activation rows: GEMV tiles up to 8 rows, GEMM uses ``tl.dot``
    where the weight ``block`` allows it (:func:`bsr_uses_dot`; default ``tuning.bsr_block``)."""
    if m >= 16:
        return tuning.gemm_block_m, bsr_uses_dot(block or tuning.bsr_block), tuning.gemm_num_warps
    return min(_next_pow2(m), 8), False, tuning.gemv_num_warps


def block_sparse_matmul_triton(x: torch.Tensor, weight: BlockSparseWeight, emulated: bool = False,
                               tuning: KernelTuning | None = None) -> torch.Tensor:
    """x ``(M, K)`` -> ``(M, N)`` (x's dtype when x is floating point; an integer x is taken as float32 and gives
    float32, as the twin computes it, not an integer output that truncates every scaled sum), by the BSR kernel.

    Batch 1 (``M == 1``) takes the GEMV path: ``tuning.gemv_unroll`` blocks a step and, where
    :func:`gemv_splits` says the block rows alone leave SMs idle, split-K with atomic float32 adds.

    Emulated bfloat16 runs the GEMM (``M >= 16``) without ``tl.dot``, by the broadcast multiply: Triton 3.9's
    interpreter stores bfloat16 as its uint16 bits, casts int8 to bfloat16 with numpy's ``astype(uint16)`` (the
    integer, not its bfloat16 encoding) and multiplies those bits in ``create_dot`` (``np.matmul``), so a
    bfloat16 ``tl.dot`` there returns numbers ~1e8 times off. The GPU path is unchanged.

    Raises ValueError for a block edge that is not a power of two (``tl.arange`` takes only those; Triton
    language docs), which the twin computes but no Triton tile can hold."""
    tuning = tuning or _default_tuning()
    n, k = weight.shape
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x must be (M, K={k}), got {tuple(x.shape)}")
    _check_device(emulated, {"x": x, **{f"weight.{name}": getattr(weight, name) for name in ARRAYS}})
    if not x.is_floating_point():  # the twin's x.float(): an integer output would truncate the scaled sums
        x = x.float()
    m = x.shape[0]
    bn, bk = weight.block
    if bn & (bn - 1) or bk & (bk - 1):
        raise ValueError(f"the Triton kernel tiles by the weight's block, and tl.arange takes powers of two only: "
                         f"block {tuple(weight.block)} of a {n}x{k} weight is not; build the weight with a "
                         f"power-of-two block (16, 32, 64; the profile's sparsity_block is one) or use mode "
                         f"'reference'")
    if m == 0 or n == 0:
        return torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_m, use_dot, num_warps = bsr_launch_params(m, tuning, weight.block)
    if emulated and x.dtype == torch.bfloat16:
        use_dot = False  # see the docstring: Triton's interpreter computes a bfloat16 tl.dot wrongly
    unroll, splits = 1, 1
    if m == 1:
        unroll = max(1, tuning.gemv_unroll)
        splits = gemv_splits(weight.block_rows, weight.nnz_blocks, tuning)
    atomic = splits > 1
    out = torch.zeros(m, n, dtype=torch.float32, device=x.device) if atomic else \
        torch.empty(m, n, dtype=x.dtype, device=x.device)
    grid = (weight.block_rows, triton.cdiv(m, block_m), splits)
    kernel = get_kernel("bsr_matmul", emulated)
    kernel[grid](
        x, weight.values, weight.col_index, weight.row_offsets, weight.scales, out,
        m, n, k, x.stride(0), x.stride(1), out.stride(0), out.stride(1),
        BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, TRANSPOSED=weight.layout == "transposed", USE_DOT=use_dot,
        UNROLL=unroll, ATOMIC=atomic, num_warps=num_warps, num_stages=tuning.num_stages,
    )
    return out.to(x.dtype) if atomic else out


def gqa_decode_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                lengths: torch.Tensor, scale: float, emulated: bool = False,
                                tuning: KernelTuning | None = None, window: int | None = None) -> torch.Tensor:
    """q ``(B, Hq, D)``, caches ``(B, Hkv, T_max, D)``, lengths ``(B,)`` in ``[0, T_max]`` -> ``(B, Hq, D)`` in q's
    dtype; ``window``: the positions each query reads, itself included (None: all). Arguments are checked as the
    twin checks them (:func:`.reference.check_decode_attention_args`, :func:`.reference.check_window`)."""
    tuning = tuning or _default_tuning()
    b, hq, hkv, _, d = check_decode_attention_args(q, k_cache, v_cache, lengths)
    span = check_window(window)
    lengths = lengths.to(device=q.device, dtype=torch.int32).contiguous()
    _check_device(emulated, {"q": q, "k_cache": k_cache, "v_cache": v_cache})
    group = hq // hkv
    out = torch.empty(b, hq, d, dtype=q.dtype, device=q.device)
    if b == 0 or hq == 0:
        return out
    t_max = k_cache.shape[2]
    block_t = max(1, min(tuning.attn_block_t, _next_pow2(t_max)))
    kernel = get_kernel("gqa_decode", emulated)
    kernel[(b, hkv)](
        q, k_cache, v_cache, lengths, out, float(scale), group, d,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(),
        BLOCK_G=_next_pow2(group), BLOCK_D=_next_pow2(d), BLOCK_T=block_t, WINDOW=span,
        num_warps=tuning.attn_num_warps, num_stages=tuning.num_stages,
    )
    return out
