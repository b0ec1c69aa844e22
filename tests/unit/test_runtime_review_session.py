"""Runtime review: the backend chain, sampling and streaming text on the tiny bundle."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import RuntimeBackendError
from edgesdk.runtime.ort_backend import OrtBackend
from edgesdk.runtime.ort_fused_backend import OrtFusedBackend

CUDA_THEN_CPU = ["CUDAExecutionProvider", "CPUExecutionProvider"]


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider' is not in available")
def test_a_backend_whose_gpu_provider_did_not_start_is_refused(tiny_bundle):
    """ONNX Runtime opens the session on the providers it could start (a CUDA library of another
    JetPack missing, or no CUDA at all as here) and only logs the rest: the backend was named
    ort-CUDAExecutionProvider while every step ran on the CPU."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime starts CUDA here")
    graph = tiny_bundle.manifest["graph"]
    backend_class = OrtFusedBackend if graph["form"] == "ort-fused" else OrtBackend
    with pytest.raises(RuntimeBackendError, match="onnxruntime could not start CUDAExecutionProvider; the session "
                                                  "it opened runs on CPUExecutionProvider only") as info:
        backend_class(tiny_bundle.path / graph["file"], graph, 1, CUDA_THEN_CPU)
    assert "--backend ort-cpu" in info.value.fix


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider' is not in available")
def test_the_chain_goes_on_past_an_ort_cuda_that_runs_on_the_cpu(tiny_bundle, monkeypatch):
    """An onnxruntime-gpu lists CUDAExecutionProvider whether or not its libraries load; the chain
    said 'ort-cuda: used' for a session on the CPU, and --stats printed [ort-cuda]."""
    import onnxruntime as ort

    from edgesdk.runtime import session

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime starts CUDA here")
    monkeypatch.setattr(session, "_available_providers", lambda: list(CUDA_THEN_CPU))  # what such a wheel lists
    backend, notes = session.open_backend(tiny_bundle, ["ort-cuda", "ort-cpu"], threads=1)
    assert backend.name == "ort-cpu"
    assert notes[0].startswith("ort-cuda: failed to load (onnxruntime could not start CUDAExecutionProvider")
    assert notes[1] == "ort-cpu: used"
    backend.reset()
    assert backend.prefill(np.array([5, 6, 7])).shape == (1, tiny_bundle.manifest["graph"]["vocab_size"])


@pytest.mark.parametrize("seed", [-1, 1.5, "3", True])
def test_a_seed_numpy_cannot_take_is_refused_by_the_sampling_config(seed):
    """SamplingConfig took any seed; numpy refused a negative or fractional one only when generate()
    built its sampler, saying 'expected non-negative integer' or 'SeedSequence expects int' (no field)."""
    from edgesdk.runtime.generate import SamplingConfig

    with pytest.raises(ValueError, match=r"seed must be None or a whole number >= 0, got "):
        SamplingConfig(temperature=1.0, seed=seed)
    assert SamplingConfig(temperature=1.0, seed=0).seed == 0
