"""Review 61c: a PEFT adapter's lora_embedding_A / B factors of an embedding its target_modules / layers_to_transform
leave out are not merged, as PEFT does not load them (they were merged while linear factors were left out), and are
named as those are; the build logs the modules left out as its own line (build_bundle's caller reads them as it
reads the build's other notes) instead of a Python warning beside it."""

from __future__ import annotations

import json
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

import edgesdk  # noqa: E402
from edgesdk.errors import ModelSourceError  # noqa: E402
from edgesdk.models.lora import LoraAdapter, LoraMergeNote, _peft_targets, merge_adapters  # noqa: E402
from tests._utils.tiny import save_tiny_model_dir, tiny_llama  # noqa: E402
from tests.unit._lora_files41 import random_factors, write_peft  # noqa: E402

EMBEDDING = "model.embed_tokens"


def _embedding_factors(model, rank: int = 2) -> dict:
    generator = torch.Generator().manual_seed(4)
    rows, width = model.model.embed_tokens.weight.shape
    return {EMBEDDING: (torch.randn(rank, rows, generator=generator), torch.randn(width, rank, generator=generator))}


@pytest.mark.parametrize("selection", [
    {"target_modules": ["q_proj"]},
    {"target_modules": "all-linear"},  # _maybe_include_all_linear_layers names linear layers only
    {"target_modules": r".*\.q_proj"},
    {"target_modules": ["q_proj", "embed_tokens"], "layers_to_transform": [0, 1]},  # no layer index: not adapted
    {"target_modules": ["q_proj", "embed_tokens"], "exclude_modules": ["embed_tokens"]},
])
def test_embedding_factors_of_an_embedding_the_config_leaves_out_are_not_merged(tmp_path, selection):
    """PEFT's check_target_module_exists decides for an nn.Embedding as for an nn.Linear: lora_embedding_A / B of
    one it does not select are unexpected keys set_peft_model_state_dict drops. edgesdk merged them."""
    model = tiny_llama(seed=5)
    factors = random_factors(model, targets=("q_proj",), rank=2)
    embedding = _embedding_factors(model)
    adapter = write_peft(tmp_path / "adapter", factors, {"r": 2, "lora_alpha": 4, **selection}, embedding=embedding)
    table = model.model.embed_tokens.weight.detach().clone()
    head = model.lm_head.weight
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (record,) = merge_adapters(model, [LoraAdapter(str(adapter))], "llama")
    assert record["ignored"] == [EMBEDDING]
    assert record["modules"] == len(factors)
    assert torch.equal(model.model.embed_tokens.weight, table)
    assert model.lm_head.weight is head  # nothing touched the tied embedding: not untied
    (note,) = [item for item in caught if issubclass(item.category, LoraMergeNote)]
    assert f"LoRA factors of 1 module(s) its adapter_config.json leaves out ({EMBEDDING}; " in str(note.message)
    modules = dict(tiny_llama(seed=5).named_modules())
    for name, (a, b) in factors.items():
        assert torch.allclose(dict(model.named_modules())[name].weight, modules[name].weight + 2.0 * (b @ a),
                              atol=1e-6), name


def test_embedding_factors_of_an_embedding_the_config_names_are_merged(tmp_path):
    model = tiny_llama(seed=5)
    embedding = _embedding_factors(model)
    (a, b), = embedding.values()
    table = model.model.embed_tokens.weight.detach().clone()
    adapter = write_peft(tmp_path / "adapter", {}, {"r": 2, "lora_alpha": 4}, embedding=embedding)
    assert json.loads((adapter / "adapter_config.json").read_text())["target_modules"] == ["embed_tokens"]
    (record,) = merge_adapters(model, [LoraAdapter(str(adapter))], "llama")
    assert "ignored" not in record
    assert torch.allclose(model.model.embed_tokens.weight, table + 2.0 * (a.T @ b.T), atol=1e-6)
    assert _peft_targets({"target_modules": "all-linear"}, model, EMBEDDING) is False


def test_an_adapter_of_only_an_embedding_the_config_leaves_out_is_refused(tmp_path):
    model = tiny_llama(seed=5)
    adapter = write_peft(tmp_path / "adapter", {}, {"r": 2, "target_modules": ["q_proj", "v_proj"]},
                         embedding=_embedding_factors(model))
    with pytest.raises(ModelSourceError) as refused:
        merge_adapters(model, [LoraAdapter(str(adapter))], "llama")
    assert f"holds LoRA factors only of modules its adapter_config.json leaves out ({EMBEDDING}; target_modules " \
           '["q_proj", "v_proj"])' in refused.value.problem
    assert "correct target_modules / layers_to_transform" in refused.value.fix


def test_the_build_logs_the_modules_left_out_as_its_own_line(tmp_path, capfd):
    """build_bundle() and edgesdk build report the build's notes as ``edgesdk build:`` lines on stderr (the model's
    sampling and unapplied-module warnings too): the modules left out are one such line, and the merge's Python
    warning is not printed beside it."""
    from transformers import AutoModelForCausalLM

    model_dir = save_tiny_model_dir(tmp_path / "model", hidden=64, heads=4, kv_heads=2)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    factors = random_factors(base, targets=("q_proj", "v_proj", "up_proj"), rank=2)
    adapter = write_peft(tmp_path / "adapter", factors, {"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]},
                         embedding=_embedding_factors(base))
    left_out = sorted([*(name for name in factors if not name.endswith("q_proj")), EMBEDDING])
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = edgesdk.build_bundle("host", str(model_dir), out=tmp_path / "b", recipe="fp32-standard",
                                   max_context=64, progress=False, lora=adapter)
    assert not [item for item in caught if issubclass(item.category, LoraMergeNote)]
    (record,) = json.loads((out / "manifest.json").read_text())["model"]["before"]["adapters"]
    assert record["ignored"] == left_out
    assert record["modules"] == 2
    lines = [line for line in capfd.readouterr().err.splitlines() if "are not merged" in line]
    assert lines == [
        f"edgesdk build:   warning: {len(left_out)} module(s) whose LoRA factors {adapter.resolve()} holds are not "
        "merged: its adapter_config.json's target_modules / layers_to_transform / exclude_modules leave them out, and "
        f"PEFT does not load them ({', '.join(left_out[:3])} and {len(left_out) - 3} more; the manifest records "
        "them all)"]
