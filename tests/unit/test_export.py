"""The ONNX decoder export: numerics against PyTorch across architectures, and the mismatch error."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")

from edgesdk.errors import ExportError  # noqa: E402
from edgesdk.export.llama_graph import OPSET  # noqa: E402
from edgesdk.export.onnx_export import DATA_FILE, MODEL_FILE, ExportConfig, export_model  # noqa: E402
from edgesdk.export.validate import ExportMismatchError, ValidationConfig, validate_export  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402

CASES = {
    "llama-gqa-tied": {"heads": 4, "kv_heads": 2},
    "llama-mha-untied": {"heads": 4, "kv_heads": 4, "tie": False},
    "llama-mqa": {"heads": 4, "kv_heads": 1, "layers": 3},
    "qwen2-bias": {"heads": 4, "kv_heads": 2, "model_type": "qwen2"},
    "qwen3-qk-norm": {"heads": 4, "kv_heads": 2, "model_type": "qwen3", "head_dim": 32},  # query 128 wide, model 64
    # sandwich norms (1 + weight), sliding and full layers (window 4), GeGLU, scaled embedding
    "gemma3": {"heads": 4, "kv_heads": 2, "model_type": "gemma3_text", "head_dim": 32, "layers": 3},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_matches_pytorch_over_prefill_and_decode(case, tmp_path):
    model = tiny_llama(**CASES[case])
    spec = export_model(model, tmp_path, ExportConfig(max_context=128))
    report = validate_export(model, tmp_path / MODEL_FILE, spec, ValidationConfig(prompts=3, decode_steps=5))
    worst = max(report.max_abs_diff.values())
    print(f"{case}: max abs diff {report.max_abs_diff}")
    assert worst < 1e-4, report.max_abs_diff
    assert report.top1_agree == 1.0


def test_export_writes_external_data_and_opset(tmp_path):
    model = tiny_llama()
    export_model(model, tmp_path, ExportConfig(max_context=64))
    proto = onnx.load(str(tmp_path / MODEL_FILE), load_external_data=False)
    assert proto.opset_import[0].version == OPSET >= 17
    assert (tmp_path / DATA_FILE).stat().st_size > (tmp_path / MODEL_FILE).stat().st_size
    external = [t.name for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert "embed_tokens.weight" in external
    names = [i.name for i in proto.graph.input]
    assert names[0] == "input_ids"
    assert "past_key_values.1.value" in names
    assert names[-1] == "num_logits_to_keep"


def test_export_twice_into_same_directory_does_not_grow_data(tmp_path):
    model = tiny_llama()
    export_model(model, tmp_path, ExportConfig(max_context=64))
    size = (tmp_path / DATA_FILE).stat().st_size
    export_model(model, tmp_path, ExportConfig(max_context=64))
    assert (tmp_path / DATA_FILE).stat().st_size == size


def test_mismatch_raises_typed_error_listing_each_output(tmp_path):
    model = tiny_llama()
    spec = export_model(model, tmp_path, ExportConfig(max_context=64))
    with torch.no_grad():  # the graph now disagrees with the model it is checked against
        model.model.layers[0].mlp.down_proj.weight.add_(0.5)
    with pytest.raises(ExportMismatchError, match=r"logits/prefill: max \|diff\|") as caught:
        validate_export(model, tmp_path / MODEL_FILE, spec, ValidationConfig(prompts=1, decode_steps=2))
    assert set(caught.value.diffs) >= {"logits/prefill", "logits/decode"}
    assert caught.value.diffs["logits/prefill"] > 1e-3
    assert isinstance(caught.value, ExportError)
    assert caught.value.fix


def test_rotary_table_limits_context(tmp_path):
    model = tiny_llama()
    spec = export_model(model, tmp_path, ExportConfig(max_context=10_000))
    assert spec.max_context == model.config.max_position_embeddings
    with pytest.raises(ExportError, match="max_context 8 is too short"):
        export_model(model, tmp_path, ExportConfig(max_context=8))


def test_decode_cache_extends_prefill_exactly(tmp_path):
    """Prefill of n tokens then one decode step equals prefill of n+1 tokens (cache positions right)."""
    import onnxruntime as ort

    from edgesdk.export.validate import empty_past

    model = tiny_llama()
    spec = export_model(model, tmp_path, ExportConfig(max_context=64))
    session = ort.InferenceSession(str(tmp_path / MODEL_FILE), providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(1).integers(0, spec.vocab_size, (1, 9), dtype=np.int64)
    full = session.run(["logits"], {"input_ids": ids, "num_logits_to_keep": np.array([9]), **empty_past(spec)})[0]
    names = [o.name for o in session.get_outputs()]
    first = dict(zip(names, session.run(None, {"input_ids": ids[:, :8], "num_logits_to_keep": np.array([1]),
                                                **empty_past(spec)}), strict=False))
    feeds = {n.replace("present", "past_key_values"): v for n, v in first.items() if n.startswith("present")}
    step = session.run(["logits"], {"input_ids": ids[:, 8:], "num_logits_to_keep": np.array([1]), **feeds})[0]
    np.testing.assert_allclose(step[0, 0], full[0, 8], atol=1e-5)
    np.testing.assert_allclose(first["logits"][0, 0], full[0, 7], atol=1e-5)


def test_sliding_window_counts_only_when_some_layer_slides():
    from transformers import MistralConfig, Qwen2Config

    from edgesdk.export.onnx_export import sliding_window

    def qwen2(**kw):
        return Qwen2Config(num_hidden_layers=4, sliding_window=64, **kw)

    assert sliding_window(qwen2(use_sliding_window=False)) is None
    # Qwen2 slides only in layers from max_window_layers on: 2 of 4 layers slide, 4 of 4 attend fully.
    assert sliding_window(qwen2(use_sliding_window=True, max_window_layers=2)) == 64
    assert sliding_window(qwen2(use_sliding_window=True, max_window_layers=4)) is None
    assert sliding_window(MistralConfig(sliding_window=32)) == 32
    assert sliding_window(MistralConfig(sliding_window=None)) is None


def rope_model(rope: dict | None, model_type: str = "llama", max_positions: int = 512):
    """A tiny random decoder (GQA 4/2 heads, head_dim 16) whose config carries ``rope`` as its rope_scaling."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    extra = {"attention_bias": False} if model_type == "llama" else {}
    config = AutoConfig.for_model(model_type, vocab_size=320, hidden_size=64, intermediate_size=112,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                  max_position_embeddings=max_positions, rope_scaling=rope, **extra)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(8.0)
    return model


LONGROPE = {"rope_type": "longrope", "long_factor": [4.0] * 8, "short_factor": [1.0] * 8,
            "original_max_position_embeddings": 128}
ROPES = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
}


@pytest.mark.parametrize("rope", sorted(ROPES))
def test_rope_scaling_types_match_pytorch_near_max_context(rope, tmp_path):
    """Scaled rotary embeddings: the graph's tables equal the model's over a context filled to the end."""
    model = rope_model(ROPES[rope], "qwen2" if rope == "yarn" else "llama", max_positions=200)
    spec = export_model(model, tmp_path, ExportConfig(max_context=4096))
    assert spec.max_context == 200
    report = validate_export(model, tmp_path / MODEL_FILE, spec,
                             ValidationConfig(prompts=1, prompt_length=195, decode_steps=5))
    assert max(report.max_abs_diff.values()) < 1e-4, report.max_abs_diff


def test_longrope_past_its_original_context_is_refused(tmp_path):
    """longrope switches every position to its long factors past original_max_position_embeddings: a fixed
    table cannot follow, so a longer context is refused with the context that works."""
    model = rope_model(LONGROPE)
    with pytest.raises(ExportError, match="longrope") as caught:
        export_model(model, tmp_path, ExportConfig(max_context=512))
    assert "--max-context 128" in caught.value.fix
    assert not (tmp_path / MODEL_FILE).exists()


def test_longrope_within_its_original_context_exports_the_short_factors(tmp_path):
    """Within the original context the short factors apply, even after a long forward pass switched the
    model's inv_freq buffer to the long ones."""
    model = rope_model(LONGROPE)
    with torch.no_grad():
        model(torch.zeros((1, 200), dtype=torch.long))  # longer than 128: inv_freq now holds the long factors
    spec = export_model(model, tmp_path, ExportConfig(max_context=128))
    report = validate_export(model, tmp_path / MODEL_FILE, spec,
                             ValidationConfig(prompts=1, prompt_length=120, decode_steps=4))
    assert max(report.max_abs_diff.values()) < 1e-4, report.max_abs_diff


def test_unknown_rope_type_is_refused():
    from edgesdk.export.onnx_export import check_exportable

    config = rope_model(None).config
    config.rope_parameters = {"rope_type": "made-up", "rope_theta": 10000.0}
    with pytest.raises(ExportError, match="rotary embedding type 'made-up'"):
        check_exportable(config, ExportConfig(max_context=64))


def test_sliding_window_model_validates_with_the_context_filled_to_its_window(tmp_path):
    """A context equal to the window is exported (the graph is the model there); validation filled to it compares
    the positions transformers' sliding-window cache keeps (its last window - 1) instead of failing on shapes."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "mistral", vocab_size=320, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, sliding_window=16)).eval()
    spec = export_model(model, tmp_path, ExportConfig(max_context=16))
    report = validate_export(model, tmp_path / MODEL_FILE, spec, ValidationConfig(prompts=1, prompt_length=12,
                                                                                   decode_steps=4))
    assert max(report.max_abs_diff.values()) < 1e-4, report.max_abs_diff
