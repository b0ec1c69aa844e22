"""Kernel review 62: a weight built in the other intra-tile layout and a bad layout name say what to pass; one
per-tensor scale is every output channel's; the AOT variant table refuses an activation dtype the board's loader
does not launch, and gives a variant once however often its layout, head dim or group bound is given."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from edgesdk.kernels import ops  # noqa: E402
from edgesdk.kernels.aot import compile_for_target, default_variants  # noqa: E402
from edgesdk.kernels.block_sparse import BlockSparseWeight  # noqa: E402
from edgesdk.kernels.tuning import tuning_for  # noqa: E402


def _weight(layout: str, block=(16, 32), n=32, k=64) -> BlockSparseWeight:
    generator = torch.Generator().manual_seed(62)
    q = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=generator)
    return BlockSparseWeight.from_dense(q, torch.rand(n, generator=generator) + 0.1, block, layout=layout)


@pytest.mark.parametrize(("stored", "claimed"), [("transposed", "plain"), ("plain", "transposed")])
def test_tiles_of_the_other_layout_name_the_layout_that_holds_them(stored, claimed):
    """Tiles (nnz, block_k, block_n) passed as 'plain' were refused as 'must be (4, 16, 32), got (4, 32, 16)',
    which does not say that the layout argument is what is wrong."""
    weight = _weight(stored)
    with pytest.raises(ValueError, match=rf"values must be int8 of shape .*those are '{stored}' tiles.*"
                                         rf"pass layout='{stored}', or values\.transpose\(1, 2\)"):
        BlockSparseWeight(weight.values, weight.col_index, weight.row_offsets, weight.scales, weight.shape,
                          weight.block, layout=claimed)


def test_values_that_are_no_tiles_of_either_layout_are_told_how_they_are_made():
    weight = _weight("plain")
    with pytest.raises(ValueError, match=r"got torch\.int16 .*one int8 tile of \(block_n, block_k\) per stored "
                                         r"block.*from_dense"):
        BlockSparseWeight(weight.values.to(torch.int16), weight.col_index, weight.row_offsets, weight.scales,
                          weight.shape, weight.block)


@pytest.mark.parametrize("build", ["constructor", "from_dense"])
def test_a_layout_name_that_is_none_says_what_the_layouts_are(build):
    weight = _weight("plain")
    if build == "constructor":
        def make():
            return BlockSparseWeight(weight.values, weight.col_index, weight.row_offsets, weight.scales,
                                     weight.shape, weight.block, layout="Transposed")
    else:
        def make():
            return BlockSparseWeight.from_dense(weight.to_dense(), weight.scales, weight.block, layout="Transposed")
    with pytest.raises(ValueError, match=r"got 'Transposed': the order of each stored tile, 'plain' \(nnz, "
                                         r"block_n, block_k\).*'transposed' \(nnz, block_k, block_n\)"):
        make()


@pytest.mark.parametrize("scale", [0.5, torch.tensor(0.5), torch.tensor([0.5]), torch.tensor([[0.5]])])
@pytest.mark.parametrize("mode", ["reference", "emulated"])
def test_one_per_tensor_scale_is_every_output_channels(scale, mode):
    """A per-tensor int8 weight (one scale, as torch.quantize_per_tensor takes it) was refused by from_dense with
    'scales must have N=20 entries, got 1'; its one scale now dequantises every output channel, in the twin and
    the interpreted kernel alike, on shapes that are no multiple of the block."""
    if mode == "emulated":
        pytest.importorskip("triton")
    generator = torch.Generator().manual_seed(0)
    q = torch.randint(-128, 128, (20, 30), dtype=torch.int8, generator=generator)
    weight = BlockSparseWeight.from_dense(q, scale, (16, 16))
    assert weight.scales.shape == (20,)
    assert weight.scales.is_contiguous()
    assert torch.equal(weight.dequantized(), q.float() * 0.5)
    x = torch.randn(3, 30, generator=generator)
    torch.testing.assert_close(ops.block_sparse_matmul(x, weight, mode), x @ (q.float() * 0.5).T,
                               rtol=1e-5, atol=1e-3)


def test_a_scale_count_that_is_not_n_says_the_scales_are_per_output_channel():
    weight = _weight("plain")
    with pytest.raises(ValueError, match=r"scales must have N=32 entries, got 2: one dequantisation scale per "
                                         r"output channel.*no per-block scales"):
        BlockSparseWeight(weight.values, weight.col_index, weight.row_offsets, torch.ones(2), weight.shape,
                          weight.block)


@pytest.mark.parametrize(("act_dtype", "instead"), [
    ("float16", "pass 'fp16'"), ("torch.bfloat16", "pass 'bf16'"), (torch.float32, "pass 'fp32'"),
    ("fp8e4nv", r"pass one of \('fp16', 'bf16', 'fp32'\)"), ("fp64", r"pass one of"),
])
def test_default_variants_refuse_an_activation_dtype_the_loader_does_not_launch(act_dtype, instead):
    """'float16' compiled to a bare "KeyError: 'float16'" for every variant; 'fp8e4nv' and 'fp64' compiled, and the
    board's loader (act_dtype not one of fp16, fp32, bf16) then refused the whole bundle when it opened it."""
    with pytest.raises(ValueError, match=rf"act_dtype .* is not an activation dtype the board's loader launches: "
                                         rf"{instead}"):
        default_variants(tuning_for(87), act_dtype=act_dtype)


@pytest.mark.parametrize("act_dtype", ["fp16", "bf16", "fp32"])
def test_default_variants_take_the_activation_dtypes_the_loader_launches(act_dtype):
    variants = default_variants(tuning_for(87), act_dtype=act_dtype)
    assert variants
    assert all(v.act_dtype == act_dtype and v.name.endswith(act_dtype) for v in variants)


def test_compile_for_target_refuses_a_variant_of_another_dtype_without_writing_it(tmp_path):
    """A variant built by hand in fp8e4nv compiled (and was listed ok), for a loader that refuses it."""
    tuning = tuning_for(90)
    attention = next(v for v in default_variants(tuning, group_blocks=(1,)) if v.kernel == "gqa_decode")
    fp8 = dataclasses.replace(attention, name="gqa_decode_d64_g1_fp8e4nv", act_dtype="fp8e4nv")
    (result,) = compile_for_target(90, tmp_path, tuning, variants=[fp8])
    assert not result.ok
    assert "act_dtype 'fp8e4nv' is not an activation dtype the board's loader" in result.error
    assert sorted(p.name for p in (tmp_path / "sm_90").iterdir()) == ["index.json"]


def test_default_variants_give_a_repeated_layout_head_dim_or_group_bound_once():
    """layouts=('plain', 'plain'), head_dims=(64, 64.0) listed each variant twice: compiled twice, index.json
    listed it twice and the board's loader loaded its module twice, keeping one."""
    once = [v.name for v in default_variants(tuning_for(87), head_dims=(64,), group_blocks=(1, 4), layouts=("plain",))]
    twice = [v.name for v in default_variants(tuning_for(87), head_dims=(64, 64.0), group_blocks=(1, 4, 1.0, 4),
                                              layouts=("plain", "plain"))]
    assert twice == once
    assert len(set(once)) == len(once)


def test_compile_for_target_refuses_two_variants_of_one_name_before_compiling(tmp_path):
    tuning = tuning_for(87)
    attention = next(v for v in default_variants(tuning, group_blocks=(1,)) if v.kernel == "gqa_decode")
    wider = dataclasses.replace(attention, constexprs={**attention.constexprs, "BLOCK_T": 64})
    with pytest.raises(ValueError, match=r"variants lists 'gqa_decode_d64_g1_fp16' twice.*pass each variant once"):
        compile_for_target(87, tmp_path, tuning, variants=[attention, wider])
    assert not (tmp_path / "sm_87").exists()
