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


# ---------------------------------------------------------------------------------------------- kernel directories
def fake_cubin(kernel_name: str, sm: int, abi: int = 7) -> bytes:
    """The parts of a cubin the loader reads: a 64-bit CUDA ELF header whose e_flags carry ``sm`` (ABI 7: low byte,
    as ptxas 12.x writes for sm_87; ABI 8: bits 8-15) and the kernel symbol in a string table."""
    import struct

    header = bytearray(64)
    header[:4], header[4], header[5], header[7], header[8] = b"\x7fELF", 2, 1, 0x33, abi
    struct.pack_into("<HH", header, 16, 2, 190)  # ET_EXEC, EM_CUDA
    struct.pack_into("<I", header, 48, (sm << 16) | (sm << 8 if abi >= 8 else 0x500 | sm))
    return bytes(header) + b"\0.text." + kernel_name.encode() + b"\0" + kernel_name.encode() + b"\0"


def write_kernel_dir(root, sm: int = 87, **variant_args):
    """A kernels/sm_XX directory as aot.compile_for_target lays it out, with made-up images."""
    import hashlib
    import json

    out = root / f"sm_{sm}"
    out.mkdir(parents=True)
    entries = []
    for variant in default_variants(tuning_for(sm), **variant_args):
        cubin = fake_cubin(variant.name, sm)
        (out / f"{variant.name}.cubin").write_bytes(cubin)
        (out / f"{variant.name}.ptx").write_text(f"// ptx of {variant.name}\n.visible .entry {variant.name}(\n)")
        meta = {**variant_meta(variant, sm), "files": {"cubin": f"{variant.name}.cubin", "ptx": f"{variant.name}.ptx"},
                "cubin_sha256": hashlib.sha256(cubin).hexdigest()}
        (out / f"{variant.name}.json").write_text(json.dumps(meta))
        entries.append({"name": variant.name, "sm": sm, "ok": True, "meta_path": f"{variant.name}.json"})
    (out / "index.json").write_text(json.dumps({"sm": sm, "kernels": entries}))
    return out


@pytest.fixture
def recording_driver(monkeypatch):
    from edgesdk.kernels import loader

    driver = RecordingDriver(87)
    monkeypatch.setattr(loader, "select_driver", lambda backend=None, device=0: driver)
    return driver


def _tamper_cubin(d):
    path = d / "bsr_gemv_plain_32x32_fp16.cubin"
    path.write_bytes(b"garbage" + path.read_bytes())


def _edit_json(path, change):
    import json

    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


DAMAGE = {
    "tampered cubin": (_tamper_cubin, r"bsr_gemv_plain_32x32_fp16.cubin does not match the SHA-256"),
    "missing metadata": (lambda d: (d / "gqa_decode_d64_g4_fp16.json").unlink(),
                         r"kernel metadata .*gqa_decode_d64_g4_fp16.json is missing"),
    "corrupt index": (lambda d: (d / "index.json").write_text("{not json"),
                      r"kernel index .*index.json is not readable JSON"),
    "index without kernels": (lambda d: (d / "index.json").write_text('{"sm": 87}'),
                              r"index.json lacks a valid 'sm' or 'kernels' entry"),
    "missing cubin": (lambda d: (d / "bsr_gemm_plain_32x32_fp16.cubin").unlink(),
                      r"cubin .*bsr_gemm_plain_32x32_fp16.cubin of kernel bsr_gemm_plain_32x32_fp16 is not readable"),
    "metadata for another sm": (lambda d: _edit_json(d / "bsr_gemv_plain_32x32_fp16.json",
                                                     lambda m: m.update(sm=72)),
                                r"bsr_gemv_plain_32x32_fp16.json is for sm_72, but .*index.json lists sm_87"),
    "metadata without files": (lambda d: _edit_json(d / "bsr_gemv_plain_32x32_fp16.json", lambda m: m.pop("files")),
                               r"bsr_gemv_plain_32x32_fp16.json lacks files"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_load_compiled_names_the_damaged_file(damage, tmp_path, recording_driver):
    """A damaged kernel directory raised FileNotFoundError / JSONDecodeError, which escaped the backend chain, or
    loaded a changed cubin or another SM's; now KernelLoadError names the file and the fix."""
    from edgesdk.kernels.loader import KernelLoadError, load_compiled

    kernel_dir = write_kernel_dir(tmp_path)
    assert len(load_compiled(kernel_dir)) == len(default_variants(tuning_for(87)))  # intact: every variant loads
    apply, message = DAMAGE[damage]
    apply(kernel_dir)
    with pytest.raises(KernelLoadError, match=message) as caught:
        load_compiled(kernel_dir)
    assert "bundle" in str(caught.value)  # the fix: copy it again or rebuild


def _sparse_record(block=32, layout="plain", head_dim=64, layers=((9, 3), (8, 8))):
    return {"block": block, "layout": layout, "head_dim": head_dim, "kernels": {"sm": 87, "dir": "kernels/sm_87"},
            "layers": [{"heads": h, "kv_heads": kv, "ffn": 64} for h, kv in layers]}


@pytest.mark.parametrize(("record", "compiled_as", "message"), [
    (_sparse_record(block=64), {}, "bsr_matmul GEMV .*for 64x64 plain blocks; bsr_matmul GEMM"),
    (_sparse_record(head_dim=128), {}, "gqa_decode for head_dim 128, 1 query heads per KV head"),
    (_sparse_record(layers=((12, 1),)), {}, "gqa_decode for head_dim 64, 12 query heads per KV head"),
    (_sparse_record(layout="transposed"), {"layouts": ("plain",)}, "for 32x32 transposed blocks"),
])
def test_aot_backend_refuses_kernels_that_do_not_fit_the_model_at_open(record, compiled_as, message, tmp_path,
                                                                      recording_driver):
    """Kernels compiled for defaults (32x32, head_dim 64, groups 1/4/8) loaded "successfully" for a model they do
    not fit, and the first token failed with KernelLoadError; the open now raises RuntimeBackendError."""
    from types import SimpleNamespace

    from edgesdk.errors import RuntimeBackendError
    from edgesdk.runtime.triton_backend import load_aot_kernels

    write_kernel_dir(tmp_path / "kernels", **compiled_as)
    bundle = SimpleNamespace(file=lambda name: tmp_path / name)
    assert load_aot_kernels(bundle, _sparse_record())  # what the defaults fit loads
    with pytest.raises(RuntimeBackendError, match=message):
        load_aot_kernels(bundle, record)


def test_aot_backend_with_every_variant_refused_says_why_at_open(tmp_path, recording_driver):
    from types import SimpleNamespace

    from edgesdk.errors import RuntimeBackendError
    from edgesdk.runtime.triton_backend import load_aot_kernels

    kernel_dir = write_kernel_dir(tmp_path / "kernels")
    _edit_json(kernel_dir / "index.json", lambda index: [entry.update(ok=False, error="ptxas refused sm_87")
                                                         for entry in index["kernels"]])
    with pytest.raises(RuntimeBackendError, match="lack what this model needs.*was refused: ptxas refused sm_87"):
        load_aot_kernels(SimpleNamespace(file=lambda name: tmp_path / name), _sparse_record())


def test_compiled_gemv_takes_the_launch_time_tuning_from_the_environment(monkeypatch):
    """EDGESDK_KERNEL_TUNING's gemv_programs_per_sm (read at launch, not compiled in) was ignored by the cubins."""
    kernels, driver = fake_kernels()
    w = BlockSparseWeight.from_dense(torch.ones(64, 2048, dtype=torch.int8), torch.ones(64))  # 2 rows x 64 blocks
    kernels.block_sparse_matmul(torch.randn(1, 2048), w)
    assert driver.launches[-1][1] == (2, 1, 8)  # 8 programs per SM on 8 SMs, capped by 2 steps of 4 per share
    monkeypatch.setenv("EDGESDK_KERNEL_TUNING", "gemv_programs_per_sm=1")
    kernels, driver = fake_kernels()
    kernels.block_sparse_matmul(torch.randn(1, 2048), w)
    assert driver.launches[-1][1] == (2, 1, 4)  # 1 program per SM: 8 programs over 2 block rows
