"""Review of the ONNX export (export/onnx_export.py, export/validate.py, export/llama_graph.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("onnx")
pytest.importorskip("torch")

from edgesdk.errors import ExportError  # noqa: E402
from edgesdk.export.onnx_export import MIN_CONTEXT, ExportConfig, check_exportable  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


def _refusal(model_config, config: ExportConfig) -> ExportError:
    with pytest.raises(ExportError) as refused:
        check_exportable(model_config, config)
    return refused.value


def test_a_window_shorter_than_any_bundle_context_does_not_advise_a_context_the_export_refuses():
    """A sliding window of 8 tokens was refused with "pass --max-context 8 (or less)", and --max-context 8 was then
    refused as under the shortest bundle context (16): a fix that leads to another refusal."""
    config = tiny_llama(model_type="mistral", config_overrides={"sliding_window": 8}).config
    refused = _refusal(config, ExportConfig(max_context=64))
    assert "sliding window of 8 tokens" in str(refused)
    assert "--max-context 8" not in refused.fix
    assert f"at least {MIN_CONTEXT} tokens" in refused.fix
    assert "sliding window of 8" in refused.fix


def test_a_window_a_bundle_can_fit_in_still_advises_that_context():
    config = tiny_llama(model_type="mistral", config_overrides={"sliding_window": 32}).config
    refused = _refusal(config, ExportConfig(max_context=64))
    assert refused.fix.startswith("pass --max-context 32 (or less)")
    check_exportable(config, ExportConfig(max_context=32))  # the advice is taken: accepted


def test_a_longrope_original_context_shorter_than_any_bundle_context_does_not_advise_it():
    rope = {"rope_type": "longrope", "original_max_position_embeddings": 8, "short_factor": [1.0] * 8,
            "long_factor": [2.0] * 8, "factor": 8.0}
    config = tiny_llama(max_positions=64, config_overrides={"rope_parameters": rope}).config
    refused = _refusal(config, ExportConfig(max_context=64))
    assert "--max-context 8" not in refused.fix
    assert f"at least {MIN_CONTEXT} tokens" in refused.fix
