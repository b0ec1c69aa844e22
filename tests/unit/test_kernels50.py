"""Kernels review 50: the decode-attention twin keeps the NaN its kernel and PyTorch's SDPA return; a cubin
whose kernel takes another parameter count than the loader packs (another Triton's launcher ABI) is refused."""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
import torch

from edgesdk.kernels import ops
from edgesdk.kernels.loader import KernelLoadError, load_compiled
from edgesdk.kernels.tuning import tuning_for
from tests.unit.test_kernel_loader import RecordingDriver

triton = pytest.importorskip("triton", reason="the emulated kernel needs triton (pip install edgesdk[kernels])")

MODES = ("reference", "emulated")


def _attention_case(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, 8, generator=gen)  # B=2, Hq=4
    k = torch.randn(2, 2, 6, 8, generator=gen)  # Hkv=2, T_max=6
    v = torch.randn(2, 2, 6, 8, generator=gen)
    return q, k, v, torch.tensor([5, 3])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's 'invalid value' inside the interpreter
@pytest.mark.parametrize("mode", MODES)
def test_a_nan_in_a_cache_row_the_query_reads_gives_nan_not_zeros(mode):
    """A NaN key inside row 0's length: softmax over it is NaN for the two query heads of that kv head, as in
    ``torch.nn.functional.scaled_dot_product_attention``; the twin made it zeros (its nan_to_num for length-0 rows),
    so the twin and the kernel disagreed and a numerical blow-up looked like a plausible output."""
    q, k, v, lengths = _attention_case()
    k[0, 1, 2, 3] = float("nan")
    out = ops.gqa_decode_attention(q, k, v, lengths, 0.35, mode)
    assert torch.isnan(out[0, 2:]).all()  # query heads 2, 3 read kv head 1
    assert not torch.isnan(out[0, :2]).any()
    assert not torch.isnan(out[1]).any()
    expected = torch.nn.functional.scaled_dot_product_attention(
        q[0, :, None], k[0, :, :5].repeat_interleave(2, dim=0), v[0, :, :5].repeat_interleave(2, dim=0),
        scale=0.35)[:, 0]
    assert torch.isnan(expected[2:]).all()
    torch.testing.assert_close(out[0, :2], expected[:2], rtol=1e-4, atol=1e-5)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_nan_or_inf_query_gives_nan_in_its_head_only(mode, bad):
    q, k, v, lengths = _attention_case(1)
    q[1, 3, 0] = bad
    out = ops.gqa_decode_attention(q, k, v, lengths, 0.35, mode)
    assert torch.isnan(out[1, 3]).all()
    assert not torch.isnan(out[1, :3]).any()
    assert not torch.isnan(out[0]).any()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("window", [None, 2])
def test_a_row_of_length_zero_still_gives_zeros_and_the_modes_agree(mode, window):
    """What the nan_to_num was for: a row with nothing to read is zeros (the kernel's stored result), stale NaN past
    the length included, and the other row is untouched."""
    q, k, v, _ = _attention_case(2)
    k[0], v[0] = float("nan"), float("inf")
    lengths = torch.tensor([0, 4])
    out = ops.gqa_decode_attention(q, k, v, lengths, 0.35, mode, window=window)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    twin = ops.gqa_decode_attention(q, k, v, lengths, 0.35, "reference", window=window)
    torch.testing.assert_close(out, twin, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------- cubin launcher ABI
def _kparam_records(image: bytes, kernel_name: str) -> list[int]:
    """Offsets in ``image`` of the EIATTR_KPARAM_INFO (0x17) records of the ``.nv.info.<kernel_name>`` section,
    found with the ELF64 section table (``cuobjdump -elf`` shows them as KPARAM_INFO, one per parameter)."""
    table = struct.unpack_from("<Q", image, 0x28)[0]
    size, count, names = struct.unpack_from("<HHH", image, 0x3A)
    sections = [struct.unpack_from("<IIQQQQ", image, table + i * size) for i in range(count)]
    names_at = sections[names][4]
    for name, _type, _flags, _addr, offset, length in sections:
        start = names_at + name
        if image[start:image.index(b"\0", start)] == b".nv.info." + kernel_name.encode():
            records, at = [], offset
            while at + 4 <= offset + length:
                if image[at + 1] == 0x17:
                    records.append(at)
                at += 4 + (struct.unpack_from("<H", image, at + 2)[0] if image[at] == 0x04 else 0)
            return records
    raise AssertionError(f"no .nv.info.{kernel_name} section")


@pytest.fixture
def compiled_gemv(tmp_path, monkeypatch):
    """The real compiler's sm_87 GEMV variant, and a recording driver of an sm_87 GPU (the cubin is what it runs)."""
    from edgesdk.kernels import loader
    from edgesdk.kernels.aot import compile_for_target, default_variants

    tuning = tuning_for(87)
    variants = [v for v in default_variants(tuning, group_blocks=(1,)) if v.name == "bsr_gemv_plain_32x32_fp16"]
    compiled = compile_for_target(87, tmp_path, tuning, variants=variants)
    assert compiled[0].ok, compiled[0].error
    driver = RecordingDriver(87)
    monkeypatch.setattr(loader, "select_driver", lambda backend=None, device=0: driver)
    return compiled[0]


def test_a_cubin_compiled_with_the_launcher_abi_the_loader_packs_loads(compiled_gemv):
    image = compiled_gemv.cubin_path.read_bytes()
    meta = json.loads(compiled_gemv.meta_path.read_text())
    assert len(_kparam_records(image, compiled_gemv.kernel_name)) == len(meta["params"]) + 2  # then two scratch
    kernels = load_compiled(compiled_gemv.cubin_path.parent)
    assert kernels["bsr_gemv_plain_32x32_fp16"].source == "cubin"


def test_a_cubin_of_another_launcher_abi_is_refused_on_its_own_gpu(compiled_gemv):
    """On the board (GPU of the kernels' SM) the loader hands the driver the cubin, and only the PTX (what a newer
    GPU JITs) was checked for the parameter count: a cubin whose kernel takes one parameter fewer than the loader
    packs (the launcher ABI of another Triton, e.g. one scratch pointer) was launched, the driver reading a
    parameter list of another layout. Here one KPARAM_INFO record of a real cubin is retagged, as a kernel of 14
    parameters has 14, with the cubin's hash recorded as the build would have."""
    image = bytearray(compiled_gemv.cubin_path.read_bytes())
    image[_kparam_records(bytes(image), compiled_gemv.kernel_name)[0] + 1] = 0x18  # no longer a parameter record
    compiled_gemv.cubin_path.write_bytes(bytes(image))
    meta = json.loads(compiled_gemv.meta_path.read_text())
    meta["cubin_sha256"] = hashlib.sha256(bytes(image)).hexdigest()
    compiled_gemv.meta_path.write_text(json.dumps(meta))
    with pytest.raises(KernelLoadError, match=r"cubin \S*bsr_gemv_plain_32x32_fp16\.cubin of kernel "
                                              r"bsr_gemv_plain_32x32_fp16 declares 14 kernel parameters for "
                                              r"_bsr_matmul_kernel, but this loader passes 15 .*another launcher ABI "
                                              r".*rebuild the bundle with this edgesdk and triton==3\.9\.0"):
        load_compiled(compiled_gemv.cubin_path.parent)
