"""Marks shared by the GPU benchmarks."""

from __future__ import annotations

import importlib.util

import pytest


def gpu_benchmark_marks(torch) -> list:
    """benchmark + gpu, skipped without a CUDA device or without triton."""
    return [
        pytest.mark.benchmark,
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(),
                           reason="needs a CUDA GPU: torch.cuda.is_available() is False"),
        pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                           reason="needs triton (pip install edgesdk[kernels])"),
    ]
