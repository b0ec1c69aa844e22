"""Review of the board-side loader: what it takes from a kernel directory's metadata is checked against what it
launches, without a GPU (a recording driver; kernel directories written as aot.compile_for_target lays them out)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from edgesdk.kernels.loader import KernelLoadError, load_compiled  # noqa: E402
from tests.unit.test_kernel_loader import (  # noqa: E402
    RecordingDriver,
    fake_cubin,
    write_kernel_dir,
)

GEMV = "bsr_gemv_plain_32x32_fp16"
ATTN = "gqa_decode_d64_g4_fp16"


@pytest.fixture
def driver(monkeypatch):
    from edgesdk.kernels import loader

    recording = RecordingDriver(87)
    monkeypatch.setattr(loader, "select_driver", lambda backend=None, device=0: recording)
    return recording


def _edit(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _swap_params(meta):
    meta["params"][6], meta["params"][7] = meta["params"][7], meta["params"][6]  # M and N


def _outside_file(d, meta):
    (d.parent / "elsewhere.cubin").write_bytes((d / meta["files"]["cubin"]).read_bytes())
    meta["files"]["cubin"] = "../elsewhere.cubin"


METADATA_DAMAGE = {
    # the launch packs M, N, K... in the order its call site passes them; metadata in another order was trusted
    "parameters in another order": (GEMV, _swap_params, r"parameters .*but this loader passes"),
    "a pointer parameter as a scalar": (GEMV, lambda m: m["params"].__setitem__(1, ["values_ptr", "i32"]),
                                        r"parameters .*but this loader passes"),
    "a parameter more": (ATTN, lambda m: m["params"].append(["extra", "i32"]), r"parameters .*but this loader"),
    "grid with x and y swapped": (GEMV, lambda m: m["grid"].__setitem__("dims", [["cdiv", "M", "BLOCK_M"],
                                                                                 ["cdiv", "N", "BLOCK_N"], "SPLIT"]),
                                  r"grid dims .*is launched on"),
    "grid naming an unknown size": (ATTN, lambda m: m["grid"].__setitem__("dims", ["B", "H", 1]),
                                    r"grid dims .*is launched on"),
    "block other than 32 * num_warps": (ATTN, lambda m: m.update(threads_per_block=m["threads_per_block"] * 2),
                                        r"threads_per_block \d+ is not 32 \* num_warps"),
    "unknown kernel": (ATTN, lambda m: m.update(kernel="flash_decode"), r"kernel 'flash_decode' is none this"),
    "unknown activation dtype": (ATTN, lambda m: m.update(act_dtype="fp8"), r"act_dtype 'fp8' is not one of"),
    "missing constexpr": (ATTN, lambda m: m["constexprs"].pop("BLOCK_G"), r"constexprs .* lack BLOCK_G"),
    "other scratch parameters": (GEMV, lambda m: m.update(trailing_params=[["global_scratch", "*i8"]]),
                                 r"trailing parameters .*appends"),
    "another kernel's symbol": (GEMV, lambda m: m.update(kernel_name="_other_kernel"),
                                r"has no kernel named '_other_kernel'"),
    "image path out of the directory": (GEMV, None, r"names cubin '../elsewhere.cubin', which is not a file inside"),
    "absolute image path": (GEMV, lambda m: m["files"].__setitem__("cubin", "/etc/hostname"),
                            r"names cubin '/etc/hostname', which is not a file inside"),
}


@pytest.mark.parametrize("damage", sorted(METADATA_DAMAGE))
def test_load_compiled_refuses_metadata_it_would_launch_wrongly(damage, tmp_path, driver):
    """Metadata was trusted: parameters were packed in its order and types, the grid rule and block size taken as
    written, image paths followed out of the directory, a kernel symbol looked up only by the driver (a cryptic
    CUDA_ERROR_NOT_FOUND on the board). Now KernelLoadError names the file, the field, its value and the fix."""
    kernel_dir = write_kernel_dir(tmp_path)
    assert load_compiled(kernel_dir)  # intact
    variant, change, message = METADATA_DAMAGE[damage]
    meta_path = kernel_dir / f"{variant}.json"
    _edit(meta_path, change or (lambda m: _outside_file(kernel_dir, m)))
    driver.loaded.clear()
    with pytest.raises(KernelLoadError, match=message) as caught:
        load_compiled(kernel_dir)
    assert str(meta_path) in str(caught.value) or variant in str(caught.value)
    assert "rebuild" in str(caught.value)
    assert not any(name == "_other_kernel" for _, name in driver.loaded)


def test_index_pointing_out_of_the_directory_is_refused(tmp_path, driver):
    kernel_dir = write_kernel_dir(tmp_path)
    (tmp_path / "stray.json").write_text((kernel_dir / f"{GEMV}.json").read_text())
    _edit(kernel_dir / "index.json", lambda index: index["kernels"][0].update(meta_path="../stray.json"))
    with pytest.raises(KernelLoadError, match=r"names kernel metadata '../stray.json', which is not a file inside"):
        load_compiled(kernel_dir)


def test_index_entry_and_metadata_must_name_the_same_variant(tmp_path, driver):
    kernel_dir = write_kernel_dir(tmp_path)
    _edit(kernel_dir / "index.json", lambda index: index["kernels"][0].update(name="bsr_gemv_plain_64x64_fp16"))
    with pytest.raises(KernelLoadError, match=r"lists it as 'bsr_gemv_plain_64x64_fp16'"):
        load_compiled(kernel_dir)


@pytest.mark.parametrize("entry", [["not", "a", "dict"], {"ok": False}])
def test_malformed_index_entries_are_a_kernel_load_error(entry, tmp_path, driver):
    """An index entry that is not an object, or a refused entry without a name, raised AttributeError/KeyError."""
    kernel_dir = write_kernel_dir(tmp_path)
    _edit(kernel_dir / "index.json", lambda index: index["kernels"].append(entry))
    with pytest.raises(KernelLoadError, match="without a name"):
        load_compiled(kernel_dir)


def test_driver_refusal_names_the_image_and_kernel(tmp_path, driver):
    def refuse(image, kernel_name, shared):
        raise KernelLoadError("cuModuleLoadData failed: CUDA_ERROR_NO_BINARY_FOR_GPU")

    kernel_dir = write_kernel_dir(tmp_path)
    driver.load = refuse
    with pytest.raises(KernelLoadError, match=r"cubin .*\.cubin \(kernel \w+, 0 bytes of shared memory\) did not "
                                              r"load on this sm_87 GPU: cuModuleLoadData failed"):
        load_compiled(kernel_dir)



# ---------------------------------------------------------------------------------------------- cubins of another SM
def _recompile_as(kernel_dir, variant, image):
    import hashlib

    (kernel_dir / f"{variant}.cubin").write_bytes(image)
    _edit(kernel_dir / f"{variant}.json", lambda m: m.update(cubin_sha256=hashlib.sha256(image).hexdigest()))


@pytest.mark.parametrize(("image_sm", "abi"), [(72, 7), (80, 7), (72, 8)])
def test_a_cubin_for_another_sm_is_refused(image_sm, abi, tmp_path, driver):
    """The SM was taken from the metadata: an sm_72 (or sm_80) cubin under sm_87 metadata, with a matching
    SHA-256, went to the driver (an sm_80 one even runs there, as code not built for the board)."""
    kernel_dir = write_kernel_dir(tmp_path)
    _recompile_as(kernel_dir, GEMV, fake_cubin("bsr_gemv_plain_32x32_fp16", image_sm, abi))
    with pytest.raises(KernelLoadError, match=rf"{GEMV}.cubin holds sm_{image_sm} code, but .* say sm_87"):
        load_compiled(kernel_dir)


def test_the_cubin_header_is_read_in_both_abi_versions(tmp_path, driver):
    kernel_dir = write_kernel_dir(tmp_path)
    _recompile_as(kernel_dir, GEMV, fake_cubin("bsr_gemv_plain_32x32_fp16", 87, abi=8))
    assert GEMV in load_compiled(kernel_dir)


def test_a_cubin_that_is_no_cuda_elf_is_refused(tmp_path, driver):
    kernel_dir = write_kernel_dir(tmp_path)
    _recompile_as(kernel_dir, GEMV, b"<html>404</html>\0bsr_gemv_plain_32x32_fp16\0" + bytes(64))
    with pytest.raises(KernelLoadError, match=rf"{GEMV}.cubin of kernel {GEMV} is not a CUDA cubin"):
        load_compiled(kernel_dir)


def test_a_directory_named_for_another_sm_is_refused(tmp_path, driver):
    kernel_dir = write_kernel_dir(tmp_path)
    moved = kernel_dir.rename(tmp_path / "sm_72")
    with pytest.raises(KernelLoadError, match="lists sm_87 kernels, but the directory is sm_72"):
        load_compiled(moved)


# ---------------------------------------------------------------------------------------------- launch arguments
def test_empty_problems_launch_nothing_and_return_empty_results():
    """M = 0 rows (or B = 0 sequences) gave a zero grid dimension, which cuLaunchKernel refuses
    (CUDA_ERROR_INVALID_VALUE); Triton's own launcher skips such a launch, and so does the loader now."""
    from edgesdk.kernels.block_sparse import BlockSparseWeight
    from tests.unit.test_kernel_loader import fake_kernels

    kernels, driver = fake_kernels()
    w = BlockSparseWeight.from_dense(torch.ones(64, 64, dtype=torch.int8), torch.ones(64))
    for rows in (0, 16):  # the GEMV and the GEMM
        out = kernels.block_sparse_matmul(torch.randn(rows, 64)[:0], w)
        assert tuple(out.shape) == (0, 64)
    out = kernels.gqa_decode_attention(torch.randn(0, 4, 64), torch.zeros(0, 2, 8, 64), torch.zeros(0, 2, 8, 64),
                                       torch.zeros(0, dtype=torch.int32), 0.125)
    assert tuple(out.shape) == (0, 4, 64)
    assert not driver.launches


@pytest.mark.parametrize(("position", "value", "shown"), [
    (6, 2**31, "2147483648"),  # M past int32: ctypes wrapped it to -2147483648
    (9, -(2**31) - 1, "-2147483649"),
])
def test_scalar_arguments_outside_their_compiled_type_are_refused(position, value, shown):
    from tests.unit.test_kernel_loader import fake_kernels

    kernels, driver = fake_kernels()
    gemv = kernels["bsr_gemv_plain_32x32_fp16"]
    name = gemv.meta["params"][position][0]
    args = [torch.zeros(16, dtype=dtype) for dtype in (torch.float16, torch.int8, torch.int32, torch.int32,
                                                       torch.float32, torch.float32)] + [1, 64, 64, 64, 1, 64, 1]
    gemv.launch((2, 1, 1), *args)  # as compiled: launched
    args[position] = value
    with pytest.raises(ValueError, match=rf"{name} is i32 \(compiled so\), got {shown}"):
        gemv.launch((2, 1, 1), *args)
    assert len(driver.launches) == 1


def test_a_grid_past_cuda_limits_is_refused():
    from tests.unit.test_kernel_loader import fake_kernels

    kernels, driver = fake_kernels()
    attn = kernels["gqa_decode_d64_g4_fp16"]
    args = [torch.zeros(16, dtype=torch.float16)] * 3 + [torch.zeros(4, dtype=torch.int32),
                                                          torch.zeros(16, dtype=torch.float16), 0.1, 1, 64] + [1] * 14
    with pytest.raises(ValueError, match=r"grid \(1, 70000, 1\) is outside CUDA's limits"):
        attn.launch((1, 70000, 1), *args)
    assert not driver.launches


# ---------------------------------------------------------------------------------------------- missing directory
@pytest.mark.parametrize("missing", ["directory", "index"])
def test_a_missing_kernel_directory_or_index_names_it_and_the_fix(missing, tmp_path, driver):
    kernel_dir = write_kernel_dir(tmp_path)
    if missing == "directory":
        import shutil

        shutil.rmtree(kernel_dir)
    else:
        (kernel_dir / "index.json").unlink()
    with pytest.raises(KernelLoadError, match=rf"kernel {missing} .*sm_87.* not found: .*index.json; copy the whole "
                                              r"bundle again \(edgesdk deploy\) or rebuild it"):
        load_compiled(kernel_dir)


def test_a_gpu_older_than_the_kernels_is_told_to_build_for_its_target(tmp_path, driver):
    kernel_dir = write_kernel_dir(tmp_path)
    driver._capability = 72
    with pytest.raises(KernelLoadError, match=r"for sm_87; this GPU is sm_72, older, .*edgesdk build --target"):
        load_compiled(kernel_dir)
