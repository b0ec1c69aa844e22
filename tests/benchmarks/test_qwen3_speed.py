"""Qwen3-0.6B's shapes on this host: the bundle's decode speed against llama.cpp on the same weights.

The model has Qwen3-0.6B's configuration (28 layers, width 1,024, 16 query heads and 8 KV heads of 128,
FFN 3,072, a tied 151,936-token embedding) and random weights (tests/benchmarks/random_shapes.py). It is
built with the default recipe's export (INT4 blocks of 64 everywhere, the tied embedding too). Greedy
decode of 128 tokens after a 128-token prompt, 2 threads.

    pip install llama-cpp-python   # benchmarks only, never a runtime dependency
    python -m pytest tests/benchmarks/test_qwen3_speed.py -m benchmark -s
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.benchmark
pytest.importorskip("llama_cpp")

QWEN3_0_6B = {"vocab_size": 151_936, "hidden_size": 1_024, "intermediate_size": 3_072, "num_hidden_layers": 28,
              "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
              "rope_theta": 1_000_000.0, "max_position_embeddings": 40_960, "tie_word_embeddings": True}
RECIPE = ("name: qwen3-int4-ptq\nstages: []\n"
          "export: {form: ort-fused, weights: int4, block_size: 64, embedding_bits: 4}\n")


def test_decode_speed_of_qwen3_0_6b_shapes_against_llamacpp_on_the_same_weights(tmp_path):
    from tests._utils.tiny import tiny_tokenizer
    from tests.benchmarks.random_shapes import build_random_bundle, compare_decode_with_llamacpp

    bundle = build_random_bundle(tmp_path, "qwen3", QWEN3_0_6B, tiny_tokenizer(320), RECIPE, max_context=1024)
    compare_decode_with_llamacpp(bundle, tmp_path / "qwen3.gguf", vocab_in_use=320, max_context=1024)
