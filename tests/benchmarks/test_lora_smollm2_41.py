"""SmolLM2-135M with a random rank-8 LoRA adapter on every linear of every layer (210 modules; 9 query heads over 3
key/value heads, so the GGUF adapter's q/k rows are in llama.cpp's rotary order): ``edgesdk build --lora`` of the
PEFT directory and of the GGUF adapter of the same factors, against llama.cpp applying the GGUF adapter at run time
(``--lora-scaled``) to the uncompressed bundle exported as an F32 GGUF, with a float32 KV cache.

    EDGESDK_BENCH_FP32_BUNDLE=DIR python -m pytest tests/benchmarks/test_lora_smollm2_41.py -m benchmark -s
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llama_cpp", reason="llama-cpp-python is the reference")

pytestmark = pytest.mark.benchmark

SCALE = 0.5
IDS = [1, 504, 3458, 282, 4649, 314, 7042, 30, 378, 3458, 282, 4649, 314, 1122, 28, 1133]


def _llama_cpp_logits(base, adapter, tmp_path) -> np.ndarray:
    from tests.benchmarks.test_lora_llama_cpp41 import _CHILD

    out = tmp_path / "llama.npy"
    request = {"path": str(base), "lora": None if adapter is None else str(adapter), "scale": SCALE, "ids": IDS,
               "out": str(out)}
    child = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(request), capture_output=True, text=True)
    assert child.returncode == 0, child.stderr[-3000:]
    return np.load(out)


def test_a_build_with_the_adapter_computes_what_llama_cpp_computes_with_it(smollm2_fp32_bundle, tmp_path):
    from click.testing import CliRunner

    from edgesdk.cli import main
    from edgesdk.export.gguf_export import export_gguf
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model
    from edgesdk.runtime.session import open_runtime
    from tests.unit._lora_files41 import random_factors, write_gguf_adapter, write_peft
    from tests.unit.test_lora_gguf41 import _gguf_pairs

    source = smollm2_fp32_bundle.manifest["model"]["before"]["source"]
    model = load_model(resolve_model(source), progress=False).model
    # A scaled down so that the update (about 3 % of the weights' spread) moves the logits without wrecking them
    factors = {name: (a * 0.05, b) for name, (a, b) in random_factors(model, rank=8, seed=7).items()}
    peft = write_peft(tmp_path / "peft", factors, {"r": 8, "lora_alpha": 16})
    adapter = write_gguf_adapter(tmp_path / "adapter.gguf", "llama", _gguf_pairs(model, factors), alpha=16)
    del model
    ours = {}
    for name, given in (("peft", peft), ("gguf", adapter)):
        built = CliRunner().invoke(main, ["build", "--target", "rpi5", "--recipe", "fp32-fused", "--model", source,
                                          "--lora-scaled", str(given), str(SCALE), "--out", str(tmp_path / f"bundle-{name}"),
                                          "--no-progress"], prog_name="edgesdk")
        assert built.exit_code == 0, built.output
        runtime = open_runtime(tmp_path / f"bundle-{name}", threads=2)
        ours[name] = runtime.backend.prefill(np.asarray(IDS, np.int64), keep_logits=len(IDS)).reshape(len(IDS), -1)
        del runtime
    base = export_gguf(smollm2_fp32_bundle.path, tmp_path / "base.gguf").path
    plain, adapted = _llama_cpp_logits(base, None, tmp_path), _llama_cpp_logits(base, adapter, tmp_path)
    moved = float(np.abs(adapted - plain).max())
    apart = float(np.abs(ours["peft"] - adapted).max())
    print(f"\nllama.cpp with the adapter vs without: max |logit diff| {moved:.3f}; edgesdk's PEFT build vs llama.cpp "
          f"with the GGUF adapter: {apart:.2e}; the GGUF build vs the PEFT build: "
          f"{float(np.abs(ours['gguf'] - ours['peft']).max()):.2e}; same top token at "
          f"{float((ours['peft'].argmax(-1) == adapted.argmax(-1)).mean()):.0%} of {len(IDS)} positions")
    assert moved > 1.0
    assert apart < 1e-3
    assert float(np.abs(ours["gguf"] - ours["peft"]).max()) < 1e-4
