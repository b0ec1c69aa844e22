"""The board-side loader (edgesdk.kernels.loader) without a GPU: launch metadata built from the variant table (no
compile), a recording driver that decodes the kernel-parameter array, and kernel directories written by hand."""

from __future__ import annotations

import ctypes

import pytest

torch = pytest.importorskip("torch")

from edgesdk.kernels.aot import default_variants  # noqa: E402
from edgesdk.kernels.block_sparse import BlockSparseWeight  # noqa: E402
from edgesdk.kernels.loader import CompiledKernels, LoadedKernel  # noqa: E402
from edgesdk.kernels.tuning import tuning_for  # noqa: E402


class RecordingDriver:
    """Stands in for the CUDA driver: keeps every launch with its parameters decoded by name."""

    name = "recording"

    def __init__(self, capability: int = 87):
        self.launches, self.loaded, self._capability, self.metas = [], [], capability, {}

    def capability(self) -> int:
        return self._capability

    def load(self, image, kernel_name, shared):
        self.loaded.append((bytes(image), kernel_name))
        return ("module", kernel_name, len(self.loaded))

    def alloc(self, nbytes):
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        return buffer.data_ptr(), buffer

    def launch(self, handle, grid, threads, shared, stream, params_address):
        meta = self.metas[handle]
        specs = meta["params"] + [["global_scratch", "*i8"], ["profile_scratch", "*i8"]]
        slots = (ctypes.c_void_p * len(specs)).from_address(params_address)
        types = {"i32": ctypes.c_int32, "fp32": ctypes.c_float}
        values = {name: (ctypes.c_void_p if ty.startswith("*") else types[ty]).from_address(slot).value
                  for slot, (name, ty) in zip(slots, specs, strict=True)}
        self.launches.append((meta["name"], grid, values))


def variant_meta(variant, sm: int = 87) -> dict:
    """What aot._metadata writes for ``variant``, less what only the compiler knows."""
    return {"name": variant.name, "kernel_name": variant.name, "kernel": variant.kernel, "sm": sm,
            "params": [list(p) for p in variant.params()], "constexprs": dict(variant.constexprs),
            "act_dtype": variant.act_dtype, "grid": variant.grid, "num_warps": variant.num_warps,
            "threads_per_block": 32 * variant.num_warps, "shared_memory_bytes": 0, "pointer_alignment": 16,
            "tuning": tuning_for(sm).to_dict()}


def fake_kernels(sm: int = 87, **variant_args) -> tuple[CompiledKernels, RecordingDriver]:
    driver = RecordingDriver(sm)
    loaded = {}
    for variant in default_variants(tuning_for(sm), **variant_args):
        meta = variant_meta(variant, sm)
        handle = ("module", variant.name)
        driver.metas[handle] = meta
        loaded[variant.name] = LoadedKernel(meta, driver, handle, "cubin")
    return CompiledKernels(sm, loaded, {}, driver.name), driver


# ---------------------------------------------------------------------------------------------- attention
@pytest.mark.parametrize(("q_shape", "cache_shape", "lengths", "message"), [
    ((1, 6, 64), (1, 4, 16, 64), [16], "Hq=6 must be a multiple of Hkv=4"),  # launched GROUP 1: heads 4, 5 unset
    ((1, 4, 64), (1, 0, 16, 64), [1], "Hq=4 must be a multiple of Hkv=0"),  # was a ZeroDivisionError
    ((1, 4, 64), (1, 2, 16, 64), [40], r"lengths must lie in \[0, T_max=16\]"),  # read past the cache
    ((1, 4, 64), (1, 2, 16, 64), [1, 1], "lengths must have B=1 entries"),
])
def test_compiled_attention_checks_heads_and_lengths_like_the_twin(q_shape, cache_shape, lengths, message):
    kernels, driver = fake_kernels()
    cache = torch.zeros(cache_shape)
    with pytest.raises(ValueError, match=message):
        kernels.gqa_decode_attention(torch.randn(q_shape), cache, cache, torch.tensor(lengths), 0.125)
    assert not driver.launches


# ---------------------------------------------------------------------------------------------- block-sparse
@pytest.mark.parametrize(("field", "dtype", "param"), [
    ("col_index", torch.int64, "col_ptr"), ("row_offsets", torch.int64, "rowoff_ptr"),
    ("scales", torch.float16, "scales_ptr"), ("values", torch.uint8, "values_ptr"),
])
def test_compiled_matmul_refuses_tensors_of_another_dtype_than_compiled(field, dtype, param):
    """The kernel reads a pointer's bytes as its compiled element type (``*i32``, ``*fp32``...): an int64 index
    or a float16 scale tensor was launched and read as garbage."""
    kernels, driver = fake_kernels()
    w = BlockSparseWeight.from_dense(torch.ones(64, 64, dtype=torch.int8), torch.ones(64))
    object.__setattr__(w, field, getattr(w, field).to(dtype))  # past __post_init__, which refuses it too
    with pytest.raises(TypeError, match=f"{param} is \\*\\w+ \\(compiled so\\), got a {dtype} tensor"):
        kernels.block_sparse_matmul(torch.randn(1, 64), w)
    assert not driver.launches
