"""TensorRT engine builder and backend, review 56.

TensorRT is not installed here: the builder runs against the stand-in of TensorRT 10's build API of test_trt48 (the
bundle's real ONNX graph parsed with ``onnx``), the backend against the stand-in of test_gpu_runtime46 that runs the
bundle's real graph with ONNX Runtime. Real builds: tests/gpu/test_tensorrt.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import RuntimeBackendError
from edgesdk.runtime import tensorrt_engine as te
from tests.unit.test_gpu_runtime46 import _tensorrt_backend
from tests.unit.test_trt48 import standard_bundle, tensorrt  # noqa: F401 - fixtures: a tiny fp32-standard bundle, the stand-in


def test_an_out_that_is_a_file_is_refused_before_the_build_and_the_file_kept(standard_bundle, tensorrt,  # noqa: F811
                                                                               tmp_path):
    """``out=model.plan`` (the plan file itself, as trtexec's --saveEngine names it) where such a file exists: the
    build ran, then the file was renamed to a hidden ``.model.plan.old-<pid>`` and an engine directory put in its
    place."""
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"an engine trtexec wrote")
    with pytest.raises(RuntimeBackendError, match=r"model\.plan is a file") as info:
        te.build_engine(standard_bundle.path, out=plan)
    assert tensorrt.builds == 0  # refused before the minutes of the build
    assert "--out" in info.value.fix
    assert plan.read_bytes() == b"an engine trtexec wrote"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "cache") == ["model.plan"]
    with pytest.raises(RuntimeBackendError, match="is a file"):  # the commit itself too
        te._commit(plan, b"plan", {})
    assert plan.read_bytes() == b"an engine trtexec wrote"


@pytest.mark.parametrize("empty", [[], np.array([], np.int64), np.zeros((1, 0), np.int64)])
def test_a_tensorrt_prefill_of_no_tokens_is_named_as_0_tokens(standard_bundle, monkeypatch, tmp_path,  # noqa: F811
                                                              empty):
    """An empty list (float64 to numpy) was refused as "token ids of dtype float64 ([]): expected whole numbers", and
    an empty int array as "prefill got no tokens"; ort-cpu and triton say "prefill of 0 tokens"."""
    backend = _tensorrt_backend(standard_bundle, monkeypatch, tmp_path, max_seq=4)
    backend.prefill(np.array([5, 6]))
    with pytest.raises(RuntimeBackendError, match="prefill of 0 tokens") as info:
        backend.prefill(empty)
    assert "dtype" not in info.value.problem
    assert backend.position == 2
    assert backend.prefill(np.array([7])).shape == (1, backend.vocab_size)
