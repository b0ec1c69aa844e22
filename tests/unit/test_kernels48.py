"""Review 48 of the kernels: BSR arrays that are not flat, decode lengths that are not ``(B,)``, an integer
activation on the Triton kernel, and the PTX a newer GPU JITs checked against the hash recorded at compile time."""

from __future__ import annotations

import hashlib
import json

import pytest

torch = pytest.importorskip("torch")

from edgesdk.kernels.block_sparse import BlockSparseWeight  # noqa: E402
from edgesdk.kernels.loader import KernelLoadError, load_compiled  # noqa: E402
from edgesdk.kernels.reference import block_sparse_matmul_reference, gqa_decode_attention_reference  # noqa: E402
from edgesdk.kernels.tuning import tuning_for  # noqa: E402
from tests.unit.test_kernel_loader import RecordingDriver, fake_kernels  # noqa: E402
from tests.unit.test_kernels46 import _kernel_dir  # noqa: E402


def _weight(n: int = 8, k: int = 16, block: tuple[int, int] = (4, 4)) -> BlockSparseWeight:
    gen = torch.Generator().manual_seed(n * 100 + k)
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen)
    return BlockSparseWeight.from_dense(q, torch.rand(n, generator=gen) * 0.01 + 1e-3, block)


# ---------------------------------------------------------------------------------------------- BSR arrays
@pytest.mark.parametrize("name", ["scales", "col_index", "row_offsets"])
def test_a_bsr_array_that_is_not_flat_is_refused_by_name(name):
    """The kernels read col_index, row_offsets and scales as flat arrays and the twin by shape: an (N, 1) scale
    (as a per-channel scale often is kept) was accepted on load, and the twin then returned (1, N, N) for one
    row of x and dequantized() (N, N, K), while the kernel returned (1, N)."""
    state = _weight().state_dict("w")
    state[f"w.{name}"] = state[f"w.{name}"].reshape(-1, 1)
    with pytest.raises(ValueError, match=rf"{name} must be a 1-D tensor .*got shape \(\d+, 1\).*reshape\(-1\)"):
        BlockSparseWeight.from_state_dict(state, "w")


def test_flat_arrays_still_load_and_multiply():
    w = _weight()
    again = BlockSparseWeight.from_state_dict(w.state_dict("w"), "w")
    x = torch.randn(1, 16)
    assert tuple(block_sparse_matmul_reference(x, again).shape) == (1, 8)
    torch.testing.assert_close(block_sparse_matmul_reference(x, again), x @ w.dequantized().T)


# ---------------------------------------------------------------------------------------------- decode lengths
def _attention_inputs(b: int):
    gen = torch.Generator().manual_seed(b)
    q = torch.randn(b, 4, 8, generator=gen)
    cache = torch.randn(b, 2, 6, 8, generator=gen)
    return q, cache, cache.clone()


def _run(mode: str, q, k, v, lengths):
    if mode == "reference":
        return gqa_decode_attention_reference(q, k, v, lengths, 0.3)
    if mode == "emulated":
        pytest.importorskip("triton")
        from edgesdk.kernels.triton_kernels import gqa_decode_attention_triton

        return gqa_decode_attention_triton(q, k, v, lengths, 0.3, emulated=True)
    kernels, driver = fake_kernels()
    try:
        return kernels.gqa_decode_attention(q, k, v, lengths, 0.3)
    finally:
        assert not driver.launches


@pytest.mark.parametrize("mode", ["reference", "emulated", "compiled"])
@pytest.mark.parametrize(("b", "lengths"), [(2, [[5], [3]]), (1, 4), (1, [[4]])])
def test_lengths_that_are_not_one_per_row_are_refused_alike(mode, b, lengths):
    """lengths is (B,) (flash-attn's cache_seqlens). A (B, 1) or 0-d tensor ran on the kernels, which read it
    flat, while the twin failed inside its broadcasting (an einsum or index error): the same call gave an answer
    in one mode and a traceback in another. Now every mode refuses it by name with the fix."""
    q, k, v = _attention_inputs(b)
    with pytest.raises(ValueError, match=r"lengths must be a 1-D tensor \(B=\d,\).*got shape .*reshape\(-1\)"):
        _run(mode, q, k, v, torch.tensor(lengths))


@pytest.mark.parametrize("mode", ["reference", "emulated"])
def test_flat_lengths_still_agree_between_twin_and_kernel(mode):
    q, k, v = _attention_inputs(2)
    out = _run(mode, q, k, v, torch.tensor([5, 3]))
    torch.testing.assert_close(out, gqa_decode_attention_reference(q, k, v, torch.tensor([5, 3]), 0.3))


# ---------------------------------------------------------------------------------------------- integer activations
@pytest.mark.parametrize("rows", [1, 3, 16])  # GEMV (unrolled), small-M broadcast, GEMM (tl.dot)
def test_an_integer_activation_gives_the_twins_float32_result(rows):
    """The Triton launcher stored an integer x's product into an integer output (x's dtype): every scaled sum
    was truncated (0.3 * 7 -> 2), where the twin computes x.float() and returns float32."""
    pytest.importorskip("triton")
    from edgesdk.kernels.triton_kernels import block_sparse_matmul_triton

    w = _weight(32, 48, (16, 16))
    x = torch.randint(-5, 6, (rows, 48), generator=torch.Generator().manual_seed(rows))
    out = block_sparse_matmul_triton(x, w, emulated=True, tuning=tuning_for(87))
    ref = block_sparse_matmul_reference(x, w)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------- PTX integrity
@pytest.fixture
def driver_of(monkeypatch):
    from edgesdk.kernels import loader

    def make(capability: int) -> RecordingDriver:
        recording = RecordingDriver(capability)
        monkeypatch.setattr(loader, "select_driver", lambda backend=None, device=0: recording)
        return recording

    return make


def test_a_changed_ptx_is_refused_like_a_changed_cubin(tmp_path, driver_of):
    """Only the cubin's SHA-256 was checked. On a GPU newer than the bundle's SM the loader hands the driver the
    PTX instead, unchecked: a damaged or swapped PTX was JIT-compiled as it was. With ptx_sha256 recorded, it is
    refused naming the file and the fix."""
    kernel_dir = _kernel_dir(tmp_path, 87, "sm_87")  # PTX as Triton writes it: target, entry, parameters
    for meta_path in kernel_dir.glob("*.json"):
        if meta_path.name == "index.json":
            continue
        meta = json.loads(meta_path.read_text())
        meta["ptx_sha256"] = hashlib.sha256((kernel_dir / meta["files"]["ptx"]).read_bytes()).hexdigest()
        meta_path.write_text(json.dumps(meta))
    driver_of(90)
    assert {k.source for k in load_compiled(kernel_dir).values()} == {"ptx"}  # intact: loads
    ptx = kernel_dir / "bsr_gemm_plain_32x32_fp16.ptx"
    ptx.write_bytes(ptx.read_bytes()[:-3])  # truncated
    with pytest.raises(KernelLoadError, match=r"ptx \S*bsr_gemm_plain_32x32_fp16\.ptx does not match the SHA-256 "
                                              r"recorded when it was compiled .*copy the bundle again or rebuild it"):
        load_compiled(kernel_dir)


def test_the_compiler_records_the_ptx_hash_and_a_swapped_ptx_is_refused(tmp_path, driver_of):
    """Every bsr variant's entry is _bsr_matmul_kernel (Triton names it after the function), so the plain and the
    transposed GEMM's PTX declare the same entry and parameters: swapped, both passed every check and the plain
    weights were read as transposed on a newer GPU. The real compiler's files are used here."""
    pytest.importorskip("triton")
    from edgesdk.kernels.aot import compile_for_target, default_variants

    tuning = tuning_for(87)
    variants = [v for v in default_variants(tuning, group_blocks=(1,)) if v.name.startswith("bsr_gemm_")]
    compiled = compile_for_target(87, tmp_path, tuning, variants=variants)
    assert [k.ok for k in compiled] == [True, True], [k.error for k in compiled]
    kernel_dir = tmp_path / "sm_87"
    for kernel in compiled:
        meta = json.loads(kernel.meta_path.read_text())
        assert meta["ptx_sha256"] == hashlib.sha256(kernel.ptx_path.read_bytes()).hexdigest()
    assert len({k.kernel_name for k in compiled}) == 1  # why only the hash can tell them apart
    driver_of(90)
    assert len(load_compiled(kernel_dir)) == 2
    plain, transposed = (kernel_dir / f"bsr_gemm_{layout}_32x32_fp16.ptx" for layout in ("plain", "transposed"))
    first, second = plain.read_bytes(), transposed.read_bytes()
    plain.write_bytes(second)
    transposed.write_bytes(first)
    with pytest.raises(KernelLoadError, match=r"ptx \S*_32x32_fp16\.ptx does not match the SHA-256 .*swapped"):
        load_compiled(kernel_dir)
