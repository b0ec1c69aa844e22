"""Plain PyTorch twins of the Triton kernels (float32 math). They define what the kernels must compute.

Both twins do the same work as their kernels, not a shortcut through a dense copy: the block-sparse product
visits only stored blocks (gather the activation slices by ``col_index``, one small product per block, scatter-add
into block rows), and attention masks the cache beyond each row's length.
"""

from __future__ import annotations

import numbers

import torch

from .block_sparse import BlockSparseWeight

TEMPORARY_BUDGET_BYTES = 64 * 2**20  # the block-sparse twin's per-chunk temporaries: 64 MiB


def reference_chunk_rows(weight: BlockSparseWeight, budget_bytes: int = TEMPORARY_BUDGET_BYTES) -> int:
    """Rows of x that :func:`block_sparse_matmul_reference` takes per chunk so that its two float32 temporaries,
    the gathered activations ``(rows, nnz, block_k)`` and the per-block products ``(rows, nnz, block_n)``, hold at
    most ``budget_bytes`` together: ``4 * nnz * (block_n + block_k)`` bytes a row. At least 1 (one row over the
    budget still has to run). Raises ValueError for a budget that is not a positive integer."""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, numbers.Integral) or budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be a positive integer (bytes of float32 temporaries per chunk, "
                         f"default {TEMPORARY_BUDGET_BYTES}), got {budget_bytes!r}")
    bn, bk = weight.block
    row_bytes = 4 * weight.nnz_blocks * (bn + bk)
    return max(1, int(budget_bytes) // row_bytes) if row_bytes else 1


def block_sparse_matmul_reference(x: torch.Tensor, weight: BlockSparseWeight, *,
                                  budget_bytes: int = TEMPORARY_BUDGET_BYTES) -> torch.Tensor:
    """``x @ W.T`` for a BSR int8 weight, dequantised per output channel: x ``(M, K)`` -> float32 ``(M, N)``.

    The rows of x go through in chunks of :func:`reference_chunk_rows` so that the per-block temporaries stay
    under ``budget_bytes`` (unchunked, a 2048-token prefill through SmolLM2-135M's gate projection at full density
    would hold 0.45 GB of them); a decode step (M = 1) is one chunk. ``budget_bytes`` is checked as
    :func:`reference_chunk_rows` checks it."""
    n, k = weight.shape
    bn, bk = weight.block
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x must be (M, K={k}), got {tuple(x.shape)}")
    chunk = reference_chunk_rows(weight, budget_bytes)
    m = x.shape[0]
    nbr, nbc = weight.block_rows, weight.block_cols
    xf = x.float()
    if nbc * bk != k:
        xf = torch.nn.functional.pad(xf, (0, nbc * bk - k))  # (M, nbc*bk), zero tail
    x_blocks = xf.reshape(m, nbc, bk)  # (M, nbc*bk) -> (M, nbc, bk)
    out_blocks = torch.zeros(m, nbr, bn, dtype=torch.float32, device=x.device)  # (M, nbr, bn)
    if weight.nnz_blocks:
        cols = weight.col_index.long().to(x.device)
        tiles = weight.plain_values().to(x.device).float()  # (nnz, bn, bk)
        tile_rows = weight.block_row_index().to(x.device)  # (nnz,): the block row of each stored tile
        for start in range(0, m, chunk):
            # (c, nnz, bk): the activation slice each stored block multiplies, for c = min(chunk, M - start) rows
            xg = x_blocks[start:start + chunk, cols, :]
            partial = torch.einsum("mzk,znk->mzn", xg, tiles)  # (c, nnz, bn)
            out_blocks[start:start + chunk].index_add_(1, tile_rows, partial)  # into (c, nbr, bn)
    out = out_blocks.reshape(m, nbr * bn)[:, :n]  # (M, nbr, bn) -> (M, nbr*bn) -> (M, N)
    return out * weight.scales.to(x.device).float()[None, :]


def check_decode_attention_args(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                lengths: torch.Tensor) -> tuple[int, int, int, int, int]:
    """Shapes and lengths of a decode-attention call, checked the same way for the twin, the Triton launcher and
    the AOT loader; returns ``(B, Hq, Hkv, T_max, D)``. Raises ValueError for: q not ``(B, Hq, D)``; caches not
    both ``(B, Hkv, T_max, D)``; ``Hkv == 0`` or ``Hq % Hkv``; ``lengths`` not 1-D ``(B,)`` (the kernels read it
    flat, the twin indexes it by row: a ``(B, 1)`` one ran on the GPU and crashed the twin); a length outside
    ``[0, T_max]`` (the kernels would read past the cache). The length values are checked only on host tensors:
    reading a CUDA tensor back would synchronise every layer of every eager decode step (and break a CUDA-graph
    capture), so on the GPU they are the caller's to keep in range (the triton backend checks the sequence
    against ``max_context`` before each step)."""
    if q.dim() != 3 or k_cache.dim() != 4 or tuple(v_cache.shape) != tuple(k_cache.shape) \
            or k_cache.shape[0] != q.shape[0] or k_cache.shape[3] != q.shape[2]:
        raise ValueError(f"shape mismatch: q {tuple(q.shape)} must be (B, Hq, D) and k, v (B, Hkv, T_max, D); "
                         f"got k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)}")
    b, hq, d = q.shape
    hkv, t_max = k_cache.shape[1], k_cache.shape[2]
    if hkv == 0 or hq % hkv:
        raise ValueError(f"Hq={hq} must be a multiple of Hkv={hkv}")
    if int(lengths.numel()) != b:
        raise ValueError(f"lengths must have B={b} entries, got {lengths.numel()}")
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be a 1-D tensor (B={b},), one entry per batch row as flash-attn's "
                         f"cache_seqlens, got shape {tuple(lengths.shape)}: pass lengths.reshape(-1)")
    if lengths.is_floating_point() or lengths.is_complex():
        raise ValueError(f"lengths must be an integer tensor, got {lengths.dtype}")
    if b and lengths.device.type == "cpu":
        low, high = int(lengths.min()), int(lengths.max())
        if low < 0 or high > t_max:
            raise ValueError(f"lengths must lie in [0, T_max={t_max}] (the cache holds T_max positions), got "
                             f"{lengths.tolist() if b <= 8 else (low, high)}")
    return b, hq, hkv, t_max, d


MAX_WINDOW = 2**31 - 1  # int32's largest: the kernels compute with int32 positions


def check_window(window: int | None) -> int:
    """``window`` as the kernels take it (their ``WINDOW`` constexpr): the number of positions a query sees, itself
    included (a query at position p reads keys p - window + 1 .. p: transformers' ``sliding_window_overlay``,
    Gemma 3's sliding layers), or 0 for None, full attention; a numpy or other integral window is returned as a
    Python int (``config.sliding_window`` read through numpy is ``np.int64``). Raises ValueError for anything else
    than None or an integer in ``[1, MAX_WINDOW]``."""
    if window is None:
        return 0
    if isinstance(window, bool) or not isinstance(window, numbers.Integral) or not 1 <= window <= MAX_WINDOW:
        raise ValueError(f"window must be None (full attention) or the number of positions a query sees, itself "
                         f"included: an integer in [1, {MAX_WINDOW}]; got {window!r}")
    return int(window)


def gqa_decode_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                   lengths: torch.Tensor, scale: float, window: int | None = None) -> torch.Tensor:
    """One decode step of grouped-query attention over a padded KV cache.

    q ``(B, Hq, D)``; k_cache, v_cache ``(B, Hkv, T_max, D)``; lengths int ``(B,)`` in ``[0, T_max]``: positions
    ``>= lengths[b]`` are ignored, whatever they hold (NaN or inf from a stale cache included). Query head ``h``
    reads kv head ``h // (Hq // Hkv)`` (the ``repeat_kv`` grouping of GQA, Ainslie et al. 2023). ``window``
    (:func:`check_window`): the query, at position ``lengths[b] - 1``, reads only the last ``window`` positions,
    ``lengths[b] - window .. lengths[b] - 1``; the ones before are ignored as those past the length are. Returns
    float32 ``(B, Hq, D)``; a row with length 0 returns zeros. A NaN (or an inf that makes one) in q or in a cache
    entry the row reads gives NaN, as in the kernel's online softmax and PyTorch's
    ``scaled_dot_product_attention``; it is not turned into zeros. Arguments are checked by
    :func:`check_decode_attention_args`.
    """
    b, hq, hkv, t_max, d = check_decode_attention_args(q, k_cache, v_cache, lengths)
    span = check_window(window)  # 0: none
    group = hq // hkv
    lengths = lengths.to(device=q.device).long()
    t = int(lengths.max()) if b else 0  # positions past the longest row are never read
    positions = torch.arange(t, device=q.device)[None, :]  # (1, t)
    valid = positions < lengths[:, None]  # (B, t)
    if span:
        valid &= positions >= lengths[:, None] - span  # (B, t): inside the window too
    keys, values = k_cache[:, :, :t].float(), v_cache[:, :, :t].float()  # (B, Hkv, t, D); no copy for float32
    if b > 1 or span:  # entries outside a row: masked with where, not by multiplying (0 * inf is NaN)
        keys = torch.where(valid[:, None, :, None], keys, 0.0)
        values = torch.where(valid[:, None, :, None], values, 0.0)
    qg = q.float().reshape(b, hkv, group, d)  # (B, Hq, D) -> (B, Hkv, G, D)
    scores = torch.einsum("bhgd,bhtd->bhgt", qg, keys) * scale  # (B, Hkv, G, t)
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    # a row with no position to read (length 0) -> zeros, as the kernel stores; not nan_to_num, which also made the
    # NaN of a NaN / inf query or cache entry inside the row zeros (the kernel and SDPA return NaN there)
    probs = torch.softmax(scores, dim=-1).masked_fill(~valid.any(dim=1)[:, None, None, None], 0.0)
    out = torch.einsum("bhgt,bhtd->bhgd", probs, values)  # (B, Hkv, G, D)
    return out.reshape(b, hq, d)  # (B, Hkv, G, D) -> (B, Hq, D)
