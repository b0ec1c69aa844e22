"""ONNX graph export, review 52."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgesdk.export.onnx_export import ExportConfig, export_model  # noqa: E402
from tests._utils.tiny import on_sparse_grid, tiny_llama  # noqa: E402


def test_block_sparse_weights_take_the_bundle_context_the_model_bounds(tmp_path):
    """A model of 64 positions built with the default --max-context 4096: the ONNX graph's context is 64
    (bundle_context), but the block-sparse record kept 4096, so the triton backend ran sequences past the model's
    positions (and sized its KV cache for them) where the graph of the same bundle refuses them."""
    from safetensors.torch import load_file

    from edgesdk.errors import RuntimeBackendError
    from edgesdk.export.sparse_export import SparseExportConfig, export_sparse
    from edgesdk.runtime.sparse_decoder import SparseDecoder
    from edgesdk.runtime.triton_backend import TritonBackend

    model = on_sparse_grid(tiny_llama(vocab_size=96, max_positions=64))
    spec = export_model(model, tmp_path, ExportConfig(max_context=4096))
    record = export_sparse(model, tmp_path, SparseExportConfig(block=16), max_context=4096)
    assert spec.max_context == 64
    assert record["max_context"] == spec.max_context

    backend = TritonBackend(SparseDecoder(load_file(str(tmp_path / record["weights"])), record, mode="reference"),
                            "reference")
    assert backend.prefill(np.arange(64) % 96).shape == (1, 96)
    with pytest.raises(RuntimeBackendError, match="exceeds the bundle's max_context 64"):
        backend.decode(1)
