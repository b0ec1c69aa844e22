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
