"""Export review 59: the sliding window a Mistral model attends over, whatever its config's layer_types say."""

from __future__ import annotations

import pytest

pytest.importorskip("onnx")
pytest.importorskip("torch")

from edgesdk.errors import ExportError  # noqa: E402
from edgesdk.export.onnx_export import MODEL_FILE, ExportConfig, check_exportable, export_model  # noqa: E402
from edgesdk.export.validate import ValidationConfig, validate_export  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402

WINDOW = 16


def mistral_listing_full_layers():
    """A tiny Mistral whose config.json lists every layer as full_attention beside a sliding_window: transformers'
    MistralModel reads only sliding_window and masks every layer with it (it warns "Detected Mistral model with
    layer_types")."""
    return tiny_llama(model_type="mistral", config_overrides={"sliding_window": WINDOW,
                                                              "layer_types": ["full_attention"] * 2})


def test_a_mistral_window_is_refused_though_its_layer_types_list_no_sliding_layer(tmp_path):
    """The export took such a model's window for absent, wrote a whole-context graph and then failed validation
    as an 'exporter bug' (logits off by ~2 past the window) after every stage had run."""
    model = mistral_listing_full_layers()
    with pytest.raises(ExportError, match=f"sliding window of {WINDOW} tokens") as refused:
        check_exportable(model.config, ExportConfig(max_context=64))
    assert f"--max-context {WINDOW}" in refused.value.fix
    with pytest.raises(ExportError, match="sliding window"):
        export_model(model, tmp_path, ExportConfig(max_context=64))
    assert not (tmp_path / MODEL_FILE).exists()


def test_a_mistral_listing_layer_types_exports_within_its_window_and_matches_pytorch(tmp_path):
    model = mistral_listing_full_layers()
    spec = export_model(model, tmp_path, ExportConfig(max_context=WINDOW))
    report = validate_export(model, tmp_path / MODEL_FILE, spec, ValidationConfig(prompts=1, prompt_length=12,
                                                                                   decode_steps=4))
    assert max(report.max_abs_diff.values()) < 1e-4, report.max_abs_diff


def test_qwen2_layer_types_still_decide_whether_its_window_counts():
    """Qwen2's attention reads layer_types (sliding only from max_window_layers on): there the list still rules."""
    from transformers import Qwen2Config

    from edgesdk.export.onnx_export import sliding_window

    assert sliding_window(Qwen2Config(num_hidden_layers=2, use_sliding_window=True, sliding_window=WINDOW,
                                      max_window_layers=2)) is None
    assert sliding_window(Qwen2Config(num_hidden_layers=2, use_sliding_window=True, sliding_window=WINDOW,
                                      max_window_layers=1)) == WINDOW
