"""Opening a bundle's graph on the ONNX Runtime backends (edgesdk/runtime/ort_backend.py, ort_fused_backend.py):
a model path given as a string opens as a Path does."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.test_ort55 import export_both_forms


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export_both_forms(tmp_path_factory)


@pytest.mark.parametrize("form", ["standard", "ort-fused"])
def test_a_model_path_given_as_a_string_opens_and_runs_as_its_path_does(exported, form):
    """A str path failed inside the weights reader ('str' object has no attribute 'name'), reported as ONNX Runtime
    being unable to load the model, with a fix about verifying the bundle and the installed onnxruntime."""
    from edgesdk.runtime.ort_backend import OrtBackend
    from edgesdk.runtime.ort_fused_backend import OrtFusedBackend

    backend_class = OrtBackend if form == "standard" else OrtFusedBackend
    path, graph = exported[form]
    by_path, by_str = backend_class(path, graph, threads=1), backend_class(str(path), graph, threads=1)
    ids = np.array([5, 9, 11, 3])
    np.testing.assert_array_equal(by_str.prefill(ids, keep_logits=4), by_path.prefill(ids, keep_logits=4))
