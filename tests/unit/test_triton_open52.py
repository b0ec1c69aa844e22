"""The fix a failed ``triton`` backend load gives follows its cause: memory to free only when memory ran out;
a weights file torch cannot read is the bundle's problem (verify, rebuild), not the GPU's."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from edgesdk.errors import RuntimeBackendError  # noqa: E402
from edgesdk.runtime.triton_backend import _load_failure_fix, open_triton_backend  # noqa: E402
from tests.unit.test_triton_open48 import unreadable_bundle  # noqa: E402, F401 - the fixture


def test_an_unreadable_weights_file_is_sent_to_verify_not_to_free_gpu_memory(unreadable_bundle):  # noqa: F811
    with pytest.raises(RuntimeBackendError, match=r"did not load onto cpu") as caught:
        open_triton_backend(unreadable_bundle, threads=1)
    assert "edgesdk verify BUNDLE" in caught.value.fix
    assert "memory" not in caught.value.fix
    assert "--backend ort-cuda or ort-cpu" in caught.value.fix


def test_memory_that_ran_out_is_told_to_free_it():
    import torch

    fix = _load_failure_fix(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB"))
    assert fix.startswith("free the memory another process holds")
    assert _load_failure_fix(MemoryError()).startswith("free the memory")


def test_host_memory_that_ran_out_is_told_to_free_it_too():
    """torch's CPU allocator says "can't allocate memory", not "out of memory": it was sent to verify / rebuild."""
    fix = _load_failure_fix(RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't "
                                         "allocate memory: you tried to allocate 1073741824 bytes."))
    assert fix.startswith("free the memory another process holds")
