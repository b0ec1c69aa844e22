"""Re-encode a bundle's stored matrices as GGUF tensors without re-quantizing them.

MatMulNBits blocks and llama.cpp's legacy quants are the same arithmetic: a signed code times one
float16 scale per block of weights along K, the code stored unsigned with an implicit zero point
(MatMulNBits: 8 for 4 bits, 128 for 8; ``export/blockwise.py``). ggml's blocks hold 32 weights
(``ggml-common.h``: ``block_q4_0`` = float16 d + 16 bytes, weight j in the low nibble of byte j and
weight j + 16 in its high nibble, value (q - 8) * d; ``block_q8_0`` = float16 d + 32 signed bytes,
value q * d). A MatMulNBits block of 32 · m weights is therefore m ggml blocks that repeat its scale,
and the codes only move between nibbles: the GGUF file computes with exactly the bundle's weights.

Where that cannot hold (a block of 16, K not a multiple of 32, or scales that are not float16
values: bundles of schema 1 stored float32 scales) the matrix is written as float32 values equal to
the dequantized weights, also exact, only larger.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgesdk.export.blockwise import BlockQuantized, unpack_codes

GGML_BLOCK = 32  # weights per block of Q4_0 and Q8_0
Q4_0_BYTES = 2 + GGML_BLOCK // 2  # float16 d + 16 nibble pairs
Q8_0_BYTES = 2 + GGML_BLOCK  # float16 d + 32 int8


@dataclass(frozen=True)
class GGUFTensorData:
    """A tensor as ``gguf.GGUFWriter.add_tensor`` takes it: ``data`` and, for quantized blocks, the
    ggml type name (``Q4_0`` / ``Q8_0``; None for float32 values)."""

    data: np.ndarray  # float32 (N, K), or uint8 (N, K / 32 * bytes per block)
    quant: str | None


def exact_ggml_type(matrix: BlockQuantized) -> str | None:
    """The ggml block type that holds ``matrix``'s codes and scales exactly (None: none does)."""
    if matrix.block_size % GGML_BLOCK or matrix.k % GGML_BLOCK:
        return None
    if not np.array_equal(matrix.scales.astype(np.float16).astype(np.float32), matrix.scales):
        return None  # a ggml block's float16 d would round these scales
    return {4: "Q4_0", 8: "Q8_0"}.get(matrix.bits)


def encode_matrix(matrix: BlockQuantized | np.ndarray) -> GGUFTensorData:
    """``matrix`` (rows = output features) in the GGUF form that keeps its values exactly."""
    if not isinstance(matrix, BlockQuantized):
        return GGUFTensorData(np.ascontiguousarray(matrix, dtype=np.float32), None)
    kind = exact_ggml_type(matrix)
    if kind is None:
        return GGUFTensorData(np.ascontiguousarray(decoded_values(matrix)), None)
    blocks = matrix.k // GGML_BLOCK
    codes = unpack_codes(matrix.packed, matrix.bits).reshape(matrix.n, -1)[:, : matrix.k]  # (N, K) unsigned
    codes = codes.reshape(matrix.n, blocks, GGML_BLOCK)  # (N, K/32, 32)
    per_block = matrix.block_size // GGML_BLOCK
    scales = np.repeat(matrix.scales.reshape(matrix.n, -1), per_block, axis=1)[:, :blocks]  # (N, K/32)
    scale_bytes = scales.astype("<f2").view(np.uint8).reshape(matrix.n, blocks, 2)
    if kind == "Q4_0":
        payload = codes[..., : GGML_BLOCK // 2] | (codes[..., GGML_BLOCK // 2:] << 4)  # (N, K/32, 16)
    else:  # Q8_0: the unsigned code minus MatMulNBits' zero point 128, as int8 bytes
        payload = (codes.astype(np.int16) - 128).astype(np.int8).view(np.uint8)  # (N, K/32, 32)
    packed = np.concatenate([scale_bytes, payload.astype(np.uint8)], axis=-1)  # (N, K/32, bytes per block)
    return GGUFTensorData(packed.reshape(matrix.n, -1), kind)


def decoded_values(matrix: BlockQuantized | np.ndarray) -> np.ndarray:
    """The float32 (N, K) values ``matrix`` computes with (what a GGUF reader must get back)."""
    if isinstance(matrix, BlockQuantized):
        return matrix.dequantize().T
    return np.asarray(matrix, dtype=np.float32)
