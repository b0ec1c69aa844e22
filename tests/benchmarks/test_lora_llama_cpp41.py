"""llama.cpp applying a GGUF LoRA adapter at run time (``Llama(model_path=base, lora_path=adapter)``, llama.cpp's
``--lora`` / ``--lora-scaled``) against edgesdk's build-time merge of the same adapter into the same float32 base:
the logits agree. llama.cpp runs in a child process with plain CPU weight buffers (tests/_utils/gguf_files.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install llama-cpp-python)")

pytestmark = pytest.mark.benchmark

IDS = [1, 5, 17, 101, 3, 250, 42, 7, 99, 12]


def _llama_cpp_logits(base: Path, adapter: Path | None, scale: float) -> np.ndarray:
    """llama.cpp's logits for IDS, the adapter applied at ``scale``, with a float32 KV cache: llama.cpp's default
    F16 cache rounds the values the adapter enlarges."""
    from tests._utils.gguf_files import llama_cpp_child

    return llama_cpp_child(base, IDS, lora=adapter, lora_scale=scale, f32_cache=True)[0]


@pytest.mark.parametrize("alpha", [8.0, None])
def test_llama_cpp_with_the_adapter_computes_the_merged_model(tmp_path, alpha):
    from edgesdk.export.gguf_export import export_gguf
    from edgesdk.models.loader import load_model
    from edgesdk.models.lora import LoraAdapter, merge_adapters
    from edgesdk.models.sources import resolve_model
    from tests._utils.builds import build_tiny_bundle
    from tests._utils.tiny import save_tiny_model_dir
    from tests.unit._lora_files41 import random_factors, write_gguf_adapter
    from tests.unit.test_lora_gguf41 import FUSED_FP32, _gguf_pairs

    # untied: llama.cpp reads a tied model's output layer as token_embd.weight and applies a token_embd adapter to
    # it as to a linear layer, whose shapes do not fit (GGML_ASSERT in ggml_mul_mat)
    model_dir = save_tiny_model_dir(tmp_path / "model", hidden=64, heads=4, kv_heads=2, intermediate=128, tie=False)
    bundle = build_tiny_bundle(tmp_path, FUSED_FP32, "host", model_dir=model_dir)
    base = export_gguf(bundle.path, tmp_path / "base.gguf").path
    model = load_model(resolve_model(str(base)), progress=False).model
    generator = torch.Generator().manual_seed(4)
    embedding = (torch.randn(4, 320, generator=generator) * 0.3, torch.randn(64, 4, generator=generator) * 0.3)
    pairs = _gguf_pairs(model, random_factors(model, rank=4), embedding)
    pairs["output.weight"] = (np.asarray(torch.randn(4, 64, generator=generator) * 0.3),
                              np.asarray(torch.randn(320, 4, generator=generator) * 0.3))
    adapter = write_gguf_adapter(tmp_path / "adapter.gguf", "llama", pairs, alpha=alpha)
    with torch.no_grad():
        unmerged = model(torch.tensor([IDS])).logits[0].numpy()
    merge_adapters(model, [LoraAdapter(str(adapter), 0.5)], "llama")
    with torch.no_grad():
        merged = model(torch.tensor([IDS])).logits[0].numpy()
    plain = _llama_cpp_logits(base, None, 1.0)
    adapted = _llama_cpp_logits(base, adapter, 0.5)
    assert float(np.abs(adapted - plain).max()) > 1.0  # the adapter changes llama.cpp's answer
    assert float(np.abs(plain - unmerged).max()) < 1e-4
    assert float(np.abs(adapted - merged).max()) < 1e-4
