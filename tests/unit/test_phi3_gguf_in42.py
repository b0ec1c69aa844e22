"""Phi-3 GGUF files (llama.cpp's ``phi3`` architecture) as ``edgesdk build --model FILE.gguf``.

The file is written as llama.cpp's convert_hf_to_gguf.py writes a Phi-3 (conversion/phi.py, Phi3MiniModel): the
``phi3.*`` keys of its set_gguf_parameters (rope.scaling.original_context_length, sliding_window 0 for none), the
fused ``blk.N.attn_qkv`` (query, key, value rows) and ``blk.N.ffn_up`` (gate rows, then up rows) as they are, and a
SentencePiece vocabulary (``tokenizer.ggml.model`` llama) whose tokenizer.ggml.* keys are copied from the GGUF export
of a tiny Llama bundle. transformers' phi3 GGUF reader loads it, edgesdk/models/as_llama.py converts it to the Llama
it computes, and the result is compared with transformers' Phi-3 model built from the same weights, and with
llama.cpp over the file. Comparisons print their max abs logit difference (``-s``) and record it as ``max_abs_diff``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from edgesdk.errors import ExportError
from tests._utils.builds import build_tiny_bundle
from tests._utils.gguf_files import add_tokenizer_keys, close_gguf
from tests._utils.parity import report_max_abs_diff
from tests._utils.tiny import tiny_llama, tiny_llama2_tokenizer

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")

FUSED_FP32 = "name: fused\nstages: []\nexport: {form: ort-fused, weights: fp32}\n"
IDS = [5, 17, 120, 33, 250, 9, 101, 3, 42, 7, 99, 12]
needs_llama_cpp = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None,
    reason="llama-cpp-python is not installed (pip install llama-cpp-python)")


def _load(path: Path):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    return load_model(resolve_model(str(path)), progress=False)


def _bundle_logits(bundle) -> np.ndarray:
    from edgesdk.evaluate import bundle_scorer
    from edgesdk.runtime.session import open_runtime

    return bundle_scorer(open_runtime(bundle.path, threads=1))(np.array(IDS))


def write_phi3_gguf(model, target: Path, tokenizer_from: Path, window: int = 0, fields: dict | None = None) -> Path:
    """The transformers Phi-3 ``model`` written as convert_hf_to_gguf.py's Phi3MiniModel writes it (float32), with
    the tokenizer.ggml.* keys of the GGUF file ``tokenizer_from`` and the keys in ``fields`` (key -> (value,
    GGUFValueType)) added."""
    config = model.config
    state = {name: tensor.numpy() for name, tensor in model.state_dict().items()}
    writer = gguf.GGUFWriter(str(target), "phi3")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_rope_scaling_orig_ctx_len(config.original_max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_sliding_window(window)
    add_tokenizer_keys(writer, tokenizer_from)
    for name, (value, kind) in (fields or {}).items():
        writer.add_key_value(name, value, kind)
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    for index in range(config.num_hidden_layers):
        prefix = f"model.layers.{index}."
        for gguf_name, hf_name in (("attn_norm", "input_layernorm"), ("attn_qkv", "self_attn.qkv_proj"),
                                   ("attn_output", "self_attn.o_proj"), ("ffn_norm", "post_attention_layernorm"),
                                   ("ffn_up", "mlp.gate_up_proj"), ("ffn_down", "mlp.down_proj")):
            writer.add_tensor(f"blk.{index}.{gguf_name}.weight", np.ascontiguousarray(state[prefix + hf_name + ".weight"]))
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    writer.add_tensor("output.weight", state["lm_head.weight"])
    return close_gguf(writer, target)


@pytest.fixture(scope="module")
def phi3(tmp_path_factory):
    """A 3-layer untied Phi-3 (GQA 4 / 2 heads of 16, weights at 10x transformers' spread) with Llama 2's kind of
    SentencePiece vocabulary, its Phi-3 GGUF file, its logits by transformers' Phi3ForCausalLM, and the bundle
    built from the file."""
    from edgesdk.export.gguf_export import export_gguf

    root = tmp_path_factory.mktemp("phi3-gguf")
    tokenizer = tiny_llama2_tokenizer()
    model = tiny_llama(model_type="phi3", layers=3, vocab_size=len(tokenizer), tie=False, intermediate=128,
                       config_overrides={"initializer_range": 0.2})
    model_dir = root / "model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    (root / "llama").mkdir()
    llama_bundle = build_tiny_bundle(root / "llama", FUSED_FP32, "host", model_dir=model_dir, generated_sequences=0)
    vocabulary = export_gguf(llama_bundle.path, root / "llama.gguf").path
    path = write_phi3_gguf(model, root / "phi3.gguf", vocabulary)
    with torch.no_grad():
        logits = model(torch.tensor([IDS])).logits[0].numpy()
    (root / "built").mkdir()
    bundle = build_tiny_bundle(root / "built", FUSED_FP32, "host", model_dir=path, generated_sequences=0)
    return model, path, vocabulary, logits, bundle


def test_the_loaded_file_computes_transformers_phi3_model(phi3, record_property):
    model, path, _, expected, _ = phi3
    loaded = _load(path)
    assert type(loaded.model).__name__ == "LlamaForCausalLM"
    facts = loaded.facts()
    assert (facts["architecture"], facts["loaded_as"], facts["format"]) == ("phi3", "llama", "gguf")
    config = loaded.model.config
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 16)
    assert config.rms_norm_eps == pytest.approx(model.config.rms_norm_eps)
    assert config.max_position_embeddings == model.config.max_position_embeddings
    assert config.tie_word_embeddings is False
    with torch.no_grad():
        got = loaded.model(torch.tensor([IDS])).logits[0].numpy()
    scale = float(np.abs(expected).max())
    report_max_abs_diff(f"Phi-3 GGUF loaded as Llama vs transformers' Phi3ForCausalLM, logit scale {scale:.1f}",
                        float(np.abs(got - expected).max()), 1e-5 * max(scale, 1.0), record_property)


def test_a_file_without_a_padding_token_has_none(phi3, tmp_path):
    """llama.cpp's converter writes tokenizer.ggml.padding_token_id only where the tokenizer has one; transformers'
    reader then leaves Phi3Config's pad_token_id 32000, which a vocabulary of 380 tokens cannot hold (the embedding's
    padding_idx check fails the load). The padding token is the file's: none, or the one it names."""
    model, path, vocabulary, _, _ = phi3
    assert "tokenizer.ggml.padding_token_id" not in gguf.GGUFReader(str(path)).fields
    assert _load(path).model.config.pad_token_id is None
    padded = write_phi3_gguf(model, tmp_path / "padded.gguf", vocabulary,
                             fields={"tokenizer.ggml.padding_token_id": (0, gguf.GGUFValueType.UINT32)})
    assert _load(padded).model.config.pad_token_id == 0


def test_the_bundle_built_from_the_file_computes_transformers_phi3_model(phi3, record_property):
    _, _, _, expected, bundle = phi3
    before = bundle.manifest["model"]["before"]
    assert (before["architecture"], before["loaded_as"], before["format"]) == ("phi3", "llama", "gguf")
    scale = float(np.abs(expected).max())
    report_max_abs_diff(f"bundle built from the Phi-3 GGUF vs transformers' Phi3ForCausalLM, logit scale {scale:.1f}",
                        float(np.abs(_bundle_logits(bundle) - expected).max()), 1e-5 * max(scale, 1.0), record_property)


@needs_llama_cpp
def test_llama_cpp_computes_and_tokenizes_as_the_bundle_built_from_the_file(phi3, record_property):
    """llama.cpp's phi3 over the file (F32 KV cache, child process): its logits, and its token ids for a text (BOS
    added, SentencePiece's space prefix), against the bundle's and the loaded tokenizer's."""
    from tests._utils.gguf_files import llama_cpp_child

    _, path, _, _, bundle = phi3
    text = "The quick brown fox jumps over the lazy dog."
    got, answer = llama_cpp_child(path, IDS, text=text, f32_cache=True)
    assert answer["tokens"] == _load(path).tokenizer.encode(text)
    expected = _bundle_logits(bundle)
    scale = float(np.abs(expected).max())
    report_max_abs_diff(f"llama.cpp phi3 vs the bundle built from the file, logit scale {scale:.1f}",
                        float(np.abs(got - expected).max()), 1e-4 * max(scale, 1.0), record_property)


def test_the_file_s_sliding_window_bounds_the_bundle_context(phi3, tmp_path):
    """phi3.attention.sliding_window (Phi-3-mini-4k's 2047) reaches the converted Llama's config, and a bundle
    context longer than the window is refused at build (the graphs attend over the whole context)."""
    from edgesdk.export.onnx_export import ExportConfig, check_exportable

    model, _, vocabulary, _, _ = phi3
    windowed = write_phi3_gguf(model, tmp_path / "windowed.gguf", vocabulary, window=32)
    config = _load(windowed).model.config
    with pytest.raises(ExportError, match="sliding window of 32 tokens, shorter than the bundle's context of 64"):
        check_exportable(config, ExportConfig(max_context=64))
    check_exportable(config, ExportConfig(max_context=32))
