"""The ``triton`` backend on a CUDA GPU: JIT Triton kernels and the bundle's AOT cubins each give
the logits of the kernels' PyTorch twins (fp16 activations in the AOT variants: looser bound)."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """The tiny Jetson bundle (sm_87 cubins + PTX): built here, or one built on a host and named by
    ``EDGESDK_GPU_TEST_BUNDLE`` (a GPU machine without the host extra's packages)."""
    from pathlib import Path

    from edgesdk.bundle import verify_bundle
    from tests._utils.builds import build_tiny_jetson_bundle

    prebuilt = os.environ.get("EDGESDK_GPU_TEST_BUNDLE")
    if prebuilt:
        return verify_bundle(Path(prebuilt))
    return build_tiny_jetson_bundle(tmp_path_factory.mktemp("gpu-sparse"))


def _logits(backend, ids):
    prefill = backend.prefill(ids[:8], keep_logits=8)
    return np.concatenate([prefill, np.stack([backend.decode(int(t)) for t in ids[8:]])])


def test_triton_jit_and_aot_match_the_twins(bundle, monkeypatch):
    from edgesdk.runtime.sparse_decoder import SparseDecoder
    from edgesdk.runtime.triton_backend import TritonBackend, load_aot_kernels, open_triton_backend

    ids = np.random.default_rng(1).integers(3, 300, 12)
    monkeypatch.setenv("EDGESDK_KERNELS", "reference")
    reference = _logits(open_triton_backend(bundle, threads=1), ids)
    monkeypatch.setenv("EDGESDK_KERNELS", "triton")
    jit = open_triton_backend(bundle, threads=1)
    assert jit.decoder.device.type == "cuda"
    assert jit.decoder.graphs  # decode steps replay one captured CUDA graph
    scale = max(1.0, float(np.abs(reference).max()))
    # 3e-3: on the GPU the LM head reads the float16 embedding with float16 inputs (float32 on the CPU)
    jit_logits = _logits(jit, ids)
    assert jit.decoder._graph not in (None, False), jit.decoder.graph_error
    print(f"\n[max abs diff] triton JIT + graph vs twins: {np.abs(jit_logits - reference).max():.3e}")
    assert float(np.abs(jit_logits - reference).max()) <= 3e-3 * scale
    major, minor = torch.cuda.get_device_capability()
    record = bundle.manifest["sparse"]
    if record["kernels"]["sm"] > major * 10 + minor:
        pytest.skip(f"the bundle's kernels are for sm_{record['kernels']['sm']}; this GPU is sm_{major}{minor}")
    from safetensors.torch import load_file

    tensors = load_file(str(bundle.file(record["weights"])))
    aot = TritonBackend(SparseDecoder(tensors, record, device="cuda", compiled=load_aot_kernels(bundle, record)), "aot")
    aot_logits = _logits(aot, ids)
    print(f"\n[max abs diff] AOT cubins + graph vs twins: {np.abs(aot_logits - reference).max():.3e}")
    assert float(np.abs(aot_logits - reference).max()) <= 2e-2 * scale


def test_graph_replay_equals_eager_decode(bundle, monkeypatch):
    """Replayed CUDA-graph decode steps give the eager kernels' logits over a sequence longer than the first
    cache allocation, and again after a reset."""
    from safetensors.torch import load_file

    from edgesdk.runtime.sparse_decoder import SparseDecoder

    monkeypatch.setenv("EDGESDK_KERNELS", "triton")
    record = {**bundle.manifest["sparse"], "max_context": 320}
    tensors = load_file(str(bundle.file(record["weights"])))
    ids = torch.as_tensor(np.random.default_rng(4).integers(3, 300, 300))
    runs = {}
    for graphs in (False, True):
        decoder = SparseDecoder(tensors, record, device="cuda", graphs=graphs)
        logits = [decoder.step(ids[:5], keep=1)] + [decoder.step(ids[i : i + 1], keep=1) for i in range(5, 300)]
        decoder.reset()
        logits.append(decoder.step(ids[:1], keep=1))
        runs[graphs] = torch.cat(logits)
    assert decoder._graph not in (None, False), decoder.graph_error
    diff = (runs[True] - runs[False]).abs().max().item()
    print(f"\n[max abs diff] graph replay vs eager: {diff:.3e}")
    assert diff <= 1e-4 * max(1.0, runs[False].abs().max().item())
