"""Gemma 3 270M's shapes on this host (what anchors-mission.md names for a Pi 5): the bundle's decode speed
against llama.cpp on the same weights.

The model has gemma-3-270m's configuration (18 layers, width 640, 4 query heads and 1 KV head of 256, FFN
2,048, a tied 262,144-token embedding, a window of 512 on five layers of six) and random weights
(tests/benchmarks/random_shapes.py). It is built with the default recipe's export (INT4 blocks of 64
everywhere, the tied embedding too, which is 168M of the 268M parameters). Greedy decode of 128 tokens
after a 128-token prompt, 2 threads.

    pip install llama-cpp-python   # benchmarks only, never a runtime dependency
    python -m pytest tests/benchmarks/test_gemma3_speed.py -m benchmark -s
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.benchmark
pytest.importorskip("llama_cpp")

GEMMA3_270M = {"vocab_size": 262_144, "hidden_size": 640, "intermediate_size": 2_048, "num_hidden_layers": 18,
               "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "query_pre_attn_scalar": 256,
               "sliding_window": 512, "rms_norm_eps": 1e-6, "max_position_embeddings": 32_768,
               "tie_word_embeddings": True}
RECIPE = ("name: gemma3-int4-ptq\nstages: []\n"
          "export: {form: ort-fused, weights: int4, block_size: 64, embedding_bits: 4}\n")


def test_decode_speed_of_gemma3_270m_shapes_against_llamacpp_on_the_same_weights(tmp_path):
    from tests._utils.tiny import tiny_gemma_tokenizer
    from tests.benchmarks.random_shapes import build_random_bundle, compare_decode_with_llamacpp

    bundle = build_random_bundle(tmp_path, "gemma3_text", GEMMA3_270M, tiny_gemma_tokenizer(), RECIPE,
                                 max_context=1024)
    compare_decode_with_llamacpp(bundle, tmp_path / "gemma3.gguf", vocab_in_use=384, max_context=1024)
