"""Qwen3 beyond test_qwen3.py's shapes: config options the export must refuse, GGUF head sizes read as
llama.cpp reads them, and llama.cpp on a Qwen3 whose head size is width / heads."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import ExportError, ModelSourceError
from tests._utils.builds import build_tiny_bundle
from tests._utils.tiny import save_tiny_model_dir

torch = pytest.importorskip("torch")

FUSED_FP32 = "name: fused\nstages: []\nexport: {form: ort-fused, weights: fp32, block_size: 32}\n"
PROMPT = "The quick brown fox jumps over the lazy dog. Edge boards run small language models."


def _qwen3_config(**kw):
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64, **kw)


def test_a_qwen3_sliding_window_shorter_than_the_context_is_refused():
    """Qwen3Attention attends over ``sliding_window`` tokens on its sliding layers when use_sliding_window is
    set; the exported graph attends over the whole context, so such a model is refused before any stage."""
    from edgesdk.export.onnx_export import ExportConfig, check_exportable, sliding_window

    sliding = _qwen3_config(use_sliding_window=True, sliding_window=8, max_window_layers=0)
    with pytest.raises(ExportError, match="sliding window of 8 tokens, shorter than the bundle's context of 64"):
        check_exportable(sliding, ExportConfig(max_context=64))
    assert sliding_window(_qwen3_config(use_sliding_window=False, sliding_window=8)) is None
    assert sliding_window(_qwen3_config(use_sliding_window=True, sliding_window=8, max_window_layers=2)) is None
    check_exportable(_qwen3_config(use_sliding_window=True, sliding_window=64, max_window_layers=0),
                     ExportConfig(max_context=64))


def _float_bundle_gguf(tmp_path, **model):
    from edgesdk.export.gguf_export import export_gguf

    model_dir = save_tiny_model_dir(tmp_path / "model", **{"hidden": 64, "heads": 4, "kv_heads": 2,
                                                          "intermediate": 128, **model})
    bundle = build_tiny_bundle(tmp_path, FUSED_FP32, "host", model_dir=model_dir)
    return bundle, export_gguf(bundle.path, tmp_path / "model.gguf")


def _fields(path) -> dict:
    from gguf import GGUFReader

    return {name: field.contents() for name, field in GGUFReader(str(path)).fields.items()}


@pytest.mark.parametrize(("model", "key_length"), [
    # 64 / 4 heads, yet key_length is written as llama.cpp's converter writes it for every config with head_dim
    # (Qwen3's always has one); edgesdk's loader reads 16 either way, transformers' Qwen3 mapping ignores it (128)
    ({"model_type": "qwen3", "head_dim": 16}, 16),
    ({"model_type": "llama", "head_dim": 32}, 32),  # a Llama GGUF that writes key_length (and rope dims)
])
def test_a_gguf_is_read_with_the_head_size_llama_cpp_takes(tmp_path, model, key_length):
    from transformers import AutoModelForCausalLM

    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    _, report = _float_bundle_gguf(tmp_path, **model)
    arch = model["model_type"]
    assert _fields(report.path).get(f"{arch}.attention.key_length") == key_length
    loaded = load_model(resolve_model(str(report.path)), progress=False)
    assert loaded.model.config.head_dim == model["head_dim"]
    source = AutoModelForCausalLM.from_pretrained(str(tmp_path / "model"), dtype=torch.float32).eval()
    ids = torch.tensor([[5, 17, 120, 33, 250, 9, 64, 199]])
    with torch.no_grad():
        assert (loaded.model(ids).logits - source(ids).logits).abs().max().item() < 1e-4


def test_a_gguf_whose_key_and_value_head_sizes_differ_is_refused_by_name(tmp_path):
    gguf = pytest.importorskip("gguf")
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    path = tmp_path / "kv.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen3")
    writer.add_block_count(1)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_key_length(16)
    writer.add_value_length(32)
    writer.add_context_length(128)  # the sizes llama.cpp requires, so the head sizes are what is refused
    writer.add_feed_forward_length(128)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tensor("token_embd.weight", np.zeros((10, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelSourceError, match="key head size of 16 and a value head size of 32 "
                                               r"\(qwen3.attention.key_length / value_length") as info:
        load_model(resolve_model(str(path)), progress=False)
    assert "same size" in info.value.fix


def test_an_untied_mqa_qwen3_of_square_heads_runs_in_llama_cpp_with_the_bundles_logits(tmp_path):
    """One KV head, an LM head of its own, 4 heads of 16 over a width of 64 (key_length 16 written, as
    llama.cpp's converter writes it, though its qwen3 loader would derive the same size): llama.cpp computes the
    bundle's logits."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install "
                                    "llama-cpp-python, which compiles llama.cpp for several minutes)")
    from edgesdk.evaluate import bundle_scorer
    from edgesdk.runtime.session import open_runtime

    bundle, report = _float_bundle_gguf(tmp_path, model_type="qwen3", kv_heads=1, head_dim=16, tie=False)
    fields = _fields(report.path)
    assert report.architecture == "qwen3"
    assert fields["qwen3.attention.key_length"] == 16
    runtime = open_runtime(bundle.path, threads=1)
    ids = runtime.tokenizer.encode(PROMPT, add_special_tokens=False)
    expected = bundle_scorer(runtime)(np.array(ids))
    model = llama_cpp.Llama(str(report.path), n_ctx=64, logits_all=True, n_threads=1, verbose=False)
    model.eval(ids)
    assert float(np.abs(np.array(model.scores[:len(ids)]) - expected).max()) < 1e-3
