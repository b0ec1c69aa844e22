"""Kernel review 56: the AOT loader's pointer alignment against Triton's JIT (an offset view launches there), and
the AOT variant table's power-of-two tile lengths (a head dim of 80 compiled to a bare Triton error)."""

from __future__ import annotations

import ctypes

import pytest

torch = pytest.importorskip("torch")

from edgesdk.kernels.aot import default_variants  # noqa: E402
from edgesdk.kernels.block_sparse import BlockSparseWeight  # noqa: E402
from edgesdk.kernels.loader import CompiledKernels, LoadedKernel  # noqa: E402
from edgesdk.kernels.tuning import tuning_for  # noqa: E402

ALIGNMENT = 16  # what aot.POINTER_ALIGNMENT compiles every pointer parameter for


class PointerRecorder:
    """Stands in for the CUDA driver (host memory): records each launch's pointer parameters by name."""

    name = "recording"

    def __init__(self) -> None:
        self.launches: list[dict[str, int]] = []
        self.metas: dict = {}
        self.capture: tuple[str, int] | None = None  # (pointer parameter, bytes) to copy at launch time
        self.captured = b""

    def alloc(self, nbytes):
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        return buffer.data_ptr(), buffer

    def launch(self, handle, grid, threads, shared, stream, params_address):
        specs = self.metas[handle]["params"]
        slots = (ctypes.c_void_p * len(specs)).from_address(params_address)
        self.launches.append({name: ctypes.c_void_p.from_address(slot).value
                              for slot, (name, ty) in zip(slots, specs, strict=True) if ty.startswith("*")})
        if self.capture is not None:
            name, nbytes = self.capture
            self.captured = ctypes.string_at(self.launches[-1][name], nbytes)


def _kernels() -> tuple[CompiledKernels, PointerRecorder]:
    driver = PointerRecorder()
    loaded = {}
    for variant in default_variants(tuning_for(87)):
        meta = {"name": variant.name, "kernel_name": variant.name, "kernel": variant.kernel, "sm": 87,
                "params": [list(p) for p in variant.params()], "constexprs": dict(variant.constexprs),
                "act_dtype": variant.act_dtype, "grid": variant.grid, "num_warps": variant.num_warps,
                "threads_per_block": 32 * variant.num_warps, "shared_memory_bytes": 0,
                "pointer_alignment": ALIGNMENT, "tuning": tuning_for(87).to_dict()}
        driver.metas[variant.name] = meta
        loaded[variant.name] = LoadedKernel(meta, driver, variant.name, "cubin")
    return CompiledKernels(87, loaded, {}, driver.name), driver


def _offset_view(shape: tuple[int, ...], offset: int = 4) -> torch.Tensor:
    """A contiguous fp16 view ``offset`` elements into a fresh buffer: 8 bytes off a 16-byte boundary."""
    numel = 1
    for size in shape:
        numel *= size
    view = torch.randn(numel + offset, dtype=torch.float16)[offset:].reshape(shape)
    assert view.is_contiguous()
    assert view.data_ptr() % ALIGNMENT
    return view


def test_compiled_matmul_copies_an_offset_view_that_the_jit_launches():
    kernels, driver = _kernels()
    weight = BlockSparseWeight.from_dense(torch.randint(-9, 9, (64, 64), dtype=torch.int8), torch.rand(64), (32, 32))
    for rows in (1, 17):  # the GEMV and the GEMM variant
        x = _offset_view((rows, 64))
        driver.capture = ("x_ptr", 2 * x.numel())
        kernels.block_sparse_matmul(x, weight)  # refused the view before ("x_ptr must be 16-byte aligned")
        assert driver.launches[-1]["x_ptr"] % ALIGNMENT == 0
        passed = torch.frombuffer(bytearray(driver.captured), dtype=torch.float16)
        assert torch.equal(passed, x.reshape(-1))  # the copy holds x's values


def test_compiled_attention_copies_offset_views_of_q_and_the_cache():
    kernels, driver = _kernels()
    q = _offset_view((1, 8, 64))
    cache = _offset_view((1, 2, 16, 64))
    lengths = torch.tensor([0, 5], dtype=torch.int32)[1:]  # 4 bytes into its storage
    driver.capture = ("len_ptr", 4)
    kernels.gqa_decode_attention(q, cache, cache, lengths, 0.125)
    launched = driver.launches[-1]
    assert all(launched[name] % ALIGNMENT == 0 for name in ("q_ptr", "k_ptr", "v_ptr", "len_ptr", "out_ptr"))
    assert int.from_bytes(driver.captured, "little") == 5


def test_unaligned_pointer_message_names_a_fix_that_moves_the_pointer():
    kernels, _ = _kernels()
    variant = kernels["bsr_gemv_plain_32x32_fp16"]
    x = _offset_view((1, 64))
    assert x.contiguous().data_ptr() == x.data_ptr()  # .contiguous() keeps the offset
    weight = BlockSparseWeight.from_dense(torch.ones(64, 64, dtype=torch.int8), torch.ones(64), (32, 32))
    out = torch.zeros(1, 64)
    with pytest.raises(ValueError, match=r"x_ptr must be 16-byte aligned.*\.clone\(\)") as caught:
        variant.launch((2, 1, 1), x, weight.values, weight.col_index, weight.row_offsets, weight.scales, out,
                       1, 64, 64, 64, 1, 64, 1)
    assert "or .contiguous() tensor" not in str(caught.value)


@pytest.mark.parametrize(("argument", "value", "named", "instead"), [
    ("head_dims", (80,), r"head_dims entry \(BLOCK_D\) 80", "pass 128"),
    ("head_dims", (48,), r"head_dims entry \(BLOCK_D\) 48", "pass 64"),
    ("group_blocks", (3,), r"group_blocks entry \(BLOCK_G\) 3", "pass 4"),
])
def test_default_variants_refuse_tile_lengths_triton_cannot_arange(argument, value, named, instead):
    with pytest.raises(ValueError, match=named + r" is not a power of two.*" + instead):
        default_variants(tuning_for(87), **{argument: value})


def test_default_variants_refuse_a_block_that_is_not_a_power_of_two():
    import dataclasses

    tuning = dataclasses.replace(tuning_for(87), bsr_block=(24, 32))
    with pytest.raises(ValueError, match=r"bsr_block edge 24 is not a power of two.*pass 32"):
        default_variants(tuning)


def test_default_variants_still_take_powers_of_two():
    names = [v.name for v in default_variants(tuning_for(87), head_dims=(64, 128), group_blocks=(1, 2))]
    assert "gqa_decode_d128_g2_fp16" in names
    assert len(names) == 4 + 4
