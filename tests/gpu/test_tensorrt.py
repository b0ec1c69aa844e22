"""TensorRT: build engines from tiny Jetson bundles and run them against ONNX Runtime on the same graph.

Needs the ``tensorrt`` Python module and a CUDA device (a Jetson, or an x86 machine with an
NVIDIA GPU and ``pip install tensorrt``), plus torch with CUDA or cuda-python for device
buffers. Run: ``python -m pytest tests/gpu/test_tensorrt.py -m gpu``.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

if importlib.util.find_spec("tensorrt") is None:
    pytest.skip("the 'tensorrt' Python module is not installed", allow_module_level=True)

from edgesdk.errors import RuntimeBackendError  # noqa: E402
from edgesdk.runtime import tensorrt_engine as te  # noqa: E402

_SM, _HOW = te.cuda_device_sm()
if _SM is None:
    pytest.skip(f"no CUDA device ({_HOW})", allow_module_level=True)

PROMPT = np.array([5, 17, 42, 7, 99, 3, 250, 64, 11, 8, 130, 77, 21, 4, 300, 9, 55, 18, 6, 2], np.int64)


def ort_backend(bundle):
    from edgesdk.runtime.ort_backend import OrtBackend

    graph = bundle.manifest["graph"]
    return OrtBackend(bundle.file(graph["file"]), graph, 1)


def compare(trt_backend, reference, atol: float, rtol: float) -> None:
    """Chunked prefill of every position, then decode steps, against ONNX Runtime."""
    for backend in (trt_backend, reference):
        backend.reset()
    np.testing.assert_allclose(trt_backend.prefill(PROMPT, keep_logits=len(PROMPT)),
                               reference.prefill(PROMPT, keep_logits=len(PROMPT)), atol=atol, rtol=rtol)
    for token in (12, 200, 31, 7, 88):
        np.testing.assert_allclose(trt_backend.decode(token), reference.decode(token), atol=atol, rtol=rtol)
    assert trt_backend.position == reference.position == len(PROMPT) + 5


@pytest.fixture(scope="module")
def jetson_bundle(tiny_model_dir, tmp_path_factory):
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    return build(BuildConfig(target="orin-nano-8gb", model=str(tiny_model_dir), recipe="fp32-standard",
                             out=tmp_path_factory.mktemp("trt") / "tiny-orin", export=ExportConfig(max_context=64),
                             progress=False))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(te.ENGINE_DIR_ENV, raising=False)
    return tmp_path / "cache"


def test_float32_engine_matches_onnx_runtime_with_chunked_prefill(jetson_bundle, cache, tmp_path):
    from edgesdk.runtime.tensorrt_backend import TensorRTBackend

    info = te.build_engine(jetson_bundle.path, out=tmp_path / "fp32", strongly_typed=True, max_seq=8)
    assert info["cached"] is False
    assert info["strongly_typed"] is True
    assert info["sm"] == _SM
    assert info["profile"]["max_seq"] == 8
    assert (tmp_path / "fp32" / te.INFO_FILE).is_file()
    # keyed by module too on a Jetson (timing-trt10.3.0-sm87-orin-nano-8gb.cache), where a name without it was asserted
    assert (cache / "tensorrt" / te._timing_cache_path(info["tensorrt"], _SM, te.board_module()).name).is_file()
    backend = TensorRTBackend(tmp_path / "fp32" / te.ENGINE_FILE, jetson_bundle.manifest["graph"], info)
    assert backend.max_seq == 8  # 20 prompt tokens run as 8 + 8 + 4
    compare(backend, ort_backend(jetson_bundle), atol=1e-2, rtol=1e-2)  # TF32 GEMMs
    backend.reset()
    with pytest.raises(RuntimeBackendError, match="exceeds the bundle's max_context 64"):
        backend.prefill(np.zeros(65, np.int64))
    backend.close()


def test_profile_flags_engine_is_cached_and_chosen_by_the_runtime(jetson_bundle, cache):
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.session import open_runtime

    info = te.build_engine(jetson_bundle.path)  # FP16 + SPARSE_WEIGHTS from the orin profile
    assert info["flags"] == ["FP16", "SPARSE_WEIGHTS"]
    assert te.build_engine(jetson_bundle.path)["cached"] is True
    runtime = open_runtime(jetson_bundle.path, threads=1)
    assert runtime.backend.name == "tensorrt"
    assert "tensorrt: used" in runtime.notes
    compare(runtime.backend, ort_backend(jetson_bundle), atol=5e-2, rtol=5e-2)
    tokens, stats = generate(runtime.backend, [5, 17, 42], SamplingConfig(max_new_tokens=8), stop_ids=set())
    assert len(tokens) == 8
    assert stats.stop_reason == "max_new_tokens"


def test_qdq_bundle_builds_an_int8_engine(tiny_model_dir, cache, tmp_path):
    from edgesdk.runtime.tensorrt_backend import TensorRTBackend
    from tests._utils.builds import QDQ_RECIPE, build_tiny_bundle

    bundle = build_tiny_bundle(tmp_path, QDQ_RECIPE, "orin-nano-8gb", model_dir=tiny_model_dir)
    assert bundle.manifest["graph"]["dtype"] == te.QDQ_DTYPE
    info = te.build_engine(bundle.path, out=tmp_path / "int8")
    assert info["flags"][:1] == ["INT8"] or info["strongly_typed"]
    backend = TensorRTBackend(tmp_path / "int8" / te.ENGINE_FILE, bundle.manifest["graph"], info)
    compare(backend, ort_backend(bundle), atol=5e-2, rtol=5e-2)
    backend.close()
