"""The ``triton`` backend on a CUDA GPU: JIT Triton kernels and the bundle's AOT cubins each give
the logits of the kernels' PyTorch twins (fp16 activations in the AOT variants: looser bound)."""

from __future__ import annotations

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
    from tests._utils.builds import build_tiny_jetson_bundle

    return build_tiny_jetson_bundle(tmp_path_factory.mktemp("gpu-sparse"))  # sm_87 cubins + PTX


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
    scale = max(1.0, float(np.abs(reference).max()))
    assert float(np.abs(_logits(jit, ids) - reference).max()) <= 1e-3 * scale
    major, minor = torch.cuda.get_device_capability()
    record = bundle.manifest["sparse"]
    if record["kernels"]["sm"] > major * 10 + minor:
        pytest.skip(f"the bundle's kernels are for sm_{record['kernels']['sm']}; this GPU is sm_{major}{minor}")
    from safetensors.torch import load_file

    tensors = load_file(str(bundle.file(record["weights"])))
    aot = TritonBackend(SparseDecoder(tensors, record, device="cuda", compiled=load_aot_kernels(bundle, record)), "aot")
    assert float(np.abs(_logits(aot, ids) - reference).max()) <= 2e-2 * scale
