"""Review of the tuning caches: a changed EDGESDK_KERNEL_TUNING takes effect in the same process."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")


def test_device_tuning_follows_a_changed_override(monkeypatch):
    """ops._device_tuning was cached by device index alone, so the EDGESDK_KERNEL_TUNING read at the first call
    held for the life of the process: a tuning sweep on a board measured the first setting every time."""
    from edgesdk.kernels import ops

    props = SimpleNamespace(major=8, minor=7, multi_processor_count=8, shared_memory_per_multiprocessor=164 * 1024)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.delenv("EDGESDK_KERNEL_TUNING", raising=False)
    ops._device_tuning_for.cache_clear()
    try:
        assert ops._device_tuning(0).gemv_unroll == 4
        monkeypatch.setenv("EDGESDK_KERNEL_TUNING", "gemv_unroll=2")
        assert ops._device_tuning(0).gemv_unroll == 2
        monkeypatch.setenv("EDGESDK_KERNEL_TUNING", "gemv_unroll=8,gemv_programs_per_sm=16")
        assert (ops._device_tuning(0).gemv_unroll, ops._device_tuning(0).gemv_programs_per_sm) == (8, 16)
    finally:
        ops._device_tuning_for.cache_clear()  # the fake device must not outlive this test


def test_compiled_gemv_follows_a_changed_override(monkeypatch):
    """The loader cached each GEMV variant's split-K tuning by (variant, device), so gemv_programs_per_sm set after
    the first call was ignored by the same CompiledKernels."""
    from edgesdk.kernels.block_sparse import BlockSparseWeight
    from tests.unit.test_kernel_loader import fake_kernels

    monkeypatch.delenv("EDGESDK_KERNEL_TUNING", raising=False)
    kernels, driver = fake_kernels()
    w = BlockSparseWeight.from_dense(torch.ones(64, 2048, dtype=torch.int8), torch.ones(64))  # 2 rows x 64 blocks
    kernels.block_sparse_matmul(torch.randn(1, 2048), w)
    assert driver.launches[-1][1] == (2, 1, 8)
    monkeypatch.setenv("EDGESDK_KERNEL_TUNING", "gemv_programs_per_sm=1")
    kernels.block_sparse_matmul(torch.randn(1, 2048), w)
    assert driver.launches[-1][1] == (2, 1, 4)  # 1 program per SM: 8 programs over 2 block rows


@pytest.mark.parametrize(("text", "message"), [
    ("gemv_unroll=\u0664", r"'gemv_unroll=\u0664' is not NAME=INTEGER"),  # an Arabic-Indic 4 was taken as 4
    ("gemv_unroll=\u00b2", r"'gemv_unroll=\u00b2' is not NAME=INTEGER"),  # raised int()'s bare message
    ("gemv_unroll=--4", r"'gemv_unroll=--4' is not NAME=INTEGER"),
    ("gemv_unroll=2,gemv_unroll=8", r"gemv_unroll is given twice \(gemv_unroll=2 and gemv_unroll=8\)"),  # 8 won
])
def test_tuning_overrides_refuse_junk_with_the_variable_named(text, message):
    from edgesdk.kernels.tuning import parse_tuning_overrides

    with pytest.raises(ValueError, match=f"EDGESDK_KERNEL_TUNING: {message}"):
        parse_tuning_overrides(text)
