"""The ONNX exporter refuses a model whose graph would silently differ from it: biases on linears the graphs do not
add (Llama's attention_bias on o_proj, mlp_bias on gate/up/down, Gemma 3's on its attention linears) and Gemma's
final logit soft-capping. The model loader refuses such configs; these hold for a model handed to export_model
directly (transformers' LlamaAttention / LlamaMLP / Gemma3ForCausalLM compute them)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgesdk.errors import ExportError  # noqa: E402
from edgesdk.export.onnx_export import ExportConfig, export_model  # noqa: E402
from edgesdk.export.validate import ValidationConfig, validate_export, validate_fused  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


def _with_random_biases(model):
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".bias"):
                parameter.uniform_(-1.0, 1.0)
    return model


@pytest.mark.parametrize("form", ["standard", "ort-fused"])
@pytest.mark.parametrize(("overrides", "named"), [
    ({"attention_bias": True}, "model.layers.0.self_attn.o_proj has a bias"),
    ({"mlp_bias": True}, "model.layers.0.mlp.gate_proj has a bias"),
])
def test_a_llama_bias_the_graphs_do_not_add_is_refused_by_name(overrides, named, form, tmp_path):
    """Before the fix the graph was written without o_proj's (or the MLP's) bias and its logits differed from the
    model's by several units."""
    model = _with_random_biases(tiny_llama(vocab_size=96, config_overrides=overrides))
    config = ExportConfig(form=form, weights="fp32")
    with pytest.raises(ExportError, match=named) as refused:
        export_model(model, tmp_path / "out", config)
    assert "attention_bias and mlp_bias false" in refused.value.fix
    assert not (tmp_path / "out" / "model.onnx").exists()


def test_gemma3_attention_biases_are_refused(tmp_path):
    """Gemma 3's attention_bias adds biases to q/k/v/o; its weights reader carried none of them."""
    model = _with_random_biases(tiny_llama(model_type="gemma3_text", head_dim=16, vocab_size=96,
                                           config_overrides={"attention_bias": True}))
    with pytest.raises(ExportError, match=r"model\.layers\.0\.self_attn\.q_proj has a bias.*no biases for a "
                                          r"gemma3_text model"):
        export_model(model, tmp_path / "out", ExportConfig(form="standard", max_context=32))


def test_final_logit_softcapping_is_refused_naming_the_value(tmp_path):
    """Gemma3ForCausalLM computes tanh(logits / cap) * cap; the graphs output the raw logits."""
    model = tiny_llama(model_type="gemma3_text", head_dim=16, vocab_size=96,
                       config_overrides={"final_logit_softcapping": 5.0})
    with pytest.raises(ExportError, match="final_logit_softcapping 5.0") as refused:
        export_model(model, tmp_path / "out", ExportConfig(form="ort-fused", weights="fp32", max_context=32))
    assert "final_logit_softcapping to null" in refused.value.fix


@pytest.mark.parametrize("form", ["standard", "ort-fused"])
def test_qwen2_qkv_biases_still_export_and_match_pytorch(form, tmp_path):
    """The biases the graphs do add (Qwen2's q/k/v) pass the check, and the graph gives the model's logits."""
    model = _with_random_biases(tiny_llama(model_type="qwen2", vocab_size=97, tie=False))
    config = ExportConfig(form=form, weights="fp32")
    spec = export_model(model, tmp_path / "out", config)
    check = ValidationConfig(prompts=1, decode_steps=2)
    if form == "standard":
        report = validate_export(model, tmp_path / "out" / "model.onnx", spec, check)
    else:
        report = validate_fused(model, tmp_path / "out" / "model.onnx", spec, config.fused(model), check)
    assert np.isfinite(list(report.max_abs_diff.values())).all()
    assert max(report.max_abs_diff.values()) < 1e-3
