"""Review tests of depth pruning and of the GGUF export of pruned layers (deci)."""

from __future__ import annotations

import numpy as np
import pytest

from tests._utils.builds import build_tiny_bundle
from tests._utils.tiny import save_tiny_model_dir

torch = pytest.importorskip("torch")

PROMPT = "The quick brown fox jumps over the lazy dog. Edge boards run small language models."


def _llama_cpp_logits(path, ids):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    model = llama_cpp.Llama(str(path), n_ctx=64, logits_all=True, n_threads=1, verbose=False)
    model.eval(ids)
    return np.array(model.scores[:len(ids)])


def test_a_qwen2_bundle_with_narrower_attention_in_every_layer_runs_in_llama_cpp(tmp_path):
    """Removing one of two GQA groups from each layer leaves uniform layers whose query heads span less than
    the model width; llama.cpp's qwen2 loader sizes the query projection as the width and refused the file
    ('attn_q.weight has wrong shape'). It is written as deci, which sizes it by the heads."""
    pytest.importorskip("gguf")
    from edgesdk.evaluate import bundle_scorer
    from edgesdk.export.gguf_export import export_gguf
    from edgesdk.runtime.session import open_runtime

    model_dir = save_tiny_model_dir(tmp_path / "model", hidden=64, heads=4, kv_heads=2, intermediate=128, layers=2,
                                    model_type="qwen2")
    recipe = ("name: narrow\nstages:\n  - stage: prune\n    config: {ffn_ratio: 0.0, kv_group_ratio: 0.5, "
              "calibration_batches: 2, batch_size: 2, sequence_length: 24}\n"
              "export: {form: ort-fused, weights: fp32}\n")
    bundle = build_tiny_bundle(tmp_path, recipe, "host", model_dir=model_dir)
    assert bundle.manifest["model"]["after"]["attention_heads"] == 2  # 2 x 16 = 32 of the width 64, every layer
    report = export_gguf(bundle.path, tmp_path / "narrow.gguf")
    runtime = open_runtime(bundle.path, threads=1)
    ids = runtime.tokenizer.encode(PROMPT, add_special_tokens=False)
    expected = bundle_scorer(runtime)(np.array(ids))
    got = _llama_cpp_logits(report.path, ids)
    assert report.architecture == "deci"
    assert float(np.abs(got - expected).max()) < 1e-3
