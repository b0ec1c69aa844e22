"""Qwen3 (RMSNorm on each query and key head before rotary): built, run and exported like the other decoders.

Tiny Qwen3 models here have a head size of 32 over a width of 64 (queries 128 wide), as Qwen3's configs
set the head size apart from width / heads, and query / key norm weights away from ones so that a norm
left out, swapped or applied after rotary changes the logits. The export graphs' numerics against
PyTorch are in test_export.py, test_fused_export.py and test_qdq_export.py (their qwen3 cases).
"""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import BuildError, ExportError
from tests._utils.builds import JETSON_RECIPE, build_tiny_bundle
from tests._utils.tiny import save_tiny_model_dir

torch = pytest.importorskip("torch")

QWEN3 = {"model_type": "qwen3", "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 32, "intermediate": 128}
FUSED_FP32 = "name: fused\nstages: []\nexport: {form: ort-fused, weights: fp32, block_size: 32}\n"
PROMPT = "The quick brown fox jumps over the lazy dog. Edge boards run small language models."


def _qwen3_dir(tmp_path, **overrides):
    return save_tiny_model_dir(tmp_path / "model", **{**QWEN3, **overrides})


def _source(tmp_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tmp_path / "model"), dtype=torch.float32).eval()


def test_the_loader_takes_qwen3_and_its_head_size(tmp_path):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    loaded = load_model(resolve_model(str(_qwen3_dir(tmp_path))), progress=False)
    assert loaded.facts()["architecture"] == "qwen3"
    assert loaded.model.config.head_dim == 32
    assert loaded.model.model.layers[0].self_attn.q_proj.out_features == 128


def test_a_pruned_and_depth_pruned_qwen3_build_validates_against_pytorch(tmp_path):
    """GQA groups, FFN channels and a whole layer removed: the bundle's graph still computes the pruned
    PyTorch model's logits (the build's own validation), with the query / key norms kept per layer."""
    recipe = ("name: pruned\nstages:\n  - stage: prune\n    config: {ffn_ratio: 0.3, kv_group_ratio: 0.5, "
              "layers_removed: 1, calibration_batches: 2, batch_size: 2, sequence_length: 24, "
              "layer_calibration_batches: 1}\nexport: {form: ort-fused, weights: int8, block_size: 32}\n")
    bundle = build_tiny_bundle(tmp_path, recipe, "host", model_dir=_qwen3_dir(tmp_path, layers=3))
    after = bundle.manifest["model"]["after"]
    assert after["architecture"] == "qwen3"
    assert after["layers"] == 2  # the build refuses a bundle whose graph differs from the PyTorch model


def test_a_block_sparse_qwen3_bundle_runs_the_kernels_twins_like_pytorch(tmp_path):
    """The jetson recipe's block-sparse weights run through the sparse decoder (its PyTorch twins here), which
    must normalise each query and key head as the model does; the build validates it against PyTorch."""
    bundle = build_tiny_bundle(tmp_path, JETSON_RECIPE, "orin-nx", model_dir=_qwen3_dir(tmp_path),
                               generated_sequences=0)
    from safetensors.numpy import load_file

    tensors = load_file(str(bundle.path / bundle.manifest["sparse"]["weights"]))
    assert tensors["layers.0.q_norm"].shape == tensors["layers.0.k_norm"].shape == (32,)


def test_the_power_recipe_is_refused_before_any_stage(tmp_path):
    recipe = "name: power\nstages:\n  - stage: power\nexport: {form: ort-fused, weights: fp32}\n"
    with pytest.raises(BuildError, match="Qwen3 normalises per head"):
        build_tiny_bundle(tmp_path, recipe, "host", model_dir=_qwen3_dir(tmp_path))
    assert not (tmp_path / "b.build").exists()  # refused before any stage: nothing to resume


def _gguf_of_float_bundle(tmp_path):
    from edgesdk.export.gguf_export import export_gguf

    bundle = build_tiny_bundle(tmp_path, FUSED_FP32, "host", model_dir=_qwen3_dir(tmp_path))
    return bundle, export_gguf(bundle.path, tmp_path / "model.gguf")


def test_a_float_qwen3_bundle_exports_as_gguf_qwen3_and_loads_back_with_the_source_logits(tmp_path):
    """The GGUF file (architecture qwen3, its head size and per-head norms written) read back through
    edgesdk's own GGUF loader gives the source model's logits: the norms, the head size and the
    half-rotation row order all survive."""
    from gguf import GGUFReader

    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    _, report = _gguf_of_float_bundle(tmp_path)
    assert report.architecture == "qwen3"
    reader = GGUFReader(str(report.path))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    assert fields["qwen3.attention.key_length"] == 32
    names = {tensor.name for tensor in reader.tensors}
    assert {"blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight", "blk.1.attn_k_norm.weight"} <= names
    loaded = load_model(resolve_model(str(report.path)), progress=False)
    assert loaded.model.config.head_dim == 32  # transformers' Qwen3 GGUF mapping alone would give 128
    ids = torch.tensor([[5, 17, 120, 33, 250, 9, 64, 199, 3, 77]])
    with torch.no_grad():
        diff = (loaded.model(ids).logits - _source(tmp_path)(ids).logits).abs().max().item()
    assert diff < 1e-4


def test_a_float_qwen3_gguf_runs_in_llama_cpp_with_the_bundles_logits(tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install "
                                    "llama-cpp-python, which compiles llama.cpp for several minutes)")
    from edgesdk.evaluate import bundle_scorer
    from edgesdk.runtime.session import open_runtime

    bundle, report = _gguf_of_float_bundle(tmp_path)
    runtime = open_runtime(bundle.path, threads=1)
    ids = runtime.tokenizer.encode(PROMPT, add_special_tokens=False)
    expected = bundle_scorer(runtime)(np.array(ids))
    model = llama_cpp.Llama(str(report.path), n_ctx=64, logits_all=True, n_threads=1, verbose=False)
    model.eval(ids)
    diff = float(np.abs(np.array(model.scores[:len(ids)]) - expected).max())
    assert diff < 1e-3


def test_a_qwen3_bundle_pruned_to_uneven_layers_is_refused_for_gguf(tmp_path):
    from edgesdk.export.gguf_export import export_gguf

    recipe = ("name: pruned\nstages:\n  - stage: prune\n    config: {ffn_ratio: 0.4, kv_group_ratio: 0.5, "
              "calibration_batches: 2, batch_size: 2, sequence_length: 24}\n"
              "export: {form: ort-fused, weights: fp32, block_size: 32}\n")
    model_dir = _qwen3_dir(tmp_path, hidden=128, heads=8, kv_heads=4, intermediate=256, layers=3)
    bundle = build_tiny_bundle(tmp_path, recipe, "host", model_dir=model_dir)
    with pytest.raises(ExportError, match="deci\\) has no query / key norms"):
        export_gguf(bundle.path, tmp_path / "model.gguf")
    assert not (tmp_path / "model.gguf").exists()
