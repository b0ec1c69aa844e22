"""Opening the ``triton`` backend (edgesdk/runtime/triton_backend.py): every reason not to open is a
RuntimeBackendError raised at open, so the backend chain notes it and tries the next backend."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from edgesdk.errors import RuntimeBackendError  # noqa: E402
from edgesdk.kernels import ops  # noqa: E402
from edgesdk.runtime.triton_backend import open_triton_backend  # noqa: E402


@pytest.fixture
def bundle(tmp_path):
    """A bundle record whose files are never reached: each case fails before the weights are read."""
    record = {"weights": "sparse/weights.safetensors", "kernels": {"sm": 87, "dir": "kernels/sm_87"}}
    return SimpleNamespace(manifest={"sparse": record}, file=lambda name: tmp_path / name)


@pytest.fixture
def jetson(monkeypatch):
    """A CUDA board without the triton package (JetPack torch; the bundle's cubins are what runs there)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ops, "triton_available", lambda: False)
    monkeypatch.delenv("EDGESDK_KERNELS", raising=False)
    monkeypatch.delenv("EDGESDK_KERNEL_TUNING", raising=False)


@pytest.mark.parametrize("mode", ["triton", "emulated"])
def test_a_triton_mode_without_triton_is_refused_at_open(mode, bundle, jetson, monkeypatch):
    """EDGESDK_KERNELS=triton on such a board skipped the cubins and crashed at the first step."""
    monkeypatch.setenv("EDGESDK_KERNELS", mode)
    with pytest.raises(RuntimeBackendError, match=f"EDGESDK_KERNELS={mode} needs the triton package") as caught:
        open_triton_backend(bundle, threads=1)
    assert "unset it to run the bundle's compiled kernels" in caught.value.fix


def test_an_unknown_kernel_mode_is_a_backend_error(bundle, monkeypatch):
    """A ValueError from EDGESDK_KERNELS=cuda ended the whole backend chain instead of moving to the next one."""
    monkeypatch.setenv("EDGESDK_KERNELS", "cuda")
    with pytest.raises(RuntimeBackendError, match="EDGESDK_KERNELS='cuda' is not a kernel mode") as caught:
        open_triton_backend(bundle, threads=1)
    assert "EDGESDK_KERNELS" in caught.value.fix


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the hand-over to the CPU backends without CUDA")
def test_a_blank_kernel_mode_counts_as_unset(bundle, monkeypatch):
    """EDGESDK_KERNELS=" " is unset to kernel_mode(); the backend took it as asked for and opened the
    slow PyTorch twins on a CPU host instead of handing over to ort-cpu."""
    monkeypatch.setenv("EDGESDK_KERNELS", " ")
    with pytest.raises(RuntimeBackendError, match="no CUDA device"):
        open_triton_backend(bundle, threads=1)


def test_a_bad_kernel_tuning_is_a_backend_error_at_open(bundle, monkeypatch):
    monkeypatch.setenv("EDGESDK_KERNELS", "reference")
    monkeypatch.setenv("EDGESDK_KERNEL_TUNING", "attn_block_t=48")
    with pytest.raises(RuntimeBackendError, match="EDGESDK_KERNEL_TUNING: attn_block_t=48 must be a power of two"):
        open_triton_backend(bundle, threads=1)


def test_tuning_the_compiled_kernels_cannot_take_is_refused_at_open(bundle, jetson, monkeypatch):
    """The cubins have unroll, warps and tiles built in: setting them had no effect, silently."""
    monkeypatch.setenv("EDGESDK_KERNEL_TUNING", "gemv_unroll=2,gemv_programs_per_sm=32")
    with pytest.raises(RuntimeBackendError, match="sets gemv_unroll, which the bundle's compiled kernels have built"):
        open_triton_backend(bundle, threads=1)


# ---------------------------------------------------------------------------------------------- decoder
@pytest.fixture(scope="module")
def tiny_sparse(tmp_path_factory):
    """A tiny Llama on the per-row INT8 grid, exported block-sparse: (tensors, record)."""
    from tests._utils.tiny import export_tiny_sparse

    _, tensors, record = export_tiny_sparse(tmp_path_factory.mktemp("sparse"), max_context=64)
    return tensors, record


class TwinKernels:
    """Stands in for the loaded AOT kernels (CompiledKernels) with the PyTorch twins; records what attention got."""

    attention_dtype = torch.float16

    def __init__(self):
        self.caches = []

    def block_sparse_matmul(self, x, weight):
        from edgesdk.kernels.reference import block_sparse_matmul_reference

        return block_sparse_matmul_reference(x, weight)

    def gqa_decode_attention(self, q, k_cache, v_cache, lengths, scale):
        from edgesdk.kernels.reference import gqa_decode_attention_reference

        self.caches.append((k_cache.dtype, k_cache.data_ptr()))
        return gqa_decode_attention_reference(q.half(), k_cache, v_cache, lengths, scale).half()


def test_decoder_holds_the_cache_in_the_compiled_attention_dtype(tiny_sparse):
    """With compiled kernels every decode step converted each layer's whole float32 cache to float16 (about
    140 MB a token for SmolLM2 at max_context 2048); the cache is now held in float16 and passed as is, and the
    logits still match the twins' float32 decoder."""
    from edgesdk.runtime.sparse_decoder import SparseDecoder

    tensors, record = tiny_sparse
    ids = torch.as_tensor([5, 17, 200, 3, 99, 42, 7, 150, 11, 64])
    twins = SparseDecoder(tensors, record, mode="reference")
    kernels = TwinKernels()
    compiled = SparseDecoder(tensors, record, compiled=kernels, graphs=False)
    expected = torch.cat([twins.step(ids[:6], keep=6)] + [twins.step(ids[i:i + 1], keep=1) for i in range(6, 10)])
    got = torch.cat([compiled.step(ids[:6], keep=6)] + [compiled.step(ids[i:i + 1], keep=1) for i in range(6, 10)])
    assert all(keys.dtype == torch.float16 for keys, _ in compiled.cache)
    cache_pointers = {keys.data_ptr() for keys, _ in compiled.cache}
    assert len(kernels.caches) == 4 * len(compiled.cache)  # one attention call per layer per decode step
    assert all(dtype == torch.float16 and pointer in cache_pointers for dtype, pointer in kernels.caches)
    scale = float(expected.abs().max())
    diff = float((got - expected).abs().max())
    print(f"\n[max abs diff] float16 cache vs twins' float32: {diff:.3e} (logit scale {scale:.1f})")
    assert diff <= 1e-2 * max(scale, 1.0)
