"""The fused ONNX Runtime graph: block quantization, exact layout, in-place KV buffers."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from edgesdk.export.blockwise import half_scales, pack_codes, quantize_blockwise, unpack_codes  # noqa: E402
from edgesdk.export.onnx_export import MODEL_FILE, ExportConfig, export_model  # noqa: E402
from edgesdk.export.validate import ExportMismatchError, ValidationConfig, validate_fused  # noqa: E402
from edgesdk.runtime.ort_fused_backend import INITIAL_CAPACITY, OrtFusedBackend  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402

ARCHS = {
    "llama-gqa": {"heads": 4, "kv_heads": 2},
    "llama-mqa-untied": {"heads": 4, "kv_heads": 1, "tie": False},
    "qwen2-bias": {"heads": 4, "kv_heads": 2, "model_type": "qwen2"},
    "qwen3-qk-norm": {"heads": 4, "kv_heads": 2, "model_type": "qwen3", "head_dim": 32},  # query 128 wide, model 64
    # sandwich norms (1 + weight), sliding and full layers (window 4), GeGLU, scaled embedding
    "gemma3": {"heads": 4, "kv_heads": 2, "model_type": "gemma3_text", "head_dim": 32, "layers": 3},
}


@pytest.mark.parametrize("k", [32, 64, 40])  # 40: K padded to whole blocks
def test_int8_roundtrip_error_is_half_a_step(k):
    weight = np.random.default_rng(k).standard_normal((k, 24)).astype(np.float32)
    q = quantize_blockwise(weight, 8, 32)
    restored = q.dequantize()
    assert restored.shape == weight.shape
    steps = np.repeat(q.scales.reshape(24, -1), 32, axis=1)[:, :k].T  # (K, N) step of each weight
    assert np.all(np.abs(restored - weight) <= steps / 2 + 1e-6)
    assert q.packed.shape == (24, -(-k // 32), 32)


def test_int4_scale_search_beats_absmax_rounding():
    """The searched 4-bit scales give no more squared error, block by block, than absmax/7 (both
    rounded to the float16 the bundle stores)."""
    weight = np.random.default_rng(1).standard_normal((256, 64)).astype(np.float32)
    q = quantize_blockwise(weight, 4, 32)
    assert q.packed.shape == (64, 8, 16)
    grouped = weight.T.reshape(64, 8, 32)
    absmax = half_scales(np.abs(grouped).max(-1, keepdims=True) / 7)
    baseline = np.clip(np.rint(grouped / absmax), -8, 7) * absmax
    searched = q.dequantize().T.reshape(64, 8, 32)
    baseline_error = ((baseline - grouped) ** 2).sum(-1)
    searched_error = ((searched - grouped) ** 2).sum(-1)
    assert np.all(searched_error <= baseline_error + 1e-9)
    assert searched_error.sum() < 0.9 * baseline_error.sum()


def test_pack_unpack_identity():
    codes = np.random.default_rng(0).integers(0, 16, (3, 2, 32)).astype(np.uint8)
    assert np.array_equal(unpack_codes(pack_codes(codes, 4), 4), codes)
    with pytest.raises(ValueError, match="bits must be 4 or 8"):
        quantize_blockwise(np.ones((32, 2), np.float32), 3, 32)


@pytest.mark.parametrize("weights", ["fp32", "int8", "int4"])
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_fused_export_validates(arch, weights, tmp_path):
    model = tiny_llama(**ARCHS[arch])
    config = ExportConfig(form="ort-fused", weights=weights, max_context=128)
    spec = export_model(model, tmp_path, config)
    report = validate_fused(model, tmp_path / MODEL_FILE, spec, config.fused(), ValidationConfig(prompts=2))
    print(f"{arch} {weights}: {report.max_abs_diff}")
    if weights == "fp32":
        assert max(report.max_abs_diff.values()) < 1e-4
    else:  # float32 compute over the quantized weights equals the fake-quantized PyTorch model
        assert report.max_abs_diff["layout/prefill"] < 1e-4
        assert report.max_abs_diff["layout/decode"] < 1e-4


def test_untied_head_is_stored_at_the_embedding_bits(tmp_path):
    """int4 layers with embedding_bits 8: an untied LM head is an 8-bit MatMulNBits (as QAT trains it), the
    embedding an 8-bit GatherBlockQuantized, and validation's reference quantizes both the same way."""
    import onnx

    model = tiny_llama(tie=False)
    config = ExportConfig(form="ort-fused", weights="int4", embedding_bits=8, max_context=64)
    spec = export_model(model, tmp_path, config)
    nodes = onnx.load(str(tmp_path / MODEL_FILE), load_external_data=False).graph.node
    bits = {node.input[1] if node.op_type == "MatMulNBits" else "embedding": next(a.i for a in node.attribute
                                                                                  if a.name == "bits")
            for node in nodes if node.op_type in ("MatMulNBits", "GatherBlockQuantized")}
    assert bits["lm_head.qweight"] == bits["embedding"] == 8
    assert bits["layers.0.attn.qkv.qweight"] == 4
    report = validate_fused(model, tmp_path / MODEL_FILE, spec, config.fused(), ValidationConfig(prompts=1))
    assert report.max_abs_diff["layout/decode"] < 1e-4


def test_fused_layout_bug_is_caught(tmp_path):
    """A graph whose weights disagree with the model fails the exact layout check."""
    model = tiny_llama()
    config = ExportConfig(form="ort-fused", weights="int8", max_context=64)
    spec = export_model(model, tmp_path, config)
    with torch.no_grad():
        model.model.layers[1].self_attn.o_proj.weight.mul_(-1.0)
    with pytest.raises(ExportMismatchError, match="float32 compute vs quantized weights"):
        validate_fused(model, tmp_path / MODEL_FILE, spec, config.fused(), ValidationConfig(prompts=1))


def test_shared_kv_buffer_grows_and_chunks_exactly(tmp_path):
    """Prefill, a second prefill chunk, then decode past the initial buffer: equal to one prefill."""
    model = tiny_llama()
    spec = export_model(model, tmp_path, ExportConfig(form="ort-fused", max_context=512))
    backend = OrtFusedBackend(tmp_path / MODEL_FILE, spec.to_json(), threads=1)
    total = INITIAL_CAPACITY + 40
    ids = np.random.default_rng(3).integers(0, spec.vocab_size, total)
    full = backend.prefill(ids, keep_logits=total)
    backend.reset()
    backend.prefill(ids[:200])
    chunk = backend.prefill(ids[200:230], keep_logits=30)
    steps = np.stack([backend.decode(int(t)) for t in ids[230:]])
    np.testing.assert_allclose(chunk, full[200:230], atol=1e-4)
    np.testing.assert_allclose(steps, full[230:], atol=1e-4)
    assert backend.position == total


def test_decode_steps_reuse_one_binding_and_equal_fresh_bindings(tmp_path):
    """After the first decode step, steps reuse one IO binding; logits equal a fresh binding per
    step exactly, stay intact after later steps, and a replaced session gets a new binding."""
    model = tiny_llama()
    spec = export_model(model, tmp_path, ExportConfig(form="ort-fused", max_context=128))
    backend = OrtFusedBackend(tmp_path / MODEL_FILE, spec.to_json(), threads=1)
    ids = [int(t) for t in np.random.default_rng(4).integers(0, spec.vocab_size, 24)]
    bindings = []
    create = backend.session.io_binding
    backend.session.io_binding = lambda: bindings.append(1) or create()
    backend.prefill(np.array(ids[:8]))
    reused = [backend.decode(t) for t in ids[8:]]
    assert len(bindings) == 3  # the prompt, the first step, the reused step binding
    backend.reset()
    backend.prefill(np.array(ids[:8]))
    fresh = []
    for t in ids[8:]:
        backend._decode_step = None  # force a fresh binding for every step
        fresh.append(backend.decode(t))
    np.testing.assert_array_equal(np.stack(reused), np.stack(fresh))
    backend.session = type(backend.session)(str(tmp_path / MODEL_FILE), providers=["CPUExecutionProvider"])
    backend.reset()
    backend.prefill(np.array(ids[:8]))
    np.testing.assert_array_equal(backend.decode(ids[8]), reused[0])
    assert backend._decode_step.session is backend.session


def test_standard_form_refuses_quantized_weights():
    from edgesdk.errors import ExportError

    with pytest.raises(ExportError, match="standard form exports float32 or int8 \\(QDQ\\) weights"):
        ExportConfig(form="standard", weights="int4")  # int8 is the QDQ form (tests/unit/test_qdq_export.py)
    with pytest.raises(ExportError, match="export form 'fast' is unknown"):
        ExportConfig(form="fast")


def test_a_sparse_layout_without_sparse_weights_is_refused_as_ignored():
    """export.sparse_layout=transposed was taken and ignored where export.sparse is off, which stores no blocks."""
    from edgesdk.errors import ExportError

    with pytest.raises(ExportError, match="sparse_layout=transposed with sparse=false.*would be ignored"):
        ExportConfig(form="ort-fused", weights="int8", sparse_layout="transposed")
    assert ExportConfig(form="standard", weights="int8", sparse=True, sparse_layout="transposed").sparse


def test_scales_are_float16_values_and_tiny_blocks_stay_finite():
    """Scales are exactly float16 values (the bundle stores them as float16); a block of weights
    far below float16's range quantizes to zeros, never to NaN."""
    weight = np.random.default_rng(2).standard_normal((64, 8)).astype(np.float32)
    weight[:32, 0] *= 1e-9  # one block far below float16's smallest normal
    for bits in (4, 8):
        q = quantize_blockwise(weight, bits, 32)
        assert np.array_equal(q.scales, q.scales.astype(np.float16).astype(np.float32))
        restored = q.dequantize()
        assert np.isfinite(restored).all()
        assert np.abs(restored[:32, 0]).max() <= 1e-4


@pytest.mark.parametrize("head_dim", [16, 24, 48])
def test_head_dims_the_fused_attention_cannot_take_are_refused_before_export(head_dim, tmp_path):
    """GroupQueryAttention with rotary runs head sizes that are multiples of 16 only: 24 is refused by the
    config check (naming the standard form), not by ONNX Runtime at validation; 16 and 48 export and match."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from edgesdk.errors import ExportError
    from edgesdk.export.onnx_export import check_exportable

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "llama", vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, head_dim=head_dim)).eval()
    config = ExportConfig(form="ort-fused", weights="fp32", max_context=32)
    if head_dim % 16:
        with pytest.raises(ExportError, match=f"head_dim is {head_dim}.*multiple of 16") as refused:
            check_exportable(model.config, config)
        assert "standard" in refused.value.fix
        return
    spec = export_model(model, tmp_path, config)
    report = validate_fused(model, tmp_path / MODEL_FILE, spec, config.fused(),
                            ValidationConfig(prompts=1, prompt_length=3, decode_steps=2))
    assert max(report.max_abs_diff.values()) < 1e-4
