"""edgesdk.kernels: BSR weights, the PyTorch twins, and the Triton kernels run by Triton's CPU interpreter
(mode ``emulated``) against their twins in float32. Every comparison prints its max abs diff (``-s`` or ``-rA``)
and records it as the test property ``max_abs_diff``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from edgesdk.kernels.block_sparse import BlockSparseWeight  # noqa: E402
from edgesdk.kernels.ops import block_sparse_matmul, gqa_decode_attention, kernel_mode  # noqa: E402
from edgesdk.kernels.reference import (  # noqa: E402
    block_sparse_matmul_reference,
    gqa_decode_attention_reference,
)
from edgesdk.kernels.tuning import SM_DEFAULTS, tuning_for  # noqa: E402

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="emulated mode needs triton (pip install edgesdk[kernels])")
RTOL = 1e-4


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def random_weight(n: int, k: int, density: float, layout: str = "plain", block=(32, 32), seed: int = 0):
    """int8 (N, K) codes, per-channel scales and a block mask keeping round(density * blocks) blocks."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    scales = torch.rand(n, generator=gen) * 0.02 + 0.001
    nbr, nbc = cdiv(n, block[0]), cdiv(k, block[1])
    kept = round(density * nbr * nbc)
    mask = torch.zeros(nbr * nbc, dtype=torch.bool)
    mask[torch.randperm(nbr * nbc, generator=gen)[:kept]] = True
    mask = mask.reshape(nbr, nbc)
    return BlockSparseWeight.from_dense(codes, scales, block=block, mask=mask, layout=layout), codes, scales, mask


def check_close(actual: torch.Tensor, expected: torch.Tensor, record_property, label: str) -> float:
    diff = (actual.float() - expected.float()).abs().max().item() if expected.numel() else 0.0
    bound = RTOL * max(1.0, expected.abs().max().item() if expected.numel() else 0.0)
    record_property("max_abs_diff", diff)
    print(f"\n[max abs diff] {label}: {diff:.3e} (bound {bound:.1e})")
    assert diff <= bound, f"{label}: max abs diff {diff} > {bound}"
    return diff


# ---------------------------------------------------------------------------------------------- BSR format
def test_from_dense_round_trip_and_auto_mask():
    codes = torch.randint(-127, 128, (100, 70), dtype=torch.int8)
    codes[32:64, :] = 0  # block row 1 all zero
    codes[:, 64:] = 0  # last (partial) block column all zero
    scales = torch.rand(100)
    for layout in ("plain", "transposed"):
        w = BlockSparseWeight.from_dense(codes, scales, layout=layout)
        assert torch.equal(w.to_dense(), codes)
        assert w.row_offsets.tolist() == [0, 2, 2, 4, 6]  # 4 block rows x 3 block cols, col 2 and row 1 dropped
        assert w.col_index.tolist() == [0, 1, 0, 1, 0, 1]
        assert w.density == pytest.approx(6 / 12)
        assert torch.allclose(w.dequantized(), codes.float() * scales[:, None])


def test_mask_drops_blocks_and_layouts_hold_the_same_matrix():
    w_plain, codes, _, mask = random_weight(100, 70, 0.5, "plain", seed=3)
    w_t, *_ = random_weight(100, 70, 0.5, "transposed", seed=3)
    expected = codes.clone()
    for r in range(mask.shape[0]):
        for c in range(mask.shape[1]):
            if not mask[r, c]:
                expected[r * 32:(r + 1) * 32, c * 32:(c + 1) * 32] = 0
    assert torch.equal(w_plain.to_dense(), expected)
    assert torch.equal(w_t.to_dense(), expected)
    assert tuple(w_plain.values.shape) == (int(mask.sum()), 32, 32)
    assert torch.equal(w_t.values, w_plain.values.transpose(1, 2))
    assert w_plain.density == pytest.approx(mask.float().mean().item())


def test_bad_mask_and_layout_are_refused():
    codes = torch.zeros(64, 64, dtype=torch.int8)
    with pytest.raises(ValueError, match="mask must have shape"):
        BlockSparseWeight.from_dense(codes, torch.ones(64), mask=torch.ones(3, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="layout"):
        BlockSparseWeight.from_dense(codes, torch.ones(64), layout="diagonal")


def test_nbytes_below_dense_at_half_density():
    w, *_ = random_weight(576, 1536, 0.5)
    dense_bytes = 576 * 1536 + 576 * 4  # int8 codes + fp32 scales
    assert w.nbytes < 0.55 * dense_bytes
    full, *_ = random_weight(576, 1536, 1.0)
    assert w.nbytes < full.nbytes


def test_state_dict_round_trip():
    for layout in ("plain", "transposed"):
        w, *_ = random_weight(100, 70, 0.5, layout, block=(16, 32))
        state = w.state_dict("layers.0.qkv")
        assert set(state) == {f"layers.0.qkv.{k}" for k in ("values", "col_index", "row_offsets", "scales", "meta")}
        back = BlockSparseWeight.from_state_dict(state, "layers.0.qkv", device="cpu")
        assert (back.shape, back.block, back.layout) == ((100, 70), (16, 32), layout)
        assert torch.equal(back.to_dense(), w.to_dense())



@pytest.mark.parametrize(("patch", "message"), [
    ({"row_offsets": [0, 2, 9]}, r"row_offsets must start at 0, never decrease and end at nnz=4, got \[0, 2, 9\]"),
    ({"row_offsets": [0, 3, 2]}, "row_offsets must start at 0, never decrease"),
    ({"row_offsets": [1, 2, 4]}, "row_offsets must start at 0"),
    ({"col_index": [0, 1, 0, 7]}, r"col_index must lie in \[0, 2\).*got values in \[0, 7\]"),
    ({"col_index": [0, -1, 0, 1]}, r"col_index must lie in \[0, 2\)"),
    ({"col_index": "int64"}, "col_index must be torch.int32.*got torch.int64"),
    ({"row_offsets": "int64"}, "row_offsets must be torch.int32"),
    ({"scales": "float16"}, "scales must be torch.float32.*got torch.float16"),
    ({"meta": [64, 64, 32, 32, -1]}, "layout code -1; expected 0 \\(plain\\) or 1 \\(transposed\\)"),
    ({"meta": [64, 64, 32, 32, 2]}, "layout code 2"),
])
def test_corrupt_bsr_tensors_are_refused_on_load(patch, message):
    """Offsets past nnz, out-of-range block columns, wrong dtypes (the kernels read int32 / float32 bytes) and a
    layout code -1 (read as "transposed") were accepted and read out of bounds or as garbage."""
    state = BlockSparseWeight.from_dense(torch.ones(64, 64, dtype=torch.int8), torch.ones(64)).state_dict("w")
    for name, value in patch.items():
        old = state[f"w.{name}"]
        state[f"w.{name}"] = old.to(getattr(torch, value)) if isinstance(value, str) else \
            torch.tensor(value, dtype=old.dtype)
    with pytest.raises(ValueError, match=message):
        BlockSparseWeight.from_state_dict(state, "w")


def test_non_contiguous_values_are_stored_contiguous():
    """The kernels index values as flat tiles; a strided view of the right shape read the wrong bytes."""
    w = BlockSparseWeight.from_dense(torch.randint(-127, 128, (64, 64), dtype=torch.int8), torch.ones(64))
    view = w.values.transpose(1, 2).contiguous().transpose(1, 2)  # same shape and elements, other strides
    assert not view.is_contiguous()
    again = BlockSparseWeight(view, w.col_index, w.row_offsets, w.scales, w.shape, w.block, w.layout)
    assert again.values.is_contiguous()
    assert torch.equal(again.values, w.values)

def test_reference_equals_dense_matmul():
    w, *_ = random_weight(100, 70, 0.5, "transposed")
    x = torch.randn(5, 70)
    check_close(block_sparse_matmul_reference(x, w), x @ w.dequantized().T, lambda *a: None, "reference vs dense")


# ---------------------------------------------------------------------------------------------- BSR kernel
BSR_CASES = [
    (m, n, k, density, layout)
    for n, k in ((100, 70), (96, 160))
    for m in (1, 3, 17)
    for density in (1.0, 0.5, 0.25, 0.0)
    for layout in ("plain", "transposed")
    if (n, k) == (100, 70) or density in (1.0, 0.25)
]


@needs_triton
@pytest.mark.parametrize(("m", "n", "k", "density", "layout"), BSR_CASES)
def test_block_sparse_emulated_matches_reference(m, n, k, density, layout, record_property):
    w, *_ = random_weight(n, k, density, layout, seed=m + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k))
    out = block_sparse_matmul(x, w, mode="emulated")
    ref = block_sparse_matmul(x, w, mode="reference")
    assert out.shape == (m, n)
    assert out.dtype == torch.float32
    if density == 0.0:
        assert torch.count_nonzero(out) == 0
    check_close(out, ref, record_property, f"bsr M={m} {n}x{k} density={density} {layout}")


@needs_triton
def test_block_sparse_emulated_medium_shape(record_property):
    """SmolLM2-135M's down projection (576 x 1536) at 50 % density, batch 1 (decode)."""
    w, *_ = random_weight(576, 1536, 0.5, "transposed", seed=7)
    x = torch.randn(1, 1536)
    check_close(block_sparse_matmul(x, w, mode="emulated"), block_sparse_matmul_reference(x, w), record_property,
                "bsr M=1 576x1536 density=0.5 transposed")


@needs_triton
def test_block_sparse_emulated_strided_input_and_small_block(record_property):
    w, *_ = random_weight(40, 48, 0.5, "plain", block=(16, 16), seed=1)
    x = torch.randn(48, 5).T  # (5, 48) with strides (1, 5)
    check_close(block_sparse_matmul(x, w, mode="emulated"), block_sparse_matmul_reference(x, w), record_property,
                "bsr strided x, block 16x16")


GEMV_CASES = [(n, k, density, layout, unroll, per_sm)
              for n, k in ((100, 70), (576, 1536)) for density in (1.0, 0.5, 0.1)
              for layout in ("plain", "transposed") for unroll, per_sm in ((1, 1), (4, 1), (8, 64), (2, 64))]


@needs_triton
@pytest.mark.parametrize(("n", "k", "density", "layout", "unroll", "per_sm"), GEMV_CASES)
def test_gemv_unrolled_and_split_k_match_reference(n, k, density, layout, unroll, per_sm, record_property):
    """Batch 1: UNROLL blocks a step (a ragged last step masked) and split-K with atomic adds (per_sm 64 gives
    the 576 x 1536 weight 3 to 12 shares per block row, uneven where rows keep different counts) give the
    twin's result."""
    from edgesdk.kernels.triton_kernels import block_sparse_matmul_triton
    from edgesdk.kernels.tuning import gemv_splits

    w, *_ = random_weight(n, k, density, layout, seed=n + unroll)
    tuning = dataclasses.replace(tuning_for(87), gemv_unroll=unroll, gemv_programs_per_sm=per_sm)
    splits = gemv_splits(w.block_rows, w.nnz_blocks, tuning)
    assert splits >= 1 if per_sm > 1 else splits == 1
    for dtype in (torch.float32, torch.float16):
        x = torch.randn(1, k, generator=torch.Generator().manual_seed(k)).to(dtype)
        out = block_sparse_matmul_triton(x, w, emulated=True, tuning=tuning)
        assert out.dtype == dtype
        ref = block_sparse_matmul_reference(x.float(), w)
        if dtype == torch.float32:
            check_close(out, ref, record_property, f"gemv {n}x{k} d={density} {layout} U={unroll} split={splits}")
        else:  # the fp16 output rounds at 2^-11 relative
            assert (out.float() - ref).abs().max().item() <= 2e-3 * max(1.0, ref.abs().max().item())


def test_gemv_splits_fill_the_sms_without_starving_programs():
    from edgesdk.kernels.tuning import gemv_splits

    orin = tuning_for(87)  # 8 SMs, 8 programs per SM wanted, 4 blocks a step
    assert gemv_splits(18, 18 * 48, orin) == 4  # SmolLM2 down (576 x 1536, dense): 18 rows -> 64 programs
    assert gemv_splits(18, 18 * 9, orin) == 1  # 9 blocks a row: a share would get under two steps
    assert gemv_splits(256, 256 * 256, orin) == 1  # enough rows already
    assert gemv_splits(0, 0, orin) == 1
    h200 = tuning_for(90)
    assert gemv_splits(18, 18 * 18, h200) == 2


# ---------------------------------------------------------------------------------------------- attention
ATTN_CASES = [(hq, hkv, d) for hq, hkv in ((9, 3), (6, 2), (4, 4), (3, 1)) for d in (64, 32)]


def attention_inputs(b, hq, hkv, d, t_max, lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, d, generator=gen)
    k = torch.randn(b, hkv, t_max, d, generator=gen)
    v = torch.randn(b, hkv, t_max, d, generator=gen)
    return q, k, v, torch.tensor(lengths, dtype=torch.int32)


@needs_triton
@pytest.mark.parametrize(("hq", "hkv", "d"), ATTN_CASES)
def test_gqa_decode_emulated_matches_reference(hq, hkv, d, record_property):
    t_max = 37  # odd; 16-position tiles -> 3 online-softmax steps, the last one partial
    q, k, v, lengths = attention_inputs(3, hq, hkv, d, t_max, [1, t_max, 20], seed=hq * d)
    tuning = tuning_for(87).__class__(**{**tuning_for(87).to_dict(), "attn_block_t": 16})
    scale = d ** -0.5
    out = gqa_decode_attention(q, k, v, lengths, scale, mode="emulated", tuning=tuning)
    ref = gqa_decode_attention(q, k, v, lengths, scale, mode="reference")
    assert out.shape == (3, hq, d)
    check_close(out, ref, record_property, f"gqa Hq={hq} Hkv={hkv} D={d} T={t_max} lengths=1,37,20")


@needs_triton
def test_gqa_decode_emulated_views_and_empty_rows(record_property):
    """A transposed q view and a cache view (as the decoder passes them), a length-0 row (zeros), one tile."""
    q_heads = torch.randn(6, 1, 32)  # (Hq, T=1, D) as the decoder holds it
    cache_k = torch.randn(2, 2, 50, 32)[:, :, :41]  # (B, Hkv, T_max=41, D) view of a larger buffer
    cache_v = torch.randn(2, 2, 50, 32)[:, :, :41]
    q = q_heads.transpose(0, 1).expand(2, 6, 32)  # (B=2, Hq, D), non-contiguous
    lengths = torch.tensor([0, 41])
    out = gqa_decode_attention(q, cache_k, cache_v, lengths, 0.2, mode="emulated")
    ref = gqa_decode_attention_reference(q, cache_k, cache_v, lengths, 0.2)
    assert torch.count_nonzero(out[0]) == 0
    check_close(out, ref, record_property, "gqa views, lengths 0 and T_max")


@needs_triton
def test_emulated_runs_leave_triton_language_as_they_found_it():
    """Triton's interpreter patches ``triton.language`` for each device-function call and keeps it; a later
    AOT or GPU compile in the same process then sees interpreter builtins. Every attribute that existed before
    an emulated matmul and decode attention is the same object after them."""
    import triton.language as tl

    spaces = {"tl": tl, "tl.core": tl.core, "tl.standard": tl.standard, "tl.math": tl.math,
              "tl.tensor": tl.tensor}
    before = {label: dict(vars(space)) for label, space in spaces.items()}
    w, *_ = random_weight(64, 64, 0.5)
    block_sparse_matmul(torch.randn(1, 64), w, mode="emulated")
    gqa_decode_attention(*attention_inputs(1, 4, 2, 16, 9, [9]), 0.25, mode="emulated")
    changed = {label: sorted(name for name, value in before[label].items() if vars(space).get(name) is not value)
               for label, space in spaces.items()}
    assert not any(changed.values()), changed
    assert set(vars(tl.tensor)) == set(before["tl.tensor"])


def test_reference_attention_equals_repeat_kv_softmax():
    q, k, v, lengths = attention_inputs(2, 6, 2, 16, 9, [9, 4])
    out = gqa_decode_attention_reference(q, k, v, lengths, 0.25)
    kk, vv = k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1)  # (B, Hq, T, D)
    for b, length in enumerate(lengths.tolist()):
        probs = torch.softmax(torch.einsum("hd,htd->ht", q[b], kk[b, :, :length]) * 0.25, dim=-1)
        assert torch.allclose(out[b], torch.einsum("ht,htd->hd", probs, vv[b, :, :length]), atol=1e-5)



ATTN_MODES = ["reference", pytest.param("emulated", marks=needs_triton)]


@pytest.mark.parametrize("mode", ATTN_MODES)
@pytest.mark.parametrize(("lengths", "message"), [
    ([12], r"lengths must lie in \[0, T_max=8\].*\[12\]"),  # past the cache: the kernel read out of bounds
    ([-1], r"lengths must lie in \[0, T_max=8\]"),
    ([3, 4], "lengths must have B=1 entries, got 2"),
])
def test_decode_attention_refuses_lengths_outside_the_cache(mode, lengths, message):
    """The twin clamped a length past T_max to the cache and the kernel read past it; both refuse it now."""
    q, k, v, _ = attention_inputs(1, 4, 2, 16, 8, [8])
    with pytest.raises(ValueError, match=message):
        gqa_decode_attention(q, k, v, torch.tensor(lengths), 0.25, mode=mode, tuning=tuning_for(87))


@pytest.mark.parametrize("mode", ATTN_MODES)
def test_decode_attention_ignores_stale_nan_and_inf_past_the_length(mode, record_property):
    """Cache rows past a row's length are never part of its output, whatever they hold (0 * inf was NaN)."""
    q, k, v, lengths = attention_inputs(1, 4, 2, 16, 8, [4])
    clean = gqa_decode_attention_reference(q, k, v, lengths, 0.25)
    k[:, :, 6:], v[:, :, 6:] = float("nan"), float("inf")  # stale garbage after the length
    out = gqa_decode_attention(q, k, v, lengths, 0.25, mode=mode, tuning=tuning_for(87))
    assert torch.isfinite(out).all()
    check_close(out, clean, record_property, f"gqa {mode} with NaN/inf past the length")

# ---------------------------------------------------------------------------------------------- switch
def test_kernel_mode_from_environment(monkeypatch):
    monkeypatch.setenv("EDGESDK_KERNELS", "Emulated")
    assert kernel_mode() == "emulated"
    monkeypatch.setenv("EDGESDK_KERNELS", "cuda")
    with pytest.raises(ValueError, match="EDGESDK_KERNELS") as info:
        kernel_mode()
    assert "'cuda'" in str(info.value)
    assert all(m in str(info.value) for m in ("triton", "reference", "emulated"))
    monkeypatch.delenv("EDGESDK_KERNELS")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert kernel_mode() == "reference"


def test_bad_mode_argument_is_refused():
    w, *_ = random_weight(32, 32, 1.0)
    with pytest.raises(ValueError, match="allowed: triton, reference, emulated"):
        block_sparse_matmul(torch.randn(1, 32), w, mode="fast")


def test_triton_mode_without_cuda_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    w, *_ = random_weight(32, 32, 1.0)
    with pytest.raises(RuntimeError, match="CUDA"):
        block_sparse_matmul(torch.randn(1, 32), w, mode="triton")


# ---------------------------------------------------------------------------------------------- tuning
def test_tuning_defaults_and_overrides():
    orin = tuning_for(87)
    assert (orin.sm_count, orin.shared_memory_kb) == SM_DEFAULTS[87] == (8, 164)
    assert orin.num_stages == 3
    assert orin.attn_block_t == 64
    xavier = tuning_for(72)
    assert (xavier.sm_count, xavier.shared_memory_kb) == (6, 96)
    assert xavier.num_stages == 1
    agx = tuning_for(87, sm_count=16, shared_memory_kb=164)
    assert agx.sm_count == 16
    assert tuning_for(99, sm_count=4, shared_memory_kb=100).num_stages == 2
    with pytest.raises(ValueError, match="sm_99"):
        tuning_for(99)


# ---------------------------------------------------------------------------------------------- lean install
BLOCK_IMPORTS = textwrap.dedent(
    """
    import sys

    class Block:
        def __init__(self, names):
            self.names = names

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in self.names:
                raise ImportError(f"No module named {name!r} (blocked)")
            return None

    sys.meta_path.insert(0, Block(set(sys.argv[1].split(","))))
    """
)


def run_blocked(blocked: str, body: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK_IMPORTS + textwrap.dedent(body), blocked],
                          capture_output=True, text=True, timeout=120)


def test_reference_mode_works_without_triton():
    proc = run_blocked("triton,cuda", """
        import os
        os.environ.pop("EDGESDK_KERNELS", None)
        import torch
        import edgesdk.kernels as K
        from edgesdk.kernels import ops
        w = K.BlockSparseWeight.from_dense(torch.ones(40, 40, dtype=torch.int8), torch.ones(40))
        y = K.block_sparse_matmul(torch.ones(1, 40), w)
        assert ops.kernel_mode() == "reference" and float(y[0, 0]) == 40.0
        try:
            K.block_sparse_matmul(torch.ones(1, 40), w, mode="emulated")
        except RuntimeError as exc:
            assert "triton" in str(exc), exc
        else:
            raise AssertionError("emulated ran without triton")
        assert "triton" not in sys.modules
        print("ok")
    """)
    assert proc.returncode == 0, proc.stderr
    assert "ok" in proc.stdout


def test_loader_without_driver_names_what_is_missing(tmp_path):
    """No cuda-python and no CUDA torch (here: neither importable): a clear error, not an ImportError."""
    (tmp_path / "index.json").write_text('{"sm": 87, "kernels": []}')
    proc = run_blocked("triton,cuda,torch", f"""
        import edgesdk.kernels.tuning, edgesdk.kernels.aot
        from edgesdk.kernels.loader import KernelLoadError, load_compiled
        try:
            load_compiled({str(tmp_path)!r})
        except KernelLoadError as exc:
            print(exc)
        assert "torch" not in sys.modules
    """)
    assert proc.returncode == 0, proc.stderr
    assert "cuda-python" in proc.stdout
    assert "PyTorch" in proc.stdout


def test_tuning_overrides_from_the_environment_text():
    from edgesdk.kernels.ops import tuning_overrides

    tuned = tuning_overrides(tuning_for(87), "gemv_unroll=2, gemv_programs_per_sm=32")
    assert (tuned.gemv_unroll, tuned.gemv_programs_per_sm, tuned.sm_count) == (2, 32, 8)
    assert tuning_overrides(tuning_for(87), "") == tuning_for(87)
    with pytest.raises(ValueError, match="EDGESDK_KERNEL_TUNING.*gemv_unrol"):
        tuning_overrides(tuning_for(87), "gemv_unrol=2")
    with pytest.raises(ValueError, match="NAME=INTEGER"):
        tuning_overrides(tuning_for(87), "gemv_unroll=two")


@pytest.mark.parametrize(("text", "message"), [
    ("gemv_unroll=3", "gemv_unroll=3 must be a power of two.*e.g. 2 or 4"),
    ("attn_block_t=48", "attn_block_t=48 must be a power of two"),
    ("gemv_num_warps=0", "gemv_num_warps=0 must be a positive integer"),
    ("gemv_programs_per_sm=-1", "gemv_programs_per_sm=-1 must be a positive integer"),
    ("gemm_block_m=8", "gemm_block_m=8 must be at least 16"),
])
def test_tuning_overrides_refuse_values_the_kernels_cannot_run(text, message):
    """Non-powers of two and zero warps were accepted and failed inside the kernel launch, or silently ran."""
    from edgesdk.kernels.ops import tuning_overrides

    with pytest.raises(ValueError, match=f"EDGESDK_KERNEL_TUNING: {message}"):
        tuning_overrides(tuning_for(87), text)
