"""LoRA adapters (edgesdk/models/lora.py) checked against PEFT's behaviour: review 49."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from edgesdk.models.lora import LoraAdapter, merge_adapters  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402
from tests.unit._lora_files41 import lora_forward_logits, random_factors  # noqa: E402

IDS = torch.tensor([[5, 17, 101, 3, 250, 42, 7, 99, 12, 1]])


def test_patterns_of_an_adapter_made_on_the_decoder_match_peft_s_module_names(tmp_path):
    """An adapter made on the decoder without its head (task_type FEATURE_EXTRACTION: PEFT wraps AutoModel, its keys
    ``base_model.model.layers.0...``) has rank_pattern / alpha_pattern keys PEFT matched against those names
    (``get_pattern_key(..., current_key)``); an anchored pattern must still pick its module when edgesdk finds it as
    ``model.layers.0...`` of the causal LM, or its alpha is silently the default."""
    from safetensors.torch import save_file

    model = tiny_llama(seed=3)
    factors = random_factors(model, targets=("q_proj",), rank=4)
    directory = tmp_path / "adapter"
    directory.mkdir()
    (directory / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "task_type": "FEATURE_EXTRACTION", "r": 4, "lora_alpha": 8,
         "alpha_pattern": {r"^layers\.0\.self_attn\.q_proj": 32}}))
    tensors = {}
    for name, (a, b) in factors.items():
        path = name.removeprefix("model.")
        tensors[f"base_model.model.{path}.lora_A.weight"] = a.contiguous()
        tensors[f"base_model.model.{path}.lora_B.weight"] = b.contiguous()
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    scaling = {name: (32 / 4 if name == "model.layers.0.self_attn.q_proj" else 8 / 4) for name in factors}
    expected = lora_forward_logits(model, IDS, factors, scaling)
    merge_adapters(model, [LoraAdapter(str(directory))], "llama")
    with torch.no_grad():
        merged = model(IDS).logits
    assert float((merged - expected).abs().max()) < 1e-3
