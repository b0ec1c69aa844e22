"""Review 61b: an adapter_config.json whose module selections or bias have the wrong type is refused by name before
the model loads (modules_to_save 5 stopped the merge with a bare TypeError); a GGUF LoRA pair on a norm the model has
is refused as such, not as a tensor the model lacks; and the factors of modules a PEFT adapter's target_modules /
layers_to_transform / exclude_modules leave out are not merged, as PEFT does not load them, and are named."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("gguf")

from edgesdk.errors import ModelSourceError  # noqa: E402
from edgesdk.models.lora import LoraAdapter, _peft_targets, check_adapter, merge_adapters  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402
from tests.unit._lora_files41 import random_factors, write_gguf_adapter, write_peft  # noqa: E402

CONFIG = "adapter_config.json"


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("modules_to_save", 5, "expected a list of module names"),
    ("modules_to_save", ["lm_head", 3], "expected a list of module names"),
    ("target_modules", 5, "expected a list of module names"),
    ("target_modules", {"q_proj": 1}, "expected a list of module names"),
    ("target_modules", "q_proj(", "which is not a regular expression"),
    ("exclude_modules", 7, "expected a list of module names"),
    ("layers_pattern", True, "expected a list of module names"),
    ("layers_to_transform", "0", "expected a layer index, a list of layer indices"),
    ("layers_to_transform", [0, "1"], "expected a layer index, a list of layer indices"),
    ("layers_to_transform", True, "expected a layer index, a list of layer indices"),
    ("bias", 5, 'expected one of "none", "all", "lora_only"'),
    ("bias", None, 'expected one of "none", "all", "lora_only"'),
])
def test_a_module_selection_of_the_wrong_type_is_refused_before_the_model_loads(tmp_path, field, value, expected):
    """check_adapter (run before the base model is fetched) passed these configs; modules_to_save 5 then stopped the
    merge with TypeError: 'int' object is not iterable, and the others were read as some other selection."""
    factors = random_factors(tiny_llama(seed=3), targets=("q_proj",), rank=2)
    adapter = write_peft(tmp_path / "adapter", factors, {"r": 2, field: value})
    with pytest.raises(ModelSourceError) as refused:
        check_adapter(LoraAdapter(str(adapter)))
    shown = json.dumps(value)
    assert refused.value.problem.startswith(f"--lora {adapter}: {CONFIG} gives {field} {shown}")
    assert expected in refused.value.problem
    assert f"correct {field} in {CONFIG}" in refused.value.fix


def test_modules_to_save_of_the_wrong_type_is_refused_by_the_merge_not_with_a_type_error(tmp_path):
    """The reviewer's case: a saved whole module (model.norm.weight) beside the factors and modules_to_save 5."""
    factors = random_factors(tiny_llama(seed=3), targets=("q_proj",), rank=2)
    adapter = write_peft(tmp_path / "adapter", factors, {"r": 2, "modules_to_save": 5},
                         extra={"base_model.model.model.norm.weight": torch.randn(64)})
    with pytest.raises(ModelSourceError) as refused:
        merge_adapters(tiny_llama(seed=3), [LoraAdapter(str(adapter))], "llama")
    assert "modules_to_save 5, expected a list of module names (e.g. [\"lm_head\"]), a string or null" \
        in refused.value.problem
    fine = write_peft(tmp_path / "fine", factors, {"r": 2, "modules_to_save": "norm", "bias": "none",
                                                   "layers_to_transform": None, "target_modules": "all-linear"},
                      extra={"base_model.model.model.norm.weight": torch.randn(64)})
    (record,) = merge_adapters(tiny_llama(seed=3), [LoraAdapter(str(fine))], "llama")
    assert record["replaced"] == ["model.norm.weight"]
    assert record["modules"] == 2


def test_a_gguf_pair_on_a_norm_is_refused_as_a_layer_no_lora_merges_into(tmp_path):
    """blk.0.attn_norm.weight is the model's model.layers.0.input_layernorm: it was refused as a tensor 'which the
    base model does not have' (the lookup held only linear and embedding layers), pointing at the wrong base model.
    llama.cpp finds the tensor and refuses the pair's shape; the refusal now says what the layer is."""
    adapter = write_gguf_adapter(tmp_path / "norm.gguf", "llama", {
        "blk.0.attn_norm.weight": (np.ones((2, 64), np.float32), np.ones((64, 2), np.float32))}, alpha=4)
    with pytest.raises(ModelSourceError) as refused:
        merge_adapters(tiny_llama(seed=3), [LoraAdapter(str(adapter))], "llama")
    problem = refused.value.problem
    assert "adapts blk.0.attn_norm.weight, which the base model has (model.layers.0.input_layernorm, a " \
           "LlamaRMSNorm of weight shape (64,)) but which is no linear or embedding layer" in problem
    assert "does not have" not in problem
    assert "tensor 'blk.0.attn_norm.weight' has incorrect shape" in problem
    assert refused.value.fix.startswith("leave the blk.0.attn_norm.weight.lora_a / .lora_b pair out")
    absent = write_gguf_adapter(tmp_path / "absent.gguf", "llama", {
        "blk.7.attn_q.weight": (np.ones((2, 64), np.float32), np.ones((64, 2), np.float32))}, alpha=4)
    with pytest.raises(ModelSourceError, match="adapts blk.7.attn_q.weight, which the base model does not have"):
        merge_adapters(tiny_llama(seed=3), [LoraAdapter(str(absent))], "llama")


def _merged_weights(base_seed: int, factors: dict, kept: set, scale: float) -> dict:
    """name -> W + scale * B @ A for the ``kept`` modules, W for the others."""
    reference = dict(tiny_llama(seed=base_seed).named_modules())
    return {name: reference[name].weight.detach() + (scale * (b @ a) if name in kept else 0)
            for name, (a, b) in factors.items()}


@pytest.mark.parametrize(("selection", "kept"), [
    ({"layers_to_transform": [0]}, {"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj"}),
    ({"layers_to_transform": 1, "layers_pattern": "layers"},
     {"model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.v_proj"}),
    ({"target_modules": ["q_proj"]}, {"model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj"}),
    ({"target_modules": r".*layers\.1\.self_attn\.v_proj"}, {"model.layers.1.self_attn.v_proj"}),
    ({"exclude_modules": ["layers.0.self_attn.v_proj"]},
     {"model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.v_proj"}),
])
def test_factors_of_modules_the_config_leaves_out_are_not_merged_and_are_named(tmp_path, selection, kept):
    """PEFT puts LoRA layers only on the modules check_target_module_exists selects, and set_peft_model_state_dict
    loads the file with strict=False: the other factors are unexpected keys, dropped. edgesdk merged them all."""
    factors = random_factors(tiny_llama(seed=5), targets=("q_proj", "v_proj"), rank=2)
    config = {"r": 2, "lora_alpha": 4, "target_modules": ["q_proj", "v_proj"], **selection}
    adapter = write_peft(tmp_path / "adapter", factors, config)
    model = tiny_llama(seed=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (record,) = merge_adapters(model, [LoraAdapter(str(adapter), 0.5, option="--lora-scaled")], "llama")
    left_out = sorted(set(factors) - kept)
    assert record["modules"] == len(kept)
    assert record["ignored"] == left_out
    (warning,) = [str(item.message) for item in caught if "leaves out" in str(item.message)]
    assert f"LoRA factors of {len(left_out)} module(s) its {CONFIG} leaves out ({', '.join(left_out)}; " in warning
    assert "they are not merged, as PEFT does not load them" in warning
    modules = dict(model.named_modules())
    for name, expected in _merged_weights(5, factors, kept, 0.5 * 4 / 2).items():
        assert torch.allclose(modules[name].weight, expected, atol=1e-6), name


def test_an_adapter_whose_factors_are_all_left_out_is_refused(tmp_path):
    factors = random_factors(tiny_llama(seed=5), targets=("v_proj",), rank=2)
    adapter = write_peft(tmp_path / "adapter", factors, {"r": 2, "target_modules": ["q_proj"]})
    with pytest.raises(ModelSourceError) as refused:
        merge_adapters(tiny_llama(seed=5), [LoraAdapter(str(adapter))], "llama")
    assert "holds LoRA factors only of modules its adapter_config.json leaves out (model.layers.0.self_attn.v_proj, " \
           "model.layers.1.self_attn.v_proj; target_modules [\"q_proj\"])" in refused.value.problem
    assert "correct target_modules / layers_to_transform" in refused.value.fix


def test_all_linear_leaves_out_the_output_layer_as_peft_does():
    """_maybe_include_all_linear_layers: every nn.Linear's last name except the output layer's."""
    model = tiny_llama(seed=5)
    config = {"target_modules": "all-linear"}
    assert _peft_targets(config, model, "model.layers.0.mlp.down_proj")
    assert _peft_targets(config, model, "model.layers.1.self_attn.o_proj")
    assert not _peft_targets(config, model, "lm_head")
    layered = {"target_modules": ["q_proj"], "layers_to_transform": [0, 2], "layers_pattern": ["layers"]}
    assert _peft_targets(layered, model, "model.layers.0.self_attn.q_proj")
    assert not _peft_targets(layered, model, "model.layers.1.self_attn.q_proj")
    assert _peft_targets({"target_modules": ["model.layers.1.self_attn.q_proj"], "layers_to_transform": [0]}, model,
                         "model.layers.1.self_attn.q_proj")  # named whole: layers_to_transform is not consulted
