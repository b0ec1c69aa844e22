"""GGUF LoRA adapters for a SmolLM3 base: llama.cpp's convert_lora_to_gguf.py writes ``general.architecture
smollm3`` and, as ``SmolLM3Model(LlamaModel)`` inherits ``LlamaModel.permute``, the rows of attn_q / attn_k's
``lora_b`` in llama.cpp's pairwise rotary order. The merge puts them back and equals the PEFT merge of the same
factors; tests/unit/test_smollm3_gguf42.py checks the merged model against llama.cpp applying the adapter."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")

from edgesdk.errors import ModelSourceError  # noqa: E402
from edgesdk.models.lora import LoraAdapter, gguf_architecture, merge_adapters  # noqa: E402
from tests._utils.tiny import save_tiny_model_dir  # noqa: E402
from tests.unit._lora_files41 import random_factors, write_gguf_adapter, write_peft  # noqa: E402
from tests.unit.test_lora_gguf41 import _gguf_pairs  # noqa: E402

SMOLLM3 = {"model_type": "smollm3", "hidden": 64, "heads": 4, "kv_heads": 2, "intermediate": 128, "layers": 4}
IDS = torch.tensor([[5, 17, 101, 3, 250, 42, 7, 99]])


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return save_tiny_model_dir(tmp_path_factory.mktemp("smollm3-lora") / "model", **SMOLLM3)


def _load(path):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    source = resolve_model(str(path))
    return load_model(source, progress=False).model, source


def test_a_smollm3_gguf_adapter_merges_as_the_peft_adapter_of_the_same_factors(base_dir, tmp_path):
    model, source = _load(base_dir)
    architecture = gguf_architecture(source, model)  # what the build passes (edgesdk/build/pipeline.py)
    assert architecture == "smollm3"
    factors = random_factors(model, rank=4)
    peft = write_peft(tmp_path / "peft", factors, {"r": 4, "lora_alpha": 8})
    adapter = write_gguf_adapter(tmp_path / "adapter.gguf", "smollm3", _gguf_pairs(model, factors), alpha=8)
    with torch.no_grad():
        base_logits = model(IDS).logits
    records = merge_adapters(model, [LoraAdapter(str(adapter), 0.75)], architecture)
    reference, _ = _load(base_dir)
    merge_adapters(reference, [LoraAdapter(str(peft), 0.75)], architecture)
    with torch.no_grad():
        merged, expected = model(IDS).logits, reference(IDS).logits
    assert float((expected - base_logits).abs().max()) > 1.0
    assert float((merged - expected).abs().max()) < 1e-3
    for name, parameter in reference.state_dict().items():  # q_proj / k_proj included: their rows put back
        assert torch.allclose(model.state_dict()[name], parameter, atol=1e-5), name
    assert records[0]["form"] == "gguf"
    assert records[0]["modules"] == 28


def test_an_adapter_for_another_architecture_is_refused_against_a_smollm3_base(base_dir, tmp_path):
    model, source = _load(base_dir)
    pairs = _gguf_pairs(model, random_factors(model, targets=("q_proj",), rank=2))
    adapter = write_gguf_adapter(tmp_path / "llama.gguf", "llama", pairs, alpha=4)
    with pytest.raises(ModelSourceError, match="the adapter's architecture is 'llama' \\(general.architecture\\), "
                                               "the base model's is 'smollm3'"):
        merge_adapters(model, [LoraAdapter(str(adapter))], gguf_architecture(source, model))
