"""Kernel files review: an earlier compile's files left in kernels/sm_XX (and shipped), an index that lists a
variant twice, and tuning fields set without EDGESDK_KERNEL_TUNING's checks. No GPU: the real compiles run
Triton's compiler for sm_87 on the host, and a recording driver stands in for CUDA."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

torch = pytest.importorskip("torch")

from edgesdk.build.sparse_step import bundle_files  # noqa: E402
from edgesdk.errors import BuildError  # noqa: E402
from edgesdk.kernels.aot import compile_for_target, default_variants  # noqa: E402
from edgesdk.kernels.loader import KernelLoadError, load_compiled  # noqa: E402
from edgesdk.kernels.tuning import KernelTuning, parse_tuning_overrides, tuning_for  # noqa: E402
from tests.unit.test_kernel_loader import write_kernel_dir  # noqa: E402
from tests.unit.test_kernels_review_loader import driver  # noqa: E402, F401  (the recording driver fixture)

GEMV = "bsr_gemv_plain_32x32_fp16"
GEMM = "bsr_gemm_plain_32x32_fp16"



def _record(kernel_dir: str) -> dict:
    return {"weights": "sparse/weights.bin", "sparsity": "sparsity.json", "kernels": {"sm": 87, "dir": kernel_dir}}


# ---------------------------------------------------------------------------------------------- earlier compiles
def test_a_second_compile_into_the_folder_leaves_none_of_the_firsts_files(tmp_path):
    """compile_for_target wrote over an sm_87 folder and left the first compile's GEMM there: unlisted, never
    loaded, and shipped in the bundle by bundle_files."""
    pytest.importorskip("triton")
    variants = {v.name: v for v in default_variants(tuning_for(87))}
    first = compile_for_target(87, tmp_path, variants=[variants[GEMV], variants[GEMM]])
    assert all(result.ok for result in first)
    (second,) = compile_for_target(87, tmp_path, variants=[variants[GEMV]])
    assert second.ok
    kernel_dir = tmp_path / "sm_87"
    assert sorted(p.name for p in kernel_dir.iterdir()) == sorted(
        ["index.json", f"{GEMV}.cubin", f"{GEMV}.ptx", f"{GEMV}.json"])
    index = json.loads((kernel_dir / "index.json").read_text())
    assert [entry["name"] for entry in index["kernels"]] == [GEMV]


def test_a_variant_refused_on_the_second_compile_leaves_no_files(tmp_path):
    """A variant that compiled the first time and is refused the second (64 warps) is listed ok=False; its old
    cubin stayed beside it."""
    pytest.importorskip("triton")
    (gemv,) = [v for v in default_variants(tuning_for(87)) if v.name == GEMV]
    assert compile_for_target(87, tmp_path, variants=[gemv])[0].ok
    (refused,) = compile_for_target(87, tmp_path, variants=[dataclasses.replace(gemv, num_warps=64)])
    assert not refused.ok
    assert "runs 2048 threads a block" in refused.error
    assert sorted(p.name for p in (tmp_path / "sm_87").iterdir()) == ["index.json"]


def test_bundle_files_ship_what_the_index_lists_and_nothing_else(tmp_path):
    """Files in kernels/sm_87 that index.json does not list (an earlier compile's, a refused variant's) and
    another SM's folder were shipped; each shipped kernel file is the one its metadata's SHA-256 records."""
    kernel_dir = write_kernel_dir(tmp_path / "kernels")
    index = json.loads((kernel_dir / "index.json").read_text())
    listed = [entry["name"] for entry in index["kernels"]]
    (kernel_dir / "bsr_gemv_plain_64x64_fp16.cubin").write_bytes(b"stale")
    (kernel_dir / "bsr_gemv_plain_64x64_fp16.json").write_text("{}")
    index["kernels"][0].update(ok=False, error="refused")  # its files are left from before
    (kernel_dir / "index.json").write_text(json.dumps(index))
    write_kernel_dir(tmp_path / "kernels", sm=72)

    names = bundle_files(tmp_path, _record("kernels/sm_87"))
    assert names[:2] == ["sparse/weights.bin", "sparsity.json"]
    expected = {"kernels/sm_87/index.json"} | {f"kernels/sm_87/{name}.{suffix}" for name in listed[1:]
                                              for suffix in ("cubin", "ptx", "json")}
    assert set(names[2:]) == expected
    assert len(names) == len(set(names))
    for name in listed[1:]:
        meta = json.loads((kernel_dir / f"{name}.json").read_text())
        cubin = (tmp_path / "kernels/sm_87" / meta["files"]["cubin"]).read_bytes()
        assert f"kernels/sm_87/{meta['files']['cubin']}" in names
        assert hashlib.sha256(cubin).hexdigest() == meta["cubin_sha256"]


def test_bundle_files_without_compiled_kernels_ship_no_kernel_folder(tmp_path):
    write_kernel_dir(tmp_path / "kernels")
    record = {"weights": "sparse/weights.bin", "sparsity": "sparsity.json"}
    assert bundle_files(tmp_path, record) == ["sparse/weights.bin", "sparsity.json"]
    assert bundle_files(tmp_path, None) == []


def test_bundle_files_name_a_kernel_index_that_is_not_there(tmp_path):
    (tmp_path / "kernels" / "sm_87").mkdir(parents=True)
    with pytest.raises(BuildError, match=r"index .*sm_87.index.json is not readable as the compiler writes it"):
        bundle_files(tmp_path, _record("kernels/sm_87"))


# ---------------------------------------------------------------------------------------------- repeated names
def test_an_index_that_lists_a_variant_twice_is_refused_before_anything_loads(tmp_path, driver):  # noqa: F811
    """The loader kept one module per name: the second entry's load replaced the first's, whose module stayed
    loaded until exit."""
    kernel_dir = write_kernel_dir(tmp_path)
    assert len(load_compiled(kernel_dir)) == len(default_variants(tuning_for(87)))  # intact: every variant loads
    driver.loaded.clear()
    index = json.loads((kernel_dir / "index.json").read_text())
    index["kernels"].append(dict(index["kernels"][-1]))
    (kernel_dir / "index.json").write_text(json.dumps(index))
    name = index["kernels"][-1]["name"]
    with pytest.raises(KernelLoadError, match=rf"index .*index.json lists the kernel '{name}' twice: .*damaged; "
                                              r"rebuild the bundle"):
        load_compiled(kernel_dir)
    assert driver.loaded == []


def test_an_index_that_lists_a_refused_variant_twice_is_refused(tmp_path, driver):  # noqa: F811
    kernel_dir = write_kernel_dir(tmp_path)
    index = json.loads((kernel_dir / "index.json").read_text())
    index["kernels"] += [{"name": "attn_x", "ok": False, "error": "a"}, {"name": "attn_x", "ok": False, "error": "b"}]
    (kernel_dir / "index.json").write_text(json.dumps(index))
    with pytest.raises(KernelLoadError, match=r"lists the kernel 'attn_x' twice"):
        load_compiled(kernel_dir)
    assert driver.loaded == []


# ---------------------------------------------------------------------------------------------- tuning fields
@pytest.mark.parametrize(("field", "value"), [
    ("gemm_block_m", 8), ("gemv_unroll", 3), ("gemv_num_warps", 64), ("attn_block_t", 48), ("sm_count", 0),
    ("gemv_programs_per_sm", -1), ("num_stages", 0), ("shared_memory_kb", -4),
])
def test_a_tuning_field_set_without_the_environment_is_checked_as_the_environment_is(field, value):
    """dataclasses.replace(tuning, gemm_block_m=8) was taken and compiled into a kernel tl.dot refuses; only
    EDGESDK_KERNEL_TUNING was checked. The refusal is the environment's, in the same words."""
    with pytest.raises(ValueError, match="EDGESDK_KERNEL_TUNING: ") as told:
        parse_tuning_overrides(f"{field}={value}")
    words = str(told.value).removeprefix("EDGESDK_KERNEL_TUNING: ")
    with pytest.raises(ValueError, match="KernelTuning: ") as refused:
        dataclasses.replace(tuning_for(87), **{field: value})
    assert str(refused.value) == f"KernelTuning: {words}"


def test_a_tuning_built_directly_is_checked():
    with pytest.raises(ValueError, match=r"KernelTuning: gemv_unroll=3 must be a power of two .* e\.g\. 2 or 4"):
        KernelTuning(sm=87, sm_count=8, shared_memory_kb=164, gemv_unroll=3)
    with pytest.raises(ValueError, match=r"KernelTuning: gemm_block_m=8 must be at least 16"):
        KernelTuning(sm=87, sm_count=8, shared_memory_kb=164, gemm_block_m=8)
    with pytest.raises(ValueError, match=r"KernelTuning: gemv_unroll='4' must be an integer"):
        KernelTuning(sm=87, sm_count=8, shared_memory_kb=164, gemv_unroll="4")
    with pytest.raises(ValueError, match=r"KernelTuning: num_stages=True must be an integer"):
        KernelTuning(sm=87, sm_count=8, shared_memory_kb=164, num_stages=True)


def test_every_target_default_and_good_values_are_taken():
    for sm in (53, 72, 75, 80, 86, 87, 89, 90):
        tuning_for(sm)
    tuning = dataclasses.replace(tuning_for(87), gemm_block_m=32, gemv_unroll=8, gemv_num_warps=32,
                                 gemv_programs_per_sm=3, num_stages=4)
    assert (tuning.gemm_block_m, tuning.gemv_unroll, tuning.gemv_programs_per_sm) == (32, 8, 3)
