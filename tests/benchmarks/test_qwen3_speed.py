"""Qwen3-0.6B's shapes on this host: the bundle's decode speed against llama.cpp on the same weights.

No Qwen3 checkpoint can be fetched here, so the model has Qwen3-0.6B's configuration (28 layers,
width 1,024, 16 query heads and 8 KV heads of 128, FFN 3,072, a tied 151,936-token embedding) and
random weights: speed does not depend on the weights' values. It is built with the default recipe's
export (INT4 blocks of 64 everywhere, the tied embedding too) and no training stage, then exported
as GGUF (the same codes as Q4_0, so llama.cpp runs its own Q4_0 kernels on exactly these weights).
Greedy decode of 128 tokens after a 128-token prompt, 2 threads, engines alternating with a pause,
median of 3 after one untimed run each.

    pip install llama-cpp-python   # benchmarks only, never a runtime dependency
    python -m pytest tests/benchmarks/test_qwen3_speed.py -m benchmark -s
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest

from tests.benchmarks.llamacpp import LlamaCppEngine

pytestmark = pytest.mark.benchmark
llama_cpp = pytest.importorskip("llama_cpp")

THREADS, PROMPT, NEW, REPEATS = 2, 128, 128, 3
QWEN3_0_6B = {"vocab_size": 151_936, "hidden_size": 1_024, "intermediate_size": 3_072, "num_hidden_layers": 28,
              "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
              "rope_theta": 1_000_000.0, "max_position_embeddings": 40_960, "tie_word_embeddings": True}
RECIPE = ("name: qwen3-int4-ptq\nstages: []\n"
          "export: {form: ort-fused, weights: int4, block_size: 64, embedding_bits: 4}\n")


@pytest.fixture(scope="module")
def qwen3_bundle(tmp_path_factory):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from tests._utils.tiny import tiny_tokenizer

    root = tmp_path_factory.mktemp("qwen3")
    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen3", bos_token_id=1, eos_token_id=2, pad_token_id=0, **QWEN3_0_6B)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(root / "model", safe_serialization=True)
    tiny_tokenizer(320).save_pretrained(root / "model")  # the embedding's other rows are padding to llama.cpp
    del model
    (root / "recipe.yaml").write_text(RECIPE)
    started = time.perf_counter()
    bundle = build(BuildConfig(target="host", model=str(root / "model"), out=root / "b",
                               recipe=str(root / "recipe.yaml"), export=ExportConfig(max_context=1024),
                               progress=False))
    print(f"\nQwen3-0.6B shapes, int4 bundle built in {time.perf_counter() - started:.0f} s")
    return bundle


def test_decode_speed_of_qwen3_0_6b_shapes_against_llamacpp_on_the_same_weights(qwen3_bundle, tmp_path):
    from edgesdk.export.gguf_export import export_gguf
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.session import open_runtime

    report = export_gguf(qwen3_bundle.path, tmp_path / "qwen3.gguf")
    bundle_mb = sum(f["size"] for f in qwen3_bundle.manifest["files"].values()) / 1e6
    print(f"bundle {bundle_mb:.1f} MB; GGUF {report.size_bytes / 1e6:.1f} MB ({report.architecture}, "
          f"{report.tensor_types})")
    engine = LlamaCppEngine(report.path, THREADS, context=1024)
    runtime = open_runtime(qwen3_bundle.path, threads=THREADS)
    prompt = np.random.default_rng(0).integers(3, 320, PROMPT).tolist()

    def bundle_run():
        tokens, stats = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=NEW), stop_ids=set())
        assert len(tokens) == NEW
        return stats.prefill_tok_s, stats.decode_tok_s

    runners = {"llama.cpp (exported GGUF, Q4_0)": lambda: engine.time_generation(prompt, NEW),
               "edgesdk bundle (ONNX Runtime)": bundle_run}
    for run in runners.values():
        run()
    runs = {name: [] for name in runners}
    for _ in range(REPEATS):
        for name, run in runners.items():
            time.sleep(1)
            runs[name].append(run())
    base = statistics.median(r[1] for r in runs["llama.cpp (exported GGUF, Q4_0)"])
    print(f"\n{'engine':<34}{'prefill tok/s':>14}{'decode tok/s':>14}{'decode x llama.cpp':>20}")
    for name, values in runs.items():
        decode = statistics.median(v[1] for v in values)
        print(f"{name:<34}{statistics.median(v[0] for v in values):>14.1f}{decode:>14.1f}{decode / base:>20.2f}")
        print(f"{'':<34}decode runs: {', '.join(f'{v[1]:.1f}' for v in values)}")
