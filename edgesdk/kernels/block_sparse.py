"""Block-sparse INT8 weights in block-compressed-row (BSR) form.

A weight ``W`` of shape ``(N, K)`` (N outputs, K inputs, the ``nn.Linear`` convention) is cut into a grid of
``(block_n, block_k)`` tiles. Only tiles that are kept are stored, block row by block row, exactly as the CSR
format stores non-zero scalars, but with a dense tile per entry (BSR; see the scipy ``bsr_matrix`` docs and
Saad, *Iterative Methods for Sparse Linear Systems*, 2nd ed., §3.4, for CSR):

* ``row_offsets[r] : row_offsets[r + 1]`` are the stored tiles of block row ``r`` (``N // block_n + 1`` entries,
  ``ceil`` when N is not a multiple of the block);
* ``col_index[i]`` is the block column of stored tile ``i`` (sorted within a block row);
* ``values[i]`` is the int8 tile itself; ``scales`` is the per-output-channel dequantisation scale, so the float
  weight is ``W[n, k] = scales[n] * q[n, k]``.

N and K need not be multiples of the block: the matrix is zero-padded to whole tiles before it is cut, so stored
tiles are always full and the kernels mask only the activation loads and the output stores.

Intra-tile layouts (``layout``):

* ``"plain"``: ``values`` is ``(nnz, block_n, block_k)``: each output channel's ``block_k`` weights are
  contiguous along K, the row-major layout of ``nn.Linear.weight``. A GEMV thread that owns an output row reads
  consecutive bytes and reduces along the contiguous axis.
* ``"transposed"``: ``values`` is ``(nnz, block_k, block_n)``: contiguous along N (the layout the seed exporter
  wrote). Consecutive threads then own consecutive outputs, so a warp's loads coalesce across outputs while
  every thread broadcasts the same activation; the reduction runs across rows of the tile.

Both hold the same bytes; which one reads faster is a question for the GPU benchmark
(``tests/benchmarks/test_block_sparse_gpu.py``).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from edgesdk.kernels.layouts import LAYOUTS

ARRAYS = ("values", "col_index", "row_offsets", "scales")  # a weight's tensors: what state_dict writes besides meta
# meta tensor written next to the arrays by ``state_dict``: N, K, block_n, block_k, layout code.
_META_LEN = 5


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class BlockSparseWeight:
    """INT8 weight (N out, K in) stored as block-compressed rows (BSR): only non-zero blocks."""

    values: torch.Tensor       # int8 (nnz, block_n, block_k) "plain"; (nnz, block_k, block_n) "transposed"
    col_index: torch.Tensor    # int32 (nnz,) block column of each stored block, sorted within a block row
    row_offsets: torch.Tensor  # int32 (ceil(N / block_n) + 1,) CSR offsets per block row
    scales: torch.Tensor       # float32 (N,) per-output-channel dequantisation scale
    shape: tuple[int, int]     # (N, K)
    block: tuple[int, int]     # (block_n, block_k)
    layout: str = "plain"      # "plain" | "transposed"

    def __post_init__(self) -> None:
        """Checks what the kernels rely on and cannot check per launch: ``shape`` and ``block`` (two integers each,
        N, K >= 0 and block edges >= 1; stored as Python ints), dtypes (int8 values, int32 indices,
        float32 scales), shapes (``col_index``, ``row_offsets``, ``scales`` 1-D: the kernels read them as flat
        arrays, and an ``(N, 1)`` scale made the twin return ``(M, N, N)``), CSR offsets that start at 0, never
        decrease and end at nnz, block columns within ``ceil(K / block_k)``, strictly increasing within each block
        row (sorted, no tile stored twice). The four tensors are made contiguous (the kernels index them as flat
        arrays).
        Raises ValueError naming the tensor, what it holds and what was expected."""
        for name in ("values", "col_index", "row_offsets", "scales"):
            object.__setattr__(self, name, getattr(self, name).contiguous())
        _check_pair("shape", self.shape, "(N, K): the weight's output and input sizes, whole numbers >= 0", 0)
        _check_pair("block", self.block, "(block_n, block_k): the tile edges, whole numbers >= 1", 1)
        object.__setattr__(self, "shape", (int(self.shape[0]), int(self.shape[1])))
        object.__setattr__(self, "block", (int(self.block[0]), int(self.block[1])))
        n, k = self.shape
        bn, bk = self.block
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}: {_LAYOUT_MEANING}")
        tile = (bn, bk) if self.layout == "plain" else (bk, bn)
        for name in ("col_index", "row_offsets", "scales"):  # the kernels read them flat, the twin by shape
            held = getattr(self, name)
            if held.dim() != 1:
                raise ValueError(f"{name} must be a 1-D tensor (BSR's flat index and scale arrays, as scipy's "
                                 f"bsr_matrix holds them), got shape {tuple(held.shape)}: store it flattened "
                                 f"(.reshape(-1)) or build the weight with BlockSparseWeight.from_dense")
        nnz = int(self.col_index.numel())
        if self.values.dtype != torch.int8 or tuple(self.values.shape) != (nnz, *tile):
            raise ValueError(f"values must be int8 of shape {(nnz, *tile)}, got {self.values.dtype} "
                             f"{tuple(self.values.shape)}{_values_hint(self.values, nnz, self.block, self.layout)}")
        if self.row_offsets.numel() != _cdiv(n, bn) + 1:
            raise ValueError(f"row_offsets must have {_cdiv(n, bn) + 1} entries, got {self.row_offsets.numel()}")
        if self.scales.numel() != n:
            raise ValueError(f"scales must have N={n} entries, got {self.scales.numel()}: one dequantisation scale "
                             f"per output channel (W[n, k] = scales[n] * q[n, k]; there are no per-block scales); "
                             f"BlockSparseWeight.from_dense spreads a single per-tensor scale over the N channels")
        for name, dtype in (("col_index", torch.int32), ("row_offsets", torch.int32), ("scales", torch.float32)):
            got = getattr(self, name).dtype
            if got != dtype:
                raise ValueError(f"{name} must be {dtype} (the kernels read it so), got {got}")
        offsets = self.row_offsets.tolist()
        steps = [b - a for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
        if offsets[0] != 0 or offsets[-1] != nnz or min(steps, default=0) < 0:
            raise ValueError(f"row_offsets must start at 0, never decrease and end at nnz={nnz}, got "
                             f"{offsets if len(offsets) <= 12 else offsets[:6] + ['...'] + offsets[-6:]}")
        if nnz and (int(self.col_index.min()) < 0 or int(self.col_index.max()) >= _cdiv(k, bk)):
            raise ValueError(f"col_index must lie in [0, {_cdiv(k, bk)}) (block columns of K={k} in blocks of "
                             f"{bk}), got values in [{int(self.col_index.min())}, {int(self.col_index.max())}]")
        if nnz > 1:  # BSR's canonical form (scipy's has_canonical_format): sorted, no duplicate within a block row
            cols = self.col_index.reshape(-1).long().cpu()
            rows = torch.repeat_interleave(torch.arange(len(steps)), torch.tensor(steps, dtype=torch.long))
            bad = ((rows[1:] == rows[:-1]) & (cols[1:] <= cols[:-1])).nonzero().flatten()
            if bad.numel():
                i = int(bad[0]) + 1
                raise ValueError(
                    f"col_index must increase strictly within a block row (the sorted, duplicate-free BSR form; the "
                    f"kernels add every stored tile, so a repeated block column would count twice while to_dense "
                    f"keeps one), got block column {int(cols[i])} after {int(cols[i - 1])} in block row "
                    f"{int(rows[i])} (stored tiles {i - 1} and {i}); sort each block row's tiles by column and merge "
                    f"repeats, or build the weight with BlockSparseWeight.from_dense")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dense(cls, weight_q: torch.Tensor, scales: torch.Tensor, block: tuple[int, int] = (32, 32),
                   mask: torch.Tensor | None = None, layout: str = "plain") -> BlockSparseWeight:
        """Compress an int8 ``(N, K)`` weight; ``mask`` (bool ``(ceil(N/bn), ceil(K/bk))``) picks the kept blocks.

        ``mask=None`` keeps every block holding a non-zero. Blocks the mask drops are dropped even when non-zero
        (that is how block pruning is applied); blocks it keeps are stored even when all-zero.

        ``scales``: N per-output-channel scales (any shape of N elements, any float dtype), or one per-tensor scale
        (a 0-d tensor, a one-element tensor or a Python float, as ``torch.quantize_per_tensor`` takes it), which
        every output channel gets.
        """
        if weight_q.dtype != torch.int8 or weight_q.dim() != 2:
            raise ValueError(f"weight_q must be a 2-D int8 tensor, got {weight_q.dtype} {tuple(weight_q.shape)}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}: {_LAYOUT_MEANING}")
        _check_pair("block", block, "two positive integers (block_n, block_k)", 1, fix="")
        n, k = weight_q.shape
        bn, bk = int(block[0]), int(block[1])
        nbr, nbc = _cdiv(n, bn), _cdiv(k, bk)
        padded = torch.zeros(nbr * bn, nbc * bk, dtype=torch.int8)
        padded[:n, :k] = weight_q.cpu()
        # (nbr*bn, nbc*bk) -> (nbr, bn, nbc, bk) -> (nbr, nbc, bn, bk): tile [r, c] is block row r, block col c
        tiles = padded.reshape(nbr, bn, nbc, bk).permute(0, 2, 1, 3)
        if mask is None:
            keep = tiles.ne(0).flatten(2).any(dim=2)  # (nbr, nbc)
        else:
            keep = mask.to(device="cpu", dtype=torch.bool)
            if tuple(keep.shape) != (nbr, nbc):
                raise ValueError(f"mask must have shape (ceil(N/bn), ceil(K/bk)) = {(nbr, nbc)}, "
                                 f"got {tuple(keep.shape)}")
        rows, cols = keep.nonzero(as_tuple=True)  # row-major order: sorted by row, then column
        values = tiles[rows, cols]  # (nnz, bn, bk)
        if layout == "transposed":
            values = values.transpose(1, 2)  # (nnz, bk, bn)
        counts = keep.sum(dim=1)  # (nbr,)
        row_offsets = torch.zeros(nbr + 1, dtype=torch.int32)
        row_offsets[1:] = torch.cumsum(counts, 0).to(torch.int32)
        scales = torch.as_tensor(scales).detach().to(device="cpu", dtype=torch.float32).reshape(-1)
        if scales.numel() == 1 and n != 1:  # per-tensor quantisation: the one scale is every output channel's
            scales = scales.expand(n)
        scales = scales.contiguous()
        return cls(values=values.contiguous(), col_index=cols.to(torch.int32).contiguous(), row_offsets=row_offsets,
                   scales=scales, shape=(int(n), int(k)), block=(bn, bk), layout=layout)

    def to(self, device: torch.device | str) -> BlockSparseWeight:
        """The same weight with every tensor on ``device``."""
        return BlockSparseWeight(self.values.to(device), self.col_index.to(device), self.row_offsets.to(device),
                                 self.scales.to(device), self.shape, self.block, self.layout)

    # ------------------------------------------------------------------ views
    @property
    def nnz_blocks(self) -> int:
        return int(self.col_index.numel())

    @property
    def block_rows(self) -> int:
        return _cdiv(self.shape[0], self.block[0])

    @property
    def block_cols(self) -> int:
        return _cdiv(self.shape[1], self.block[1])

    def plain_values(self) -> torch.Tensor:
        """int8 ``(nnz, block_n, block_k)`` whatever the stored layout."""
        return self.values if self.layout == "plain" else self.values.transpose(1, 2)

    def block_row_index(self) -> torch.Tensor:
        """int64 ``(nnz,)``: the block row of every stored block (expanded ``row_offsets``)."""
        counts = (self.row_offsets[1:] - self.row_offsets[:-1]).long().cpu()
        return torch.repeat_interleave(torch.arange(self.block_rows), counts).to(self.values.device)

    def to_dense(self) -> torch.Tensor:
        """int8 ``(N, K)``; dropped blocks are zero."""
        n, k = self.shape
        bn, bk = self.block
        tiles = torch.zeros(self.block_rows, self.block_cols, bn, bk, dtype=torch.int8, device=self.values.device)
        tiles[self.block_row_index(), self.col_index.long()] = self.plain_values()
        # (nbr, nbc, bn, bk) -> (nbr, bn, nbc, bk) -> (nbr*bn, nbc*bk), cropped to (N, K)
        return tiles.permute(0, 2, 1, 3).reshape(self.block_rows * bn, self.block_cols * bk)[:n, :k].contiguous()

    def dequantized(self) -> torch.Tensor:
        """float32 ``(N, K)``: ``scales[:, None] * to_dense()``."""
        return self.to_dense().float() * self.scales.float()[:, None]

    @property
    def density(self) -> float:
        """Stored blocks / all blocks (1.0 for an empty matrix)."""
        total = self.block_rows * self.block_cols
        return self.nnz_blocks / total if total else 1.0

    @property
    def nbytes(self) -> int:
        """Bytes of ``values + col_index + row_offsets + scales`` (what a GEMV reads besides activations)."""
        return sum(t.numel() * t.element_size() for t in (self.values, self.col_index, self.row_offsets, self.scales))

    # ------------------------------------------------------------------ storage
    def state_dict(self, prefix: str = "") -> dict[str, torch.Tensor]:
        """Flat tensors for safetensors under ``{prefix}.values``, ``.col_index``, ``.row_offsets``, ``.scales`` and
        ``.meta`` (int64: N, K, block_n, block_k, layout code 0 plain / 1 transposed), which restores the rest."""
        base = _key_base(prefix)
        meta = torch.tensor([*self.shape, *self.block, LAYOUTS.index(self.layout)], dtype=torch.int64)
        return {
            f"{base}values": self.values.contiguous(),
            f"{base}col_index": self.col_index.contiguous(),
            f"{base}row_offsets": self.row_offsets.contiguous(),
            f"{base}scales": self.scales.contiguous(),
            f"{base}meta": meta,
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, torch.Tensor], prefix: str = "",
                        device: torch.device | str | None = None) -> BlockSparseWeight:
        """Inverse of :meth:`state_dict` (same ``prefix``); tensors moved to ``device`` when given.

        Raises ValueError naming the weight's keys (``{prefix}.values`` ...) when one is missing or when they do not
        form a valid weight (what :meth:`__post_init__` checks), so an error in a file of many layers names the layer."""
        base = _key_base(prefix)
        named = f"{base}*" if base else "(keys without a prefix)"
        missing = [f"{base}{name}" for name in (*ARRAYS, "meta") if f"{base}{name}" not in state]
        if missing:
            raise ValueError(f"block-sparse weight {named} lacks {', '.join(missing)}: state_dict() writes "
                             f"{', '.join(f'{base}{name}' for name in (*ARRAYS, 'meta'))}; the file is incomplete "
                             "or was written under another prefix (rebuild it, or pass the prefix it was saved with)")
        meta = [int(v) for v in state[f"{base}meta"].tolist()]
        if len(meta) != _META_LEN:
            raise ValueError(f"{base}meta must hold {_META_LEN} integers, got {meta}")
        n, k, bn, bk, layout_code = meta
        if not 0 <= layout_code < len(LAYOUTS):
            raise ValueError(f"{base}meta holds layout code {layout_code}; expected 0 (plain) or 1 (transposed)")
        try:
            weight = cls(values=state[f"{base}values"], col_index=state[f"{base}col_index"],
                         row_offsets=state[f"{base}row_offsets"], scales=state[f"{base}scales"],
                         shape=(n, k), block=(bn, bk), layout=LAYOUTS[layout_code])
        except ValueError as exc:
            raise ValueError(f"block-sparse weight {named} ({n}x{k} in {bn}x{bk} {LAYOUTS[layout_code]} blocks, "
                             f"from {base}meta) is not valid: {exc}") from exc
        return weight if device is None else weight.to(device)


_LAYOUT_MEANING = ("the order of each stored tile, 'plain' (nnz, block_n, block_k) as nn.Linear.weight holds it or "
                   "'transposed' (nnz, block_k, block_n); the export setting export.sparse_layout names it")


def _values_hint(values: torch.Tensor, nnz: int, block: tuple[int, int], layout: str) -> str:
    """What to do about ``values`` that are not ``layout``'s int8 tiles: int8 tiles of the other layout (block_n !=
    block_k) are named with the layout that holds them, so that a weight built with the wrong ``layout`` says so
    rather than only "must be (3, 16, 32), got (3, 32, 16)"; other values are told how they must be made."""
    bn, bk = block
    other = LAYOUTS[1 - LAYOUTS.index(layout)]
    other_tile = (bn, bk) if other == "plain" else (bk, bn)
    if values.dtype == torch.int8 and bn != bk and tuple(values.shape) == (nnz, *other_tile):
        return (f": those are {other!r} tiles ({'block_n, block_k' if other == 'plain' else 'block_k, block_n'}); "
                f"pass layout={other!r}, or values.transpose(1, 2) to keep layout={layout!r}")
    return (f": one int8 tile of {'(block_n, block_k)' if layout == 'plain' else '(block_k, block_n)'} per stored "
            f"block of col_index ({nnz}); build the weight with BlockSparseWeight.from_dense")


def _check_pair(name: str, pair: object, meaning: str, least: int,
                fix: str = "build the weight with BlockSparseWeight.from_dense, or pass Python ints") -> None:
    """Refuse a ``shape`` or ``block`` that is not two integers of at least ``least`` (a float or a bool block
    would fail later in torch's words, or in Triton's, far from the weight), naming it, its value and what it must
    hold, then ``fix``; a bare block edge (``block=32``) is told to pass the edge twice. numpy integers are
    integers, and a 1-D numpy array or torch tensor of two is a pair (its ``tolist()``: a tensor's elements are 0-d
    tensors, no integers)."""
    if isinstance(pair, (tuple, list)):
        items = tuple(pair)
    elif getattr(pair, "ndim", None) == 1:
        items = tuple(pair.tolist() if hasattr(pair, "tolist") else pair)
    else:
        items = None
    if items is None or len(items) != 2 or any(
            isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < least for v in items):
        square = "; for square tiles pass the edge twice, e.g. (32, 32)" if name == "block" and (
            items is None or len(items) < 2) else ""
        raise ValueError(f"{name} must be {meaning}, got {pair!r}{square}{f'; {fix}' if fix else ''}")


def _key_base(prefix: str) -> str:
    """``"layers.0.qkv"`` -> ``"layers.0.qkv."``; ``""`` and ``"w."`` stay as they are."""
    return prefix if not prefix or prefix.endswith(".") else prefix + "."
