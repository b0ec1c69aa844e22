"""INT4 block-wise weights: the codes the export writes for ``com.microsoft.MatMulNBits`` decode (in ONNX
Runtime itself and in the NumPy reference of the contrib op spec) to exactly the fake-quantized weights
training measured, and weights no float16 block scale can hold are refused instead of becoming NaN."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from edgesdk.compress.fake_quant import quantize_weight  # noqa: E402
from edgesdk.errors import ExportError  # noqa: E402
from edgesdk.export.blockwise import INT4_SCALE_DIVISORS, half_scales, quantize_blockwise  # noqa: E402


def _ort_weights(q) -> np.ndarray:
    """The (K, N) matrix an ONNX Runtime MatMulNBits over ``q`` multiplies by: identity input, float32
    compute (accuracy_level 1), no graph optimizations."""
    node = helper.make_node("MatMulNBits", ["x", "B", "scales"], ["y"], domain="com.microsoft", K=q.k, N=q.n,
                            bits=q.bits, block_size=q.block_size, accuracy_level=1)
    graph = helper.make_graph(
        [node], "matmul_nbits", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, q.k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, q.n])],
        [numpy_helper.from_array(q.packed, "B"), numpy_helper.from_array(q.scales.astype(np.float32), "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": np.eye(q.k, dtype=np.float32)})[0]


def _symmetric_blocks(rows: int, block: int, seed: int) -> np.ndarray:
    """(rows, block) torch-layout weights, each row the values v and -v shuffled, |v| <= 5 with one 5: the
    scales +s and -s round such a row with exactly the same squared error (an exact tie)."""
    rng = np.random.default_rng(seed)
    out = np.empty((rows, block), np.float32)
    for row in range(rows):
        half = rng.integers(-4, 5, size=block // 2).astype(np.float32)
        half[0] = 5.0
        values = np.concatenate([half, -half])
        rng.shuffle(values)
        out[row] = values
    return out


def test_tied_scales_pick_the_same_codes_in_training_and_export():
    """Spec: fake_quant's docstring promises the exported graph computes the fake-quantized weights exactly.
    Before the fix the squared errors of the candidate scales were summed in float32, numpy pairwise and torch
    in vector lanes, so an exact (or near) tie between two candidates went different ways: on x86 some of these
    rows exported the opposite sign of scale, codes 7 / -8 swapped against what training used (a whole step)."""
    weights = _symmetric_blocks(600, 128, seed=0)  # torch layout (N, K)
    trained = quantize_weight(torch.from_numpy(weights), 4, "block", 128).numpy()
    q = quantize_blockwise(weights.T.copy(), 4, 128)
    exported = q.dequantize()  # (K, N), the NumPy reference of MatMulNBits
    np.testing.assert_array_equal(exported.T, trained)
    np.testing.assert_array_equal(_ort_weights(q), exported)


@pytest.mark.parametrize(("k", "n", "block"), [(40, 7, 32), (129, 5, 64), (96, 33, 16)])
def test_padded_odd_and_zero_blocks_decode_in_onnxruntime_as_trained(k, n, block):
    """K not a multiple of block_size (zero-padded: the spec's n_blocks_per_col = ceil(K / block_size)), odd N,
    an all-zero block (scale 1, codes 8: zero, never NaN): ORT, the reference and fake quantization agree."""
    weights = (np.random.default_rng(k).standard_normal((n, k)) * 0.02).astype(np.float32)
    weights[0, :block] = 0.0
    trained = quantize_weight(torch.from_numpy(weights), 4, "block", block).numpy()
    q = quantize_blockwise(weights.T.copy(), 4, block)
    assert q.packed.shape == (n, -(-k // block), block // 2)
    np.testing.assert_array_equal(q.dequantize().T, trained)
    np.testing.assert_array_equal(_ort_weights(q), q.dequantize())
    assert not trained[0, :block].any()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("bits", [4, 8])
def test_non_finite_weight_is_refused(bad, bits):
    """A NaN or infinite weight made an infinite (or NaN) block scale and NaN codes: the graph computed NaN."""
    weights = np.ones((64, 3), np.float32)
    weights[37, 2] = bad
    with pytest.raises(ExportError, match=r"holds .* at input 37, output 2"):
        quantize_blockwise(weights, bits, 32)


@pytest.mark.parametrize(("bits", "peak"), [(4, 5.0e5), (8, 9.0e6)])
def test_weight_beyond_float16_scales_is_refused(bits, peak):
    """absmax / qmax above float16's 65504 rounds the stored scale to infinity: every weight of the block
    decoded as 0 * inf = NaN, in ONNX Runtime and in the reference."""
    weights = np.full((32, 2), 0.5, np.float32)
    weights[3, 1] = peak
    with pytest.raises(ExportError, match=r"output 1, block 0\) has absmax"):
        quantize_blockwise(weights, bits, 32)


def test_scale_search_continues_past_an_overflowing_candidate():
    """A block with absmax in (6 * 65504, 7 * 65504]: absmax / 6 is infinite in float16 (squared error NaN).
    np.minimum / torch.minimum kept that NaN as the best error and stopped the search at absmax / 7; now the
    best finite candidate is taken, the same in training and export."""
    block = np.array([-4.2e5] + [3.0e5, -1.5e5, 2.1e5] * 10 + [0.0], np.float32)  # 32 weights
    q = quantize_blockwise(block.reshape(32, 1), 4, 32)
    restored = q.dequantize()[:, 0]
    assert np.isfinite(restored).all()
    absmax = np.float32(np.abs(block).max())
    with np.errstate(over="ignore"):  # absmax / 6 overflows float16: that candidate is left out below
        candidates = [half_scales(np.array([absmax / 7], np.float32))[0]]
        candidates += [half_scales(np.array([sign * absmax / c], np.float32))[0]
                       for c in INT4_SCALE_DIVISORS for sign in (1.0, -1.0)]
    errors = [float(((np.clip(np.rint(block / s), -8, 7) * s - block).astype(np.float64) ** 2).sum())
              for s in candidates if np.isfinite(s)]
    chosen = float(((restored - block).astype(np.float64) ** 2).sum())
    assert chosen == min(errors)
    assert chosen < errors[0]  # better than absmax / 7, where the search used to stop
    trained = quantize_weight(torch.from_numpy(block.reshape(1, 32)), 4, "block", 32).numpy()[0]
    np.testing.assert_array_equal(restored, trained)
