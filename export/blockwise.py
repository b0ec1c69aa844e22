"""Block-wise symmetric weight quantization in ONNX Runtime's MatMulNBits layout.

A weight W (K, N) used as ``x @ W`` is split along K into blocks of ``block_size``; each block of
each output column gets one float scale (absmax / qmax) and signed codes, stored unsigned with
the implicit zero point 2^(bits-1) that MatMulNBits assumes when no zero point is given.
Layout (``com.microsoft.MatMulNBits``): B is uint8 (N, K/block, block*bits/8), codes packed
low nibble first for 4 bits; scales are (N * K/block,), each a float16 value (stored as float16
and widened in the graph, as llama.cpp's Q4_0/Q8_0 store theirs): half the scale bytes, and
every candidate scale is rounded to float16 before its error is measured, so the codes are those
of the stored scales.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INT4_SCALE_DIVISORS = tuple(6.0 + 0.25 * i for i in range(13))  # absmax / c candidates, c in [6, 9]
SMALLEST_SCALE = 2.0 ** -14  # float16's smallest normal: tinier scales would flush towards zero


def half_scales(scales: np.ndarray) -> np.ndarray:
    """float32 scales rounded to float16, magnitudes at least SMALLEST_SCALE (sign kept); the torch
    twin is ``compress.fake_quant.half_scales``."""
    magnitude = np.maximum(np.abs(scales), SMALLEST_SCALE)
    return (np.where(scales < 0, -magnitude, magnitude)).astype(np.float16).astype(np.float32)


@dataclass(frozen=True)
class BlockQuantized:
    packed: np.ndarray  # uint8 (N, blocks, block*bits/8)
    scales: np.ndarray  # float32 (N * blocks,), each exactly a float16 value
    bits: int
    block_size: int
    k: int  # original K (before padding to a whole number of blocks)
    n: int

    def dequantize(self) -> np.ndarray:
        """Back to a float32 (K, N) matrix: exactly what the kernel multiplies by."""
        codes = unpack_codes(self.packed, self.bits)  # (N, blocks, block) unsigned
        signed = codes.astype(np.float32) - 2 ** (self.bits - 1)
        blocks = self.packed.shape[1]
        weights = signed * self.scales.reshape(self.n, blocks, 1)  # (N, blocks, block)
        return weights.reshape(self.n, -1)[:, : self.k].T.copy()


def quantize_blockwise(weight: np.ndarray, bits: int, block_size: int, name: str = "") -> BlockQuantized:
    """Quantize a (K, N) float matrix; K is zero-padded to a multiple of ``block_size``. ``name`` (the graph's
    name of the weight, ``layers.3.mlp.down``) is what an error about an unquantizable weight calls it."""
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8, got {bits}")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size}")
    k, n = weight.shape
    blocks = -(-k // block_size)
    padded = np.zeros((blocks * block_size, n), np.float32)
    padded[:k] = weight
    grouped = padded.T.reshape(n, blocks, block_size)  # (N, blocks, block)
    qmax = 2 ** (bits - 1) - 1
    absmax = np.abs(grouped).max(axis=-1, keepdims=True)
    with np.errstate(over="ignore"):  # an overflow to infinity is reported below, by name
        scales = half_scales(np.where(absmax > 0, absmax / qmax, 1.0).astype(np.float32))
    _check_representable(padded, k, absmax, scales, bits, name)
    if bits == 4:
        scales = _search_scales(grouped, absmax, scales, qmax)
    codes = np.clip(np.rint(grouped / scales), -qmax - 1, qmax).astype(np.int16) + 2 ** (bits - 1)
    return BlockQuantized(pack_codes(codes.astype(np.uint8), bits), scales.reshape(-1), bits, block_size, k, n)


def _check_representable(padded: np.ndarray, k: int, absmax: np.ndarray, scales: np.ndarray, bits: int,
                         name: str = "") -> None:
    """Refuse a weight whose blocks have no finite float16 scale (``k``: its rows before the zero padding; ``name``:
    the weight's name in the graph, which the error gives with the (input, output) position of the culprit).

    MatMulNBits and GatherBlockQuantized (ONNX Runtime contrib ops) compute ``(code - zero point) *
    scale`` and this layout stores each scale as float16 (largest finite value 65504): a NaN or
    infinite weight, or a block whose absmax / qmax rounds past 65504 in float16 (|w| above about
    458,000 at 4 bits, 8.3 million at 8), would get an infinite scale and dequantize to NaN
    (0 * inf), silently, in the graph and in this reference alike.
    """
    from edgesdk.errors import ExportError

    n = padded.shape[1]
    weight = f"the ({k}, {n}) weight {name}" if name else f"the ({k}, {n}) weight"
    if not np.isfinite(padded).all():
        row, column = np.argwhere(~np.isfinite(padded))[0]
        raise ExportError(
            f"{weight} being quantized to {bits}-bit blocks holds {padded[row, column]} at input "
            f"{row}, output {column}; block scales need finite weights",
            "the model's weights are not finite: check the checkpoint (and that the compress stages did not "
            "diverge), or export it with weights: fp32")
    if not np.isfinite(scales).all():
        column, block = np.argwhere(~np.isfinite(scales[..., 0]))[0]
        qmax = 2 ** (bits - 1) - 1
        raise ExportError(
            f"a block of {weight} (output {column}, block {block}) has absmax "
            f"{float(absmax[column, block, 0]):.6g}; its {bits}-bit scale absmax / {qmax} exceeds float16's "
            f"largest value 65504, which the block layout stores scales in",
            "such weights are far outside a trained language model's range: check the checkpoint, or "
            "export with weights: fp32")


def _search_scales(grouped: np.ndarray, absmax: np.ndarray, absmax_scales: np.ndarray, qmax: int) -> np.ndarray:
    """Per block, the scale (either sign) with the least squared rounding error.

    With 16 levels the absmax/7 scale wastes the -8 code; llama.cpp's Q4_0 maps the largest-
    magnitude weight to -8 instead, and its k-quants search scales by error. Here signed
    candidates absmax/c for c in [6, 9] are tried, the absmax/7 one among them.
    """
    best_scale = absmax_scales.copy()
    best_error = _rounding_error(grouped, best_scale, qmax)
    for divisor in INT4_SCALE_DIVISORS:
        for sign in (1.0, -1.0):
            with np.errstate(over="ignore", invalid="ignore"):  # absmax / 6 may pass float16's 65504: error NaN
                candidate = half_scales(np.where(absmax > 0, sign * absmax / divisor, 1.0).astype(np.float32))
                error = _rounding_error(grouped, candidate, qmax)
            better = error < best_error  # False for a NaN error: an infinite candidate is never taken
            best_scale = np.where(better, candidate, best_scale)
            best_error = np.where(better, error, best_error)  # not np.minimum, which would keep a NaN
    return best_scale


def _rounding_error(grouped: np.ndarray, scales: np.ndarray, qmax: int) -> np.ndarray:
    """Per block, the sum of squared rounding errors: float32 terms summed in float64.

    The terms are the same float32 values torch computes (``compress.fake_quant._rounding_error``),
    but a float32 sum depends on the summation order (numpy sums pairwise, torch in vector lanes), so
    near ties between candidates (a block symmetric about 0 ties +s and -s exactly) went different
    ways and the exported codes differed from the fake-quantized weights the build measured. Summed
    in float64 the float32 terms add up exactly (or nearly), in any order, and ties break alike.
    """
    codes = np.clip(np.rint(grouped / scales), -qmax - 1, qmax)
    return ((codes * scales - grouped) ** 2).sum(axis=-1, keepdims=True, dtype=np.float64)


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """(…, block) unsigned codes -> (…, block*bits/8) bytes."""
    if bits == 8:
        return codes
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack_codes(packed: np.ndarray, bits: int) -> np.ndarray:
    if bits == 8:
        return packed
    low, high = packed & 0x0F, packed >> 4
    return np.stack([low, high], axis=-1).reshape(*packed.shape[:-1], -1)
