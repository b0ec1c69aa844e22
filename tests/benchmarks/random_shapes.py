"""A published model's shapes with random weights, timed against llama.cpp on the same weights.

No checkpoint can be fetched on the build host, but decode speed does not depend on the weights' values:
a model with the real configuration and random weights is built into a bundle with no training stage,
exported as GGUF (the bundle's own codes as Q4_0 / Q8_0, so llama.cpp runs its own kernels on exactly
these weights), and both engines generate greedily, alternating with a pause, median of the repeats
after one untimed run each.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from tests.benchmarks.llamacpp import LlamaCppEngine, alternated

THREADS, PROMPT, NEW, REPEATS = 2, 128, 128, 3
LLAMA_CPP = "llama.cpp (exported GGUF, Q4_0)"
EDGESDK = "edgesdk bundle (ONNX Runtime)"


def build_random_bundle(root: Path, model_type: str, shapes: dict, tokenizer, recipe: str, max_context: int):
    """A bundle of ``recipe`` built from a ``model_type`` model of ``shapes`` with random weights (seed 0);
    ``tokenizer`` fills the first rows of the vocabulary, the rest are padding to llama.cpp."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, bos_token_id=2, eos_token_id=1, pad_token_id=0, **shapes)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(root / "model", safe_serialization=True)
    tokenizer.save_pretrained(root / "model")
    del model
    (root / "recipe.yaml").write_text(recipe)
    started = time.perf_counter()
    bundle = build(BuildConfig(target="host", model=str(root / "model"), out=root / "b",
                               recipe=str(root / "recipe.yaml"), export=ExportConfig(max_context=max_context),
                               progress=False))
    print(f"\n{model_type} bundle built in {time.perf_counter() - started:.0f} s")
    return bundle


def compare_decode_with_llamacpp(bundle, gguf_out: Path, vocab_in_use: int, max_context: int) -> dict[str, float]:
    """Print and return each engine's median decode tok/s over ``PROMPT`` random ids below ``vocab_in_use``."""
    from edgesdk.export.gguf_export import export_gguf
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.session import open_runtime

    report = export_gguf(bundle.path, gguf_out)
    bundle_mb = sum(f["size"] for f in bundle.manifest["files"].values()) / 1e6
    print(f"bundle {bundle_mb:.1f} MB; GGUF {report.size_bytes / 1e6:.1f} MB ({report.architecture}, "
          f"{report.tensor_types})")
    engine = LlamaCppEngine(report.path, THREADS, context=max_context)
    runtime = open_runtime(bundle.path, threads=THREADS)
    prompt = np.random.default_rng(0).integers(7, vocab_in_use, PROMPT).tolist()

    def bundle_run():
        tokens, stats = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=NEW), stop_ids=set())
        assert len(tokens) == NEW
        return stats.prefill_tok_s, stats.decode_tok_s

    runs = alternated({LLAMA_CPP: lambda: engine.time_generation(prompt, NEW), EDGESDK: bundle_run}, REPEATS)
    base = statistics.median(r[1] for r in runs[LLAMA_CPP])
    print(f"\n{'engine':<34}{'prefill tok/s':>14}{'decode tok/s':>14}{'decode x llama.cpp':>20}")
    medians = {}
    for name, values in runs.items():
        medians[name] = statistics.median(v[1] for v in values)
        print(f"{name:<34}{statistics.median(v[0] for v in values):>14.1f}{medians[name]:>14.1f}"
              f"{medians[name] / base:>20.2f}")
        print(f"{'':<34}decode runs: {', '.join(f'{v[1]:.1f}' for v in values)}")
    return medians
